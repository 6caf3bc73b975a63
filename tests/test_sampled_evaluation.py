"""Payoffs estimated by rollouts (`evaluate_by_rollouts`) against exact payoffs, on real games."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marl_core.empirical_game.evaluation import evaluate_exact
from marl_core.empirical_game.game import psro_game
from marl_core.empirical_game.sampled import evaluate_by_rollouts
from marl_core.games.tree import build_tree
from marl_core.policies.neural import NeuralPolicy
from marl_core.policies.population import Population, stacked_tables
from marl_core.policies.tabular import TabularPolicy
from marl_core.rl import PPOConfig
from marl_core.rollout.pool import PoolConfig, WorkerPool
from marl_core.rollout.worker import RolloutResult, RolloutWorker

torch.set_num_threads(1)

ADVERSARY = "pettingzoo:mpe2.simple_adversary_v3"
ALL_PROFILES = [[0, 0], [0, 1], [1, 0], [1, 1]]


def _kuhn_populations(seed: int) -> list[Population]:
    """Two random legal mixed strategies per player."""
    rng = np.random.default_rng(seed)
    tree = build_tree("kuhn_poker")
    populations = []
    for player, player_tree in enumerate(tree.players):
        tables = rng.dirichlet(np.ones(2), size=(2, player_tree.num_infostates)) * player_tree.legal
        tables /= tables.sum(axis=2, keepdims=True)
        populations.append(Population.of(f"player_{player}", [TabularPolicy("kuhn_poker", player, t) for t in tables]))
    return populations


def _pool(env: str, workers: int) -> WorkerPool:
    return WorkerPool(PoolConfig(env, workers=workers, envs_per_worker=4))


def test_sampled_kuhn_payoffs_agree_with_exact_ones_and_not_with_the_worker_count():
    game = psro_game("kuhn_poker")
    populations = _kuhn_populations(seed=1)
    sampled = evaluate_by_rollouts(_pool("kuhn_poker", 1), game, populations, ALL_PROFILES, episodes=3000, seed=7)
    exact = evaluate_exact(build_tree("kuhn_poker"), stacked_tables(populations), np.array(ALL_PROFILES))
    assert sampled.mean.shape == sampled.stderr.shape == (4, 2) and sampled.episodes.tolist() == [3000] * 4
    assert np.all(sampled.stderr > 0)
    z = np.abs(sampled.mean - exact.mean) / sampled.stderr
    assert np.all(z < 4), f"sampled {sampled.mean.tolist()} vs exact {exact.mean.tolist()}: z {z.round(2).tolist()}"
    # The profiles differ by more than the noise: agreeing with these exact numbers means something.
    assert np.ptp(exact.mean[:, 0]) > 8 * sampled.stderr.max()
    spread = evaluate_by_rollouts(_pool("kuhn_poker", 3), game, populations, ALL_PROFILES, episodes=3000, seed=7)
    np.testing.assert_array_equal(spread.mean, sampled.mean)
    np.testing.assert_array_equal(spread.stderr, sampled.stderr)
    other_seed = evaluate_by_rollouts(_pool("kuhn_poker", 1), game, populations, ALL_PROFILES, episodes=3000, seed=8)
    assert not np.array_equal(other_seed.mean, sampled.mean)


def test_sampled_payoffs_of_network_members_on_pettingzoo_average_each_roles_agents():
    # simple_adversary: the role "good" is agent_0 and agent_1; untrained PPO networks as members.
    game = psro_game(ADVERSARY, (("adversary", "adversary"), ("agent", "good")))
    assert game.roles == ("adversary", "good") and game.agents_of("good") == ("agent_0", "agent_1")
    config = PPOConfig().model_dump(mode="json")
    torch.manual_seed(3)
    populations = [
        Population.of(
            role, [NeuralPolicy("ppo", config, game.obs_size[role], game.num_actions[role]) for _ in range(2)]
        )
        for role in game.roles
    ]
    pool = _pool(ADVERSARY, 2)
    sent: list = []
    collect = pool.collect
    pool.collect = lambda requests, progress=None: sent.extend(requests) or collect(requests, progress)
    profiles = [[0, 1], [1, 0]]
    payoffs = evaluate_by_rollouts(pool, game, populations, profiles, episodes=6, seed=2)
    assert payoffs.mean.shape == (2, 2) and np.all(np.isfinite(payoffs.mean)) and np.all(payoffs.stderr > 0)
    # One request per profile, one collect: each role a one-member mixture, no learner, greedy.
    assert [request.seed for request in sent] == [(2, 0, 1), (2, 1, 0)]
    first = sent[0]
    assert first.learners == {} and first.explore is False and first.episodes == 6
    assert first.populations["adversary"].members == (populations[0][0],)
    assert first.populations["good"].members == (populations[1][1],)
    # Replayed straight through a worker, the good role's payoff is the mean of its two agents' returns.
    returns = RolloutWorker(ADVERSARY, 4).collect(first).episode_returns
    assert payoffs.mean[0, 0] == pytest.approx(returns[:, 0].mean())
    assert payoffs.mean[0, 1] == pytest.approx(returns[:, 1:].mean(axis=1).mean())
    assert payoffs.stderr[0, 1] == pytest.approx(returns[:, 1:].mean(axis=1).std(ddof=1) / np.sqrt(6))


class NaNPool:
    """A pool whose every episode returns NaN to the second agent."""

    def collect(self, requests, progress=None):
        return [
            RolloutResult(
                experience={},
                joint=None,
                episode_returns=np.array([[1.0, np.nan]] * r.episodes),
                episode_lengths=np.ones(r.episodes, np.int64),
                draws=np.zeros((r.episodes, 2), np.int64),
                env_steps=0,
                weights_version=0,
                seconds=0.0,
            )
            for r in requests
        ]


@pytest.mark.parametrize(
    "change, message",
    [
        (
            dict(populations="swapped"),
            "kuhn_poker: populations are for roles ['player_1', 'player_0']; "
            "the game's roles are ['player_0', 'player_1'], in that order",
        ),
        (dict(profiles=[[0, 2]]), "kuhn_poker: profile [0, 2] names a member outside the populations' sizes [2, 2]"),
        (dict(profiles=[0, 1]), "kuhn_poker: profiles must be [m, 2] member indices, got shape (2,)"),
        (dict(episodes=0), "episodes must be a positive integer, got 0"),
        (dict(pool=NaNPool()), "game 'kuhn_poker' returned a non-finite return for profile [1, 0]"),
    ],
    ids=["roles-out-of-order", "member-out-of-range", "flat-profiles", "no-episodes", "nan-return"],
)
def test_bad_input_is_one_line_naming_the_game_and_value(change, message):
    game = psro_game("kuhn_poker")
    populations = _kuhn_populations(seed=2)
    args = dict(pool=_pool("kuhn_poker", 1), populations=populations, profiles=[[1, 0]], episodes=10)
    args.update(change)
    if args["populations"] == "swapped":
        args["populations"] = populations[::-1]
    with pytest.raises(ValueError) as raised:
        evaluate_by_rollouts(
            args["pool"], game, args["populations"], args["profiles"], episodes=args["episodes"], seed=0
        )
    assert str(raised.value) == message
