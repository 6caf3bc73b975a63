"""Rollout workers and learned best responses, on real OpenSpiel and PettingZoo games with real networks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from marl_core.envs import OpenSpielEnv, by_prefix, one_population_per_agent
from marl_core.games.exploitability import mixed_reach
from marl_core.games.tree import best_response, build_tree
from marl_core.policies.base import Observations, Policy
from marl_core.policies.neural import NeuralPolicy
from marl_core.policies.tabular import TabularPolicy
from marl_core.rl import ALGORITHMS
from marl_core.rollout.pool import PoolConfig, WorkerPool
from marl_core.rollout.weight_store import WeightStore
from marl_core.rollout.worker import AlgorithmPolicy, LearnerSpec, PolicyMixture, RolloutRequest, RolloutWorker

torch.set_num_threads(1)

CALL, RAISE = 1, 2  # leduc_poker: 0 fold, 1 call/check, 2 raise/bet
PASS, BET = 0, 1  # kuhn_poker
PLAYERS = one_population_per_agent  # on OpenSpiel games each player is its own role
ADVERSARY = "pettingzoo:mpe2.simple_adversary_v3"  # adversary_0, agent_0, agent_1; 25 steps, all act each step
ADVERSARY_ROLES = by_prefix({"adversary_": "adversary", "agent_": "agent"})


def _always(game: str, player: int, preferred: int, otherwise: int = CALL) -> TabularPolicy:
    """A deterministic policy: `preferred` where legal, else `otherwise`."""
    legal = build_tree(game).players[player].legal
    policy = np.zeros(legal.shape)
    choice = np.where(legal[:, preferred], preferred, otherwise)
    policy[np.arange(len(legal)), choice] = 1.0
    return TabularPolicy(game, player, policy)


def _uniform(game: str, player: int) -> PolicyMixture:
    tree = build_tree(game).players[player]
    return PolicyMixture((TabularPolicy(game, player, tree.uniform_policy()),), np.array([1.0]))


def _dqn_learner(config=None) -> LearnerSpec:
    return LearnerSpec("test", AlgorithmPolicy("dqn", config or ALGORITHMS["dqn"].config()))


class Recorder(Policy):
    """Uniform over legal actions; appends (name, batch size, infostates given) to a shared log
    at every `action_probs` call, so a test sees who was asked what, in order."""

    kind = "neural"

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def action_probs(self, batch: Observations) -> np.ndarray:
        self.log.append((self.name, len(batch), batch.infostates is not None))
        return batch.mask / batch.mask.sum(axis=1, keepdims=True)

    def description(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def weights(self) -> dict[str, Any]:
        return {}


def test_opponents_are_drawn_once_per_episode_not_per_step():
    # Player 1 mixes "always call" and "always raise" 30/70. Against a calling player 0 a whole
    # episode with one member stakes 1 (checks) or 7 (raises in both rounds) per player; a
    # per-step mixture would also produce stakes of 3 or 5.
    caller = PolicyMixture((_always("leduc_poker", 0, CALL),), np.array([1.0]))
    mixed = PolicyMixture((_always("leduc_poker", 1, CALL), _always("leduc_poker", 1, RAISE)), np.array([0.3, 0.7]))
    worker = RolloutWorker("leduc_poker", envs_per_worker=8)
    request = RolloutRequest(PLAYERS, {"player_0": caller, "player_1": mixed}, episodes=2000, seed=(1,))
    result = worker.collect(request)
    assert result.episode_returns.shape == (2000, 2) and result.draws.shape == (2000, 2)
    draws = result.draws[:, 1]
    stakes = np.abs(result.episode_returns[:, 0])
    assert set(np.unique(stakes)) <= {0.0, 1.0, 7.0}
    assert np.all(stakes[draws == 0] <= 1) and np.all(stakes[draws == 1] != 1)
    assert abs(draws.mean() - 0.7) < 0.04  # 2000 draws: 4 standard errors is about 0.04
    assert np.allclose(result.episode_returns.sum(axis=1), 0.0)


def test_all_agents_of_a_role_act_with_the_member_drawn_for_the_episode():
    # simple_adversary: agent_0 and agent_1 share the role "agent", whose three members record
    # every call. The adversary's one member is called first in every step (populations in
    # order), so its calls split the log into steps.
    log: list = []
    agents = PolicyMixture(tuple(Recorder(f"agent{m}", log) for m in range(3)), np.array([0.2, 0.3, 0.5]))
    adversary = PolicyMixture((Recorder("adversary", log),), np.array([1.0]))
    worker = RolloutWorker(ADVERSARY, envs_per_worker=4)
    result = worker.collect(
        RolloutRequest(ADVERSARY_ROLES, {"adversary": adversary, "agent": agents}, episodes=30, seed=(2,))
    )
    steps: list[list] = []
    for name, size, has_infostates in log:
        assert not has_infostates  # PettingZoo gives no information states
        if name == "adversary":
            steps.append([size])
        else:
            steps[-1].append((name, size))
    assert len(steps) == 25 * 8  # 30 episodes on 4 copies: the busiest copy plays 8
    for adversaries, *calls in steps:
        names = [name for name, _ in calls]
        assert names == sorted(set(names))  # one call per member in use, members in order
        assert all(size % 2 == 0 for _, size in calls)  # both agents of a copy: same member, same call
        assert sum(size for _, size in calls) == 2 * adversaries
    # Each member was asked for exactly the decisions of the episodes it was drawn for.
    asked = {name: sum(size for n, size, _ in log if n == name) for name in ("agent0", "agent1", "agent2")}
    drawn = np.bincount(result.draws[:, 1], minlength=3)
    assert asked == {f"agent{m}": 2 * 25 * int(drawn[m]) for m in range(3)}
    assert np.all(result.draws[:, 0] == 0) and len(set(result.draws[:, 1].tolist())) == 3


@pytest.mark.parametrize("epsilon", [0.0, 1.0])
def test_trembling_opponents_make_uniformly_random_moves_at_the_asked_rate(epsilon):
    # Kuhn, both players always pass: every hand is a showdown for the ante of 1. Each move
    # trembles with chance e to a uniform one (a bet with chance e/2), and a stake of 2 needs a
    # bet that is called: P = (e/2)^2 (1 - e/2) + (e/2)^2 = 0.375 at e = 1.
    passing = {f"player_{p}": PolicyMixture((_always("kuhn_poker", p, PASS, PASS),), np.array([1.0])) for p in (0, 1)}
    worker = RolloutWorker("kuhn_poker", envs_per_worker=8)
    stakes = np.abs(
        worker.collect(
            RolloutRequest(PLAYERS, passing, episodes=4000, seed=(3,), opponent_epsilon=epsilon)
        ).episode_returns[:, 0]
    )
    called = (stakes == 2).mean()
    expected = (epsilon / 2) ** 2 * (2 - epsilon / 2)
    assert abs(called - expected) <= 4 * np.sqrt(max(expected * (1 - expected), 1e-12) / 4000)


def test_the_learner_never_trembles():
    # The learner's network always passes (its last layer puts all value on PASS) and so folds to
    # a bet; only trembling opponents ever bet. A stake of 2 would need the learner to bet or call.
    always_pass = PolicyMixture((_always("kuhn_poker", 1, PASS, PASS),), np.array([1.0]))
    spec = _dqn_learner()
    policy = ALGORITHMS["dqn"].policy(11, 2, spec.build.config)
    weights = policy.get_weights()
    last = [name for name in weights if name.endswith("weight")][-1]
    weights[last].zero_()
    weights[last.replace("weight", "bias")].copy_(torch.tensor([1.0, 0.0]))
    store = WeightStore()
    store.push(spec.key, 0, weights)
    worker = RolloutWorker("kuhn_poker", envs_per_worker=8, store=store)
    request = RolloutRequest(
        PLAYERS,
        {"player_1": always_pass},
        episodes=500,
        seed=(4,),
        learners={"player_0": spec},
        explore=False,
        opponent_epsilon=1.0,
    )
    result = worker.collect(request)
    stakes = np.abs(result.episode_returns[:, 0])
    assert np.all(result.experience["player_0"].action == PASS) and set(np.unique(stakes)) == {1.0}


def test_mixed_tabular_and_neural_members_in_one_population():
    # Kuhn: player 0 always bets. Player 1's tabular member always passes (folds), so player 0
    # wins exactly 1 in its episodes; its network member (an untrained actor, neither 0 nor 1
    # anywhere) sometimes calls, for stakes of 2.
    config = ALGORITHMS["ppo"].config().model_dump(mode="json")
    torch.manual_seed(0)
    network = NeuralPolicy("ppo", config, 11, 2)
    populations = {
        "player_0": PolicyMixture((_always("kuhn_poker", 0, BET),), np.array([1.0])),
        "player_1": PolicyMixture((_always("kuhn_poker", 1, PASS), network), np.array([0.5, 0.5])),
    }
    result = RolloutWorker("kuhn_poker", envs_per_worker=4).collect(
        RolloutRequest(PLAYERS, populations, 400, seed=(3,))
    )
    folded, networked = result.draws[:, 1] == 0, result.draws[:, 1] == 1
    assert 150 < folded.sum() < 250
    assert np.all(result.episode_returns[folded, 0] == 1.0)
    stakes = np.abs(result.episode_returns[networked, 0])
    assert set(np.unique(stakes)) == {1.0, 2.0}


class LoggedKuhn(OpenSpielEnv):
    """Kuhn poker that appends ("step", 1, True) to a shared log at every step."""

    def __init__(self, log: list):
        super().__init__("kuhn_poker")
        self.log = log

    def step(self, actions):
        self.log.append(("step", 1, True))
        return super().step(actions)


def test_one_action_probs_call_per_role_and_member_in_use_per_step():
    # Kuhn, 8 copies, every role two recording members. A worker step asks every policy, then
    # steps every live copy, so the copies' steps split the log into worker steps. One decision
    # per copy and step (Kuhn is turn based): the calls' batches add up to the copies stepped.
    log: list = []
    populations = {
        f"player_{p}": PolicyMixture((Recorder(f"p{p}m0", log), Recorder(f"p{p}m1", log)), np.array([0.5, 0.5]))
        for p in range(2)
    }
    worker = RolloutWorker(lambda: LoggedKuhn(log), envs_per_worker=8)
    result = worker.collect(RolloutRequest(PLAYERS, populations, 40, seed=(4,)))
    rounds: list[tuple[list, int]] = []  # (calls, copies stepped) per worker step
    for name, size, has_infostates in log:
        assert has_infostates  # OpenSpiel gives information states with every decision
        if name == "step":
            rounds[-1] = (rounds[-1][0], rounds[-1][1] + 1)
        elif not rounds or rounds[-1][1]:
            rounds.append(([(name, size)], 0))
        else:
            rounds[-1][0].append((name, size))
    assert sum(stepped for _, stepped in rounds) == result.env_steps
    for calls, stepped in rounds:
        names = [name for name, _ in calls]
        assert names == sorted(set(names))  # at most one call per (role, member), roles and members in order
        assert sum(size for _, size in calls) == stepped
    assert max(len(calls) for calls, _ in rounds) == 4  # all four (role, member) pairs in one step
    assert max(size for calls, _ in rounds for _, size in calls) > 1  # copies batched into one call


def test_a_request_is_deterministic_and_returns_exactly_the_asked_episodes():
    store = WeightStore()
    spec = _dqn_learner()
    policy = ALGORITHMS["dqn"].policy(11, 2, spec.build.config)
    store.push("test", 1, policy.get_weights())
    request = RolloutRequest(
        PLAYERS,
        {"player_1": _uniform("kuhn_poker", 1)},
        episodes=37,
        seed=(3, 4),
        learners={"player_0": spec},
        weights_version=1,
    )
    first = RolloutWorker("kuhn_poker", 5, store).collect(request)
    again = RolloutWorker("kuhn_poker", 5, store).collect(request)
    assert len(first.episode_returns) == 37 and first.weights_version == 1
    np.testing.assert_array_equal(first.experience["player_0"].action, again.experience["player_0"].action)
    np.testing.assert_array_equal(first.episode_returns, again.episode_returns)
    experience = first.experience["player_0"].validate()
    assert experience.done.sum() == 37 and experience.last.sum() == 37  # one segment per episode
    # The learner's rewards are its whole returns: nothing lost between decisions.
    assert experience.reward.sum() == pytest.approx(first.episode_returns[:, 0].sum())
    assert np.all(experience.mask[np.arange(len(experience)), experience.action])


def test_a_learner_role_of_two_agents_returns_both_agents_transitions():
    # simple_adversary: the learner plays agent_0 and agent_1 (one network, parameter sharing)
    # against an adversary population; every step of every episode is a decision of each.
    log: list = []
    adversary = PolicyMixture((Recorder("adversary", log),), np.array([1.0]))
    spec = LearnerSpec("shared", AlgorithmPolicy("ppo", ALGORITHMS["ppo"].config()))
    store = WeightStore()
    store.push("shared", 1, ALGORITHMS["ppo"].policy(10, 5, spec.build.config).get_weights())
    request = RolloutRequest(
        ADVERSARY_ROLES,
        {"adversary": adversary},
        episodes=6,
        seed=(5,),
        learners={"agent": spec},
        weights_version=1,
    )
    result = RolloutWorker(ADVERSARY, 3, store).collect(request)
    experience = result.experience["agent"].validate()
    assert len(experience) == 6 * 25 * 2 and experience.last.sum() == 6 * 2  # one stream per agent and episode
    assert experience.obs.shape[1] == 10  # the agents' observations, not the adversary's 8
    assert experience.reward.sum() == pytest.approx(result.episode_returns[:, 1:].sum(), rel=1e-5)
    assert sum(size for _, size, _ in log) == 6 * 25  # the adversary's decisions went to its population
    assert result.draws.shape == (6, 1)


@pytest.mark.parametrize(
    "populations, learner_role, message",
    [
        (
            {"adversary": "recorder"},
            None,
            "simple_adversary_v3: agent 'agent_0' of role 'agent' has neither a learner nor a population "
            "(learners: [], populations: ['adversary'])",
        ),
        (
            {"adversary": "recorder", "agent": "recorder", "good": "recorder"},
            None,
            "simple_adversary_v3: role(s) ['good'] belong to no agent; the agents' roles are ['adversary', 'agent']",
        ),
        (
            {"adversary": "recorder", "agent": "recorder"},
            "agent",
            "role(s) ['agent'] are played by a learner; they cannot also have a population",
        ),
        (
            {"adversary": "recorder", "agent": "recorder"},
            "good",
            "simple_adversary_v3: role(s) ['good'] belong to no agent; the agents' roles are ['adversary', 'agent']",
        ),
    ],
    ids=["no-population", "unplayed-population", "learner-and-population", "learner-role-of-no-agent"],
)
def test_a_request_that_leaves_an_agent_unplayed_fails_before_any_step(populations, learner_role, message):
    log: list = []
    mixtures = {role: PolicyMixture((Recorder(role, log),), np.array([1.0])) for role in populations}
    learners = {learner_role: _dqn_learner()} if learner_role else {}
    worker = RolloutWorker(ADVERSARY, 2)
    with pytest.raises(ValueError) as raised:
        worker.collect(RolloutRequest(ADVERSARY_ROLES, mixtures, 4, (0,), learners=learners))
    assert str(raised.value) == message
    assert log == []  # nothing acted


def test_mixture_weights_are_checked_when_the_mixture_is_made():
    member = _always("kuhn_poker", 0, BET)
    with pytest.raises(ValueError, match=r"^mixture weights must be non-negative and sum to 1, got \[0.5, 0.6\]$"):
        PolicyMixture((member, member), np.array([0.5, 0.6]))
    with pytest.raises(
        ValueError, match=r"^a mixture of 2 members needs 2 weights \(at least one\), got shape \(1,\)$"
    ):
        PolicyMixture((member, member), np.array([1.0]))


class CountingStore(WeightStore):
    """The weight store, recording every pull a worker makes (key, version it had)."""

    def __init__(self):
        super().__init__()
        self.pulls: list[tuple[str, int]] = []

    def pull(self, key: str, have_version: int):
        self.pulls.append((key, have_version))
        return super().pull(key, have_version)


def test_workers_pull_weights_once_per_request_and_only_when_newer():
    uniform = _uniform("kuhn_poker", 1)
    spec = _dqn_learner()
    store = CountingStore()
    worker = RolloutWorker("kuhn_poker", 2, store)

    def request(version: int) -> RolloutRequest:
        return RolloutRequest(
            PLAYERS,
            {"player_1": uniform},
            40,
            seed=(5,),
            learners={"player_0": spec},
            weights_version=version,
            explore=False,
        )

    torch.manual_seed(1)
    store.push("test", 1, ALGORITHMS["dqn"].policy(11, 2, spec.build.config).get_weights())
    first = worker.collect(request(1))
    assert first.weights_version == 1
    assert store.pulls == [("test", -1)]  # 40 episodes, a learner step or more in each: one pull
    worker.collect(request(1))
    assert store.pulls == [("test", -1)]  # the worker already holds version 1: no pull at all

    torch.manual_seed(2)
    newer = ALGORITHMS["dqn"].policy(11, 2, spec.build.config).get_weights()
    store.push("test", 2, newer)
    updated = worker.collect(request(2))
    assert store.pulls == [("test", -1), ("test", 1)] and updated.weights_version == 2
    # It acts with what it pulled: other actions than under version 1, and the same as a worker
    # that only ever saw version 2.
    fresh = CountingStore()
    fresh.push("test", 2, newer)
    reference = RolloutWorker("kuhn_poker", 2, fresh).collect(request(2))
    assert not np.array_equal(first.experience["player_0"].action, updated.experience["player_0"].action)
    np.testing.assert_array_equal(updated.experience["player_0"].action, reference.experience["player_0"].action)
    stale = worker.collect(request(1))  # an older request after the update: no pull, newer weights kept
    assert stale.weights_version == 2 and len(store.pulls) == 2


def _exact_best_response_value(tree, player, populations, meta):
    return best_response(tree, player, mixed_reach(tree, populations, meta))[0]


@pytest.mark.slow
@pytest.mark.parametrize("oracle", ["dqn", "ppo"])
def test_learned_best_response_to_a_fixed_kuhn_opponent_is_within_002_of_exact(oracle):
    from marl_core.games.tree import profile_values, sequence_reach
    from marl_core.policies.population import Population
    from marl_core.policies.tabular import TabularPolicy
    from marl_core.psro.config import build_config
    from marl_core.psro.learned_oracle import train_best_response
    from marl_core.psro.oracles import OracleCall

    tree = build_tree("kuhn_poker")
    rng = np.random.default_rng(7)
    tables = []
    for player_tree in tree.players:  # a fixed, lopsided opponent: not the uniform one
        policy = rng.dirichlet(np.ones(2), size=player_tree.num_infostates) * player_tree.legal
        tables.append((policy / policy.sum(axis=1, keepdims=True))[None])
    populations = [Population.of(f"player_{p}", [TabularPolicy("kuhn_poker", p, tables[p][0])]) for p in range(2)]
    meta = [np.array([1.0]), np.array([1.0])]
    config = build_config({"oracle": oracle, "seed": 3})
    pool = WorkerPool(PoolConfig(config.psro_game.make_env, workers=2, envs_per_worker=16))
    for player in range(2):
        response = train_best_response(OracleCall(config, player, populations, meta, iteration=1, pool=pool))
        exact = _exact_best_response_value(tree, player, tables, meta)
        reaches = mixed_reach(tree, tables, meta)
        reaches[player] = sequence_reach(tree.players[player], response.policy.tabular[None])[0]
        assert response.value == pytest.approx(float(profile_values(tree, reaches)[player]))
        assert exact - response.value <= 0.02, (
            f"{oracle} player {player}: learned {response.value:.4f}, exact best response {exact:.4f}"
        )
        assert response.metrics["gap_to_exact"] == pytest.approx(exact - response.value)
        assert response.metrics["episodes"] == config.best_response.episodes
        assert set(response.policy.weights()) == set(
            ALGORITHMS[oracle].policy(11, 2, config.oracle_settings).get_weights()
        )


def test_a_mixture_draws_the_member_numpys_choice_draws_from_the_same_numbers():
    """`PolicyMixture.draw` skips `Generator.choice`'s checks; every member drawn is still the
    one `choice` draws, so seeded rollouts are unchanged (zero weights included)."""
    from marl_core.policies.base import UniformPolicy

    weights_rng = np.random.default_rng(1)
    for trial in range(300):
        k = int(weights_rng.integers(1, 12))
        weights = weights_rng.dirichlet(np.full(k, 0.3))
        if trial % 3 == 0 and k > 1:
            weights[weights_rng.integers(k)] = 0.0
            weights /= weights.sum()
        mixture = PolicyMixture(tuple(UniformPolicy() for _ in range(k)), weights)
        ours, numpys = np.random.default_rng(trial), np.random.default_rng(trial)
        assert [mixture.draw(ours) for _ in range(40)] == [int(numpys.choice(k, p=mixture.weights)) for _ in range(40)]
