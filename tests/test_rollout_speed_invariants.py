"""The fast rollout loop returns bit for bit what the straightforward one returned.

`RolloutWorker.collect` is the rollout hot path and is written for speed: decisions are batched
into arrays and transitions assembled by index at the end of a request. `_reference_collect`
below is the loop it replaced, kept as the plainest statement of what a request means: per-step
dicts, one transition dict per decision, arrays built from lists at the end. Both run from the same
seed, weights and environment copies, so every array (experience, returns, population draws) must be
identical, not close: a reordered stream, a reward credited to the wrong transition or a random
number drawn in a different order shows up as a difference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marl_core.envs import (
    EnvSpec,
    MultiAgentEnv,
    TimeStep,
    by_prefix,
    make_env,
    one_population_per_agent,
    shared_population,
)
from marl_core.envs.api import check_actions
from marl_core.games.tree import build_tree
from marl_core.policies.base import Observations
from marl_core.policies.neural import NeuralPolicy
from marl_core.policies.tabular import TabularPolicy
from marl_core.rl import ALGORITHMS, Experience
from marl_core.rl.sampling import sample_rows
from marl_core.rollout.weight_store import WeightStore
from marl_core.rollout.worker import (
    AlgorithmPolicy,
    EnvSource,
    LearnerSpec,
    PolicyMixture,
    RolloutRequest,
    RolloutResult,
    RolloutWorker,
)

torch.set_num_threads(1)

SPREAD = "pettingzoo:mpe2.simple_spread_v3"
ADVERSARY = "pettingzoo:mpe2.simple_adversary_v3"


def _reference_collect(
    env: EnvSource, envs_per_worker: int, policy, request: RolloutRequest, learner_role
) -> RolloutResult:
    """The rollout loop as first written: a dict per transition, arrays built from lists."""
    envs = [make_env(env) if isinstance(env, str) else env() for _ in range(envs_per_worker)]
    agents = envs[0].spec.agents
    rng = np.random.default_rng(request.seed)
    roles = list(request.populations)
    mixtures = list(request.populations.values())
    role_of = {agent: request.roles(agent) for agent in agents}
    tabular = [all(m.tabular is not None for m in mixture.members) for mixture in mixtures]
    rows = {}
    for agent, role in role_of.items():
        if role in roles and tabular[roles.index(role)]:
            member = mixtures[roles.index(role)].members[0]
            rows[agent] = build_tree(member.game).players[member.player].index
    learners = {agent for agent, role in role_of.items() if role == learner_role}
    quota = np.full(len(envs), request.episodes // len(envs))
    quota[: request.episodes % len(envs)] += 1
    finished, transitions, live, steps = [], [], {}, {}

    def begin(i, step):
        live[i] = {
            "draws": [m.draw(rng) for m in mixtures],
            "returns": np.zeros(len(agents)),
            "streams": {},
            "open": {},
        }
        steps[i] = step

    def close(episode, agent, transition, next_obs, next_mask, done):
        episode["streams"].setdefault(agent, []).append(
            dict(transition, next_obs=next_obs, next_mask=next_mask, done=done)
        )

    for i, e in enumerate(envs):
        if quota[i] > 0:
            begin(i, e.reset(seed=int(rng.integers(2**31))))
    env_steps = 0
    while live:
        actions = {i: {} for i in live}
        learner_at, learner_obs, learner_mask = [], [], []
        population_at = {k: [] for k in range(len(mixtures))}
        for i in live:
            step = steps[i]
            for agent in step.acting:
                if agent in learners:
                    learner_at.append((i, agent))
                    learner_obs.append(step.observations[agent])
                    learner_mask.append(step.action_masks[agent])
                else:
                    population_at[roles.index(role_of[agent])].append((i, agent, step))
        if learner_at:
            obs, mask = np.stack(learner_obs), np.stack(learner_mask)
            chosen, extras = policy.act(obs, mask, request.explore, rng)
            for j, (i, agent) in enumerate(learner_at):
                actions[i][agent] = int(chosen[j])
                episode = live[i]
                if agent in episode["open"]:
                    close(episode, agent, episode["open"][agent], obs[j], mask[j], False)
                episode["open"][agent] = dict(
                    obs=obs[j],
                    mask=mask[j],
                    action=int(chosen[j]),
                    reward=0.0,
                    extras={k: v[j] for k, v in extras.items()},
                )
        for k, at in population_at.items():
            members = mixtures[k].members
            if at and tabular[k]:  # one draw for the whole population, rows of its stacked tables
                probs = np.array(
                    [
                        members[live[i]["draws"][k]].tabular[rows[agent][step.infos[agent]["infostate"]]]
                        for i, agent, step in at
                    ]
                )
                chosen = sample_rows(probs, rng)
                for j, (i, agent, _) in enumerate(at):
                    actions[i][agent] = int(chosen[j])
            for member in sorted({live[i]["draws"][k] for i, _, _ in at} if not tabular[k] else ()):
                mine = [(i, agent, step) for i, agent, step in at if live[i]["draws"][k] == member]
                batch = Observations(
                    np.stack([step.observations[agent] for _, agent, step in mine]),
                    np.stack([step.action_masks[agent] for _, agent, step in mine]),
                    [step.infos[agent].get("infostate") for _, agent, step in mine],
                )
                if None in batch.infostates:
                    batch = Observations(batch.obs, batch.mask)
                chosen = members[member].act(batch, rng)
                for j, (i, agent, _) in enumerate(mine):
                    actions[i][agent] = int(chosen[j])
        for i in list(live):
            step = envs[i].step(actions[i])
            env_steps += 1
            episode = live[i]
            for index, agent in enumerate(agents):
                reward = step.rewards.get(agent, 0.0)
                episode["returns"][index] += reward
                if agent in episode["open"]:
                    episode["open"][agent]["reward"] += reward
            if step.done:
                for agent, t in episode["open"].items():
                    close(episode, agent, t, t["obs"], t["mask"], bool(step.terminations.get(agent, True)))
                finished.append(episode)
                for stream in episode["streams"].values():
                    stream[-1]["last"] = True
                    transitions.extend(stream)
                quota[i] -= 1
                del live[i], steps[i]
                if quota[i] > 0:
                    begin(i, envs[i].reset())
            else:
                steps[i] = step

    t = transitions
    keys = t[0]["extras"].keys() if t else ()
    experience = Experience(
        obs=np.array([x["obs"] for x in t], dtype=np.float32),
        mask=np.array([x["mask"] for x in t], dtype=bool),
        action=np.array([x["action"] for x in t], dtype=np.int64),
        reward=np.array([x["reward"] for x in t], dtype=np.float32),
        next_obs=np.array([x["next_obs"] for x in t], dtype=np.float32),
        next_mask=np.array([x["next_mask"] for x in t], dtype=bool),
        done=np.array([x["done"] for x in t], dtype=bool),
        last=np.array([x.get("last", False) for x in t], dtype=bool),
        extras={k: np.array([x["extras"][k] for x in t]) for k in keys},
    )
    return RolloutResult(
        experience={learner_role: experience} if learner_role else {},
        joint=None,
        episode_lengths=np.zeros(0, dtype=np.int64),
        episode_returns=np.array([e["returns"] for e in finished], dtype=np.float64).reshape(-1, len(agents)),
        draws=np.array([e["draws"] for e in finished], dtype=np.int64).reshape(len(finished), len(mixtures)),
        env_steps=env_steps,
        weights_version=request.weights_version,
        seconds=0.0,
    )


def _assert_identical(result: RolloutResult, reference: RolloutResult) -> None:
    fields = ["obs", "mask", "action", "reward", "next_obs", "next_mask", "done", "last"]
    assert result.experience.keys() == reference.experience.keys()
    pairs = []
    for role, experience in reference.experience.items():
        got = result.experience[role]
        pairs += [(f"experience.{f}", getattr(got, f), getattr(experience, f)) for f in fields]
        assert got.extras.keys() == experience.extras.keys()
        pairs += [(f"extras[{k!r}]", got.extras[k], v) for k, v in experience.extras.items()]
    pairs += [("episode_returns", result.episode_returns, reference.episode_returns)]
    pairs += [("draws", result.draws, reference.draws)]
    for name, got, expected in pairs:
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape), name
        np.testing.assert_array_equal(got, expected, err_msg=name, strict=True)
    assert result.env_steps == reference.env_steps
    assert result.weights_version == reference.weights_version


def _run_both(env: EnvSource, envs_per_worker: int, algorithm: str, request_args: dict, **config) -> RolloutResult:
    """One request through the worker and the reference loop, with a learner when the request
    names a learner_role (then its network gets fixed random weights)."""
    spec = (make_env(env) if isinstance(env, str) else env()).spec
    request_args = dict(request_args, weights_version=3)
    learner_role = request_args.pop("learner_role", None)
    policy = None
    if learner_role is not None:
        agent = next(a for a in spec.agents if request_args["roles"](a) == learner_role)
        settings = ALGORITHMS[algorithm].config(**config)
        torch.manual_seed(7)
        policy = ALGORITHMS[algorithm].policy(spec.observation_size[agent], spec.num_actions[agent], settings)
        request_args["learners"] = {learner_role: LearnerSpec("invariants", AlgorithmPolicy(algorithm, settings))}
    store = WeightStore()
    if policy is not None:
        store.push("invariants", 3, policy.get_weights())
    request = RolloutRequest(**request_args)
    result = RolloutWorker(env, envs_per_worker, store).collect(request)
    _assert_identical(result, _reference_collect(env, envs_per_worker, policy, request, learner_role))
    return result


class _ScriptedTurns(MultiAgentEnv):
    """Two agents whose turns, rewards and endings come from the env's seed, unlike any real game
    here: "b" often acts several times before "a" acts again (so streams close out of first-act
    order), rewards come every step, also before an agent's first turn, and about half the
    episodes end truncated instead of terminated."""

    spec = EnvSpec("scripted", ("a", "b"), {"a": 4, "b": 4}, {"a": 3, "b": 3}, simultaneous=False)

    def __init__(self):
        self._rng = np.random.default_rng(0)
        self._masks: dict = {}
        self._left = 0

    def reset(self, seed=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._left = int(self._rng.integers(1, 7))
        return self._timestep({"a": 0.0, "b": 0.0})

    def step(self, actions):
        check_actions("scripted", self._masks, actions)
        self._left -= 1
        return self._timestep({agent: float(self._rng.integers(-2, 3)) for agent in ("a", "b")})

    def _timestep(self, rewards):
        if self._left == 0:
            truncated = bool(self._rng.random() < 0.5)
            self._masks = {}
            ends, cuts = dict.fromkeys("ab", not truncated), dict.fromkeys("ab", truncated)
            return TimeStep({}, {}, rewards, ends, cuts, {})
        agent = "a" if self._rng.random() < 0.3 else "b"
        mask = self._rng.random(3) < 0.6
        mask[self._rng.integers(3)] = True
        self._masks = {agent: mask}
        observation = self._rng.random(4).astype(np.float32)
        return TimeStep(
            {agent: observation},
            {agent: mask},
            rewards,
            dict.fromkeys("ab", False),
            dict.fromkeys("ab", False),
            {agent: {}},
        )


def _leduc_population(player: int, members: int, seed: int) -> PolicyMixture:
    """Random legal mixed strategies for one leduc player, mixed by a random meta-strategy."""
    rng = np.random.default_rng(seed)
    legal = build_tree("leduc_poker").players[player].legal
    policies = rng.random((members, *legal.shape)) * legal
    policies /= policies.sum(axis=2, keepdims=True)
    return PolicyMixture(
        tuple(TabularPolicy("leduc_poker", player, p) for p in policies), rng.dirichlet(np.ones(members))
    )


def _networks(algorithm: str, obs_size: int, num_actions: int, members: int, seed: int) -> list[NeuralPolicy]:
    """Untrained networks of distinct random weights, as population members."""
    config = ALGORITHMS[algorithm].config().model_dump(mode="json")
    torch.manual_seed(seed)
    return [NeuralPolicy(algorithm, config, obs_size, num_actions) for _ in range(members)]


PLAYERS = one_population_per_agent  # on OpenSpiel games each player is its own role


def test_leduc_self_play_matches_the_reference_loop():
    # Both players one learner role (the benchmark's setting), an uneven split of episodes over copies.
    result = _run_both(
        "leduc_poker",
        7,
        "dqn",
        dict(roles=shared_population("all"), populations={}, learner_role="all", episodes=61, seed=(5, 1)),
        epsilon_start=0.3,
    )
    assert len(result.episode_returns) == 61 and result.experience["all"].last.sum() == 2 * 61


def test_leduc_against_a_population_with_ppo_extras_matches_the_reference_loop():
    # The table path (one draw per episode, sampled rows) and per-sample extras (logp, value).
    populations = {"player_1": _leduc_population(1, 3, seed=11)}
    result = _run_both(
        "leduc_poker",
        5,
        "ppo",
        dict(roles=PLAYERS, populations=populations, learner_role="player_0", episodes=40, seed=(9,)),
    )
    assert set(result.experience["player_0"].extras) == {"logp", "value"}
    assert len(set(result.draws[:, 0].tolist())) > 1


def test_leduc_greedy_learner_against_two_populations_matches_the_reference_loop():
    # Populations on every agent (no learner, no transitions at all), then a greedy learner (explore=False).
    populations = {"player_0": _leduc_population(0, 2, seed=1), "player_1": _leduc_population(1, 4, seed=2)}
    _run_both("leduc_poker", 4, "dqn", dict(roles=PLAYERS, populations=populations, episodes=9, seed=(2, 2)))
    _run_both(
        "leduc_poker",
        3,
        "dqn",
        dict(
            roles=PLAYERS,
            populations={"player_0": populations["player_0"]},
            learner_role="player_1",
            episodes=10,
            seed=(4,),
            explore=False,
        ),
    )


def test_mixed_tabular_and_neural_members_match_the_reference_loop():
    # A population with a network among its tables takes the policy path: one call per member in use.
    tables = _leduc_population(1, 2, seed=3).members
    networks = _networks("ppo", 30, 3, 2, seed=5)
    populations = {
        "player_0": PolicyMixture(tuple(_networks("dqn", 30, 3, 2, seed=4)), np.array([0.5, 0.5])),
        "player_1": PolicyMixture((tables[0], networks[0], tables[1], networks[1]), np.full(4, 0.25)),
    }
    result = _run_both("leduc_poker", 6, "dqn", dict(roles=PLAYERS, populations=populations, episodes=50, seed=(3,)))
    assert set(result.draws[:, 1].tolist()) == {0, 1, 2, 3}


def test_no_episodes_returns_empty_arrays_like_the_reference_loop():
    _run_both(
        "leduc_poker",
        3,
        "dqn",
        dict(roles=shared_population("all"), populations={}, learner_role="all", episodes=0, seed=(1,)),
    )


@pytest.mark.parametrize("algorithm", ["dqn", "ppo"])
def test_parallel_pettingzoo_env_matches_the_reference_loop(algorithm):
    # Three agents act in every step; rewards arrive every step, not only at the end.
    result = _run_both(
        SPREAD,
        3,
        algorithm,
        dict(roles=shared_population("agent"), populations={}, learner_role="agent", episodes=5, seed=(8, 0)),
    )
    assert len(result.experience["agent"]) == 5 * 25 * 3 and result.experience["agent"].reward.min() < 0


def test_pettingzoo_roles_with_network_populations_match_the_reference_loop():
    # simple_adversary: the learner plays the adversary; agent_0 and agent_1 share one drawn network.
    roles = by_prefix({"adversary_": "adversary", "agent_": "agent"})
    populations = {"agent": PolicyMixture(tuple(_networks("ppo", 10, 5, 3, seed=2)), np.array([0.2, 0.3, 0.5]))}
    result = _run_both(
        ADVERSARY,
        4,
        "ppo",
        dict(roles=roles, populations=populations, learner_role="adversary", episodes=9, seed=(1, 1)),
    )
    assert len(result.experience["adversary"]) == 9 * 25


def test_irregular_turns_truncations_and_early_rewards_match_the_reference_loop():
    result = _run_both(
        _ScriptedTurns,
        4,
        "dqn",
        dict(roles=shared_population("all"), populations={}, learner_role="all", episodes=30, seed=(6,)),
        epsilon_start=0.5,
    )
    assert 0 < result.experience["all"].done.sum() < result.experience["all"].last.sum()  # some streams end truncated


@pytest.mark.parametrize("algorithm", ["dqn", "ppo"])
def test_acting_still_rejects_a_mask_row_without_legal_actions_and_wrong_shapes(algorithm):
    # The checks moved from torch to numpy to save dispatch time per step; they must still hold.
    policy = ALGORITHMS[algorithm].policy(4, 3, ALGORITHMS[algorithm].config())
    rng = np.random.default_rng(0)
    obs, mask = np.zeros((2, 4), np.float32), np.ones((2, 3), bool)
    mask[1] = False
    with pytest.raises(ValueError, match="every mask row needs at least one legal action"):
        policy.act(obs, mask, True, rng)
    with pytest.raises(ValueError, match=r"expected obs \[B, 4\] and mask \[B, 3\], got \(2, 5\) and \(2, 3\)"):
        policy.act(np.zeros((2, 5), np.float32), np.ones((2, 3), bool), True, rng)
