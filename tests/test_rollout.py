"""Rollout workers and learned best responses, on real OpenSpiel games with real networks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marl_core.psro.config import build_config
from marl_core.games.exploitability import mixed_reach
from marl_core.games.tree import best_response, build_tree
from marl_core.psro.learned_oracle import exact_value, train_best_response
from marl_core.psro.steps import psro_env
from marl_core.rl import ALGORITHMS
from marl_core.rollout.worker import LearnerSpec, RolloutRequest, RolloutWorker, TabularPopulation
from marl_core.rollout.pool import LocalWorkerPool, ParameterStore, PoolConfig

torch.set_num_threads(1)

CALL, RAISE = 1, 2  # leduc_poker: 0 fold, 1 call/check, 2 raise/bet


def _always(tree, player: int, preferred: int) -> np.ndarray:
    """A deterministic policy: `preferred` where legal, else call."""
    legal = tree.players[player].legal
    policy = np.zeros(legal.shape)
    choice = np.where(legal[:, preferred], preferred, CALL)
    policy[np.arange(len(legal)), choice] = 1.0
    return policy


def _dqn_learner(config=None) -> LearnerSpec:
    return LearnerSpec("test", "dqn", config or ALGORITHMS["dqn"].config())


def test_opponents_are_drawn_once_per_episode_not_per_step():
    # Player 1 mixes "always call" and "always raise" 30/70. Against a calling player 0 a whole
    # episode with one member stakes 1 (checks) or 7 (raises in both rounds) per player; a
    # per-step mixture would also produce stakes of 3 or 5.
    tree = build_tree("leduc_poker")
    caller = TabularPopulation("leduc_poker", 0, _always(tree, 0, CALL)[None], np.array([1.0]))
    mixed = TabularPopulation(
        "leduc_poker", 1, np.stack([_always(tree, 1, CALL), _always(tree, 1, RAISE)]), np.array([0.3, 0.7])
    )
    worker = RolloutWorker(lambda: psro_env("leduc_poker"), envs_per_worker=8)
    request = RolloutRequest(
        learner=_dqn_learner(), learner_agents=(), opponents={"player_0": caller, "player_1": mixed},
        episodes=2000, seed=(1,),
    )
    result = worker.collect(request)
    assert result.episode_returns.shape == (2000, 2)
    draws = result.opponent_draws[:, 1]
    stakes = np.abs(result.episode_returns[:, 0])
    assert set(np.unique(stakes)) <= {0.0, 1.0, 7.0}
    assert np.all(stakes[draws == 0] <= 1) and np.all(stakes[draws == 1] != 1)
    assert abs(draws.mean() - 0.7) < 0.04  # 2000 draws: 4 standard errors is about 0.04
    assert np.allclose(result.episode_returns.sum(axis=1), 0.0)


def test_a_request_is_deterministic_and_returns_exactly_the_asked_episodes():
    tree = build_tree("kuhn_poker")
    uniform = TabularPopulation("kuhn_poker", 1, tree.players[1].uniform_policy()[None], np.array([1.0]))
    store = ParameterStore()
    spec = _dqn_learner()
    policy = ALGORITHMS["dqn"].policy(11, 2, spec.config)
    store.push("test", 1, policy.get_weights())
    request = RolloutRequest(spec, ("player_0",), {"player_1": uniform}, episodes=37, seed=(3, 4), weights_version=1)
    first = RolloutWorker(lambda: psro_env("kuhn_poker"), 5, store).collect(request)
    again = RolloutWorker(lambda: psro_env("kuhn_poker"), 5, store).collect(request)
    assert len(first.episode_returns) == 37 and first.weights_version == 1
    np.testing.assert_array_equal(first.experience.action, again.experience.action)
    np.testing.assert_array_equal(first.episode_returns, again.episode_returns)
    experience = first.experience.validate()
    assert experience.done.sum() == 37 and experience.last.sum() == 37  # one segment per episode
    # The learner's rewards are its whole returns: nothing lost between decisions.
    assert experience.reward.sum() == pytest.approx(first.episode_returns[:, 0].sum())
    assert np.all(experience.mask[np.arange(len(experience)), experience.action])


class CountingStore(ParameterStore):
    """The parameter store, recording every pull a worker makes (key, version it had)."""

    def __init__(self):
        super().__init__()
        self.pulls: list[tuple[str, int]] = []

    def pull(self, key: str, have_version: int):
        self.pulls.append((key, have_version))
        return super().pull(key, have_version)


def test_workers_pull_weights_once_per_request_and_only_when_newer():
    tree = build_tree("kuhn_poker")
    uniform = TabularPopulation("kuhn_poker", 1, tree.players[1].uniform_policy()[None], np.array([1.0]))
    spec = _dqn_learner()
    store = CountingStore()
    worker = RolloutWorker(lambda: psro_env("kuhn_poker"), 2, store)

    def request(version: int) -> RolloutRequest:
        return RolloutRequest(spec, ("player_0",), {"player_1": uniform}, 40, seed=(5,), weights_version=version, explore=False)

    torch.manual_seed(1)
    store.push("test", 1, ALGORITHMS["dqn"].policy(11, 2, spec.config).get_weights())
    first = worker.collect(request(1))
    assert first.weights_version == 1
    assert store.pulls == [("test", -1)]  # 40 episodes, a learner step or more in each: one pull
    worker.collect(request(1))
    assert store.pulls == [("test", -1)]  # the worker already holds version 1: no pull at all

    torch.manual_seed(2)
    newer = ALGORITHMS["dqn"].policy(11, 2, spec.config).get_weights()
    store.push("test", 2, newer)
    updated = worker.collect(request(2))
    assert store.pulls == [("test", -1), ("test", 1)] and updated.weights_version == 2
    # It acts with what it pulled: other actions than under version 1, and the same as a worker
    # that only ever saw version 2.
    fresh = CountingStore()
    fresh.push("test", 2, newer)
    reference = RolloutWorker(lambda: psro_env("kuhn_poker"), 2, fresh).collect(request(2))
    assert not np.array_equal(first.experience.action, updated.experience.action)
    np.testing.assert_array_equal(updated.experience.action, reference.experience.action)
    stale = worker.collect(request(1))  # an older request after the update: no pull, newer weights kept
    assert stale.weights_version == 2 and len(store.pulls) == 2


def _exact_best_response_value(tree, player, populations, meta):
    return best_response(tree, player, mixed_reach(tree, populations, meta))[0]


@pytest.mark.slow
@pytest.mark.parametrize("oracle", ["dqn", "ppo"])
def test_learned_best_response_to_a_fixed_kuhn_opponent_is_within_002_of_exact(oracle):
    tree = build_tree("kuhn_poker")
    rng = np.random.default_rng(7)
    populations = []
    for player_tree in tree.players:  # a fixed, lopsided opponent: not the uniform one
        policy = rng.dirichlet(np.ones(2), size=player_tree.num_infostates) * player_tree.legal
        populations.append((policy / policy.sum(axis=1, keepdims=True))[None])
    meta = [np.array([1.0]), np.array([1.0])]
    config = build_config({"oracle": oracle, "seed": 3})
    pool = LocalWorkerPool(PoolConfig(lambda: psro_env("kuhn_poker"), workers=2, envs_per_worker=16))
    for player in range(2):
        policy, value, weights, metrics = train_best_response(config, tree, player, populations, meta, iteration=1, pool=pool)
        exact = _exact_best_response_value(tree, player, populations, meta)
        assert value == pytest.approx(exact_value(tree, player, policy, mixed_reach(tree, populations, meta)))
        assert exact - value <= 0.02, f"{oracle} player {player}: learned {value:.4f}, exact best response {exact:.4f}"
        assert metrics["episodes"] == config.best_response.episodes
        assert set(weights) == set(ALGORITHMS[oracle].policy(11, 2, getattr(config, oracle)).get_weights())
