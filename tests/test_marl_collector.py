"""Global state and the joint MARL rollout: what centralized learners are handed is what happened."""

import numpy as np
import pytest
from joint_rollouts import JointRollouts

from marl_core.envs import by_prefix, make_env, one_population_per_agent
from marl_core.rl.policy import NetworkPolicy
from marl_core.rl.sampling import uniform_legal

SPREAD = "pettingzoo:mpe2.simple_spread_v3"
TWO_STEP = "pettingzoo:marl_core.envs.two_step"


class CountingUniform(NetworkPolicy):
    """Uniform over legal actions; counts its calls and remembers the inputs of the last one."""

    def __init__(self, obs_size, num_actions):
        super().__init__(obs_size, num_actions)
        self.calls = 0

    def act(self, obs, mask, explore, generator):
        self._tensors(obs, mask)  # the same shape checks as a real network
        self.calls += 1
        self.last_obs = obs
        return uniform_legal(mask, generator), {"seen": obs.sum(axis=1)}

    def action_probs(self, obs, mask):
        return mask / mask.sum(axis=1, keepdims=True)


def test_state_is_the_environments_own_where_it_has_one():
    env = make_env(SPREAD)
    env.reset(seed=3)
    raw = env.env.unwrapped
    assert env.spec.state_size == 54
    np.testing.assert_array_equal(env.state(), np.asarray(raw.state(), np.float32))


def test_default_state_concatenates_observations_with_zeros_for_agents_not_observing():
    env = make_env("leduc_poker")  # turn-based: only the acting player observes
    step = env.reset(seed=0)
    (acting,) = step.acting
    state = env.state()
    size = env.spec.observation_size[acting]
    assert env.spec.state_size == 2 * size and state.shape == (2 * size,)
    offset = env.spec.agents.index(acting) * size
    np.testing.assert_array_equal(state[offset : offset + size], step.observations[acting])
    assert not state[size - offset : 2 * size - offset].any()


def test_two_step_game_pays_as_in_the_qmix_paper():
    def play(first, second):
        env = make_env(TWO_STEP)
        env.reset()
        env.step({"agent_0": first[0], "agent_1": first[1]})
        step = env.step({"agent_0": second[0], "agent_1": second[1]})
        assert step.done
        return step.rewards["agent_0"], step.rewards["agent_1"]

    assert all(play((0, b), (x, y)) == (7.0, 7.0) for b in (0, 1) for x in (0, 1) for y in (0, 1))
    assert [play((1, 0), (x, y))[0] for x in (0, 1) for y in (0, 1)] == [0.0, 1.0, 1.0, 8.0]


def test_a_segment_records_every_agents_step_state_and_episode_boundaries():
    collector = JointRollouts(SPREAD, num_envs=3, mapping=by_prefix({"agent": "shared"}), agent_ids=True, seed=7)
    policy = CountingUniform(collector.layout.obs_size["shared"], 5)
    batch, returns, lengths = collector.collect({"shared": policy}, steps=60)

    assert collector.layout.obs_size == {"shared": 18 + 3}
    assert policy.calls == 60  # parameter sharing: one forward pass per step for all agents of all copies
    assert batch.obs["agent_2"].shape == (60, 3, 21) and batch.state.shape == (60, 3, 54)
    for k, agent in enumerate(("agent_0", "agent_1", "agent_2")):  # each agent sees its own index
        np.testing.assert_array_equal(batch.obs[agent][..., 18:], np.broadcast_to(np.eye(3)[k], (60, 3, 3)))
    np.testing.assert_allclose(batch.extras["agent_1"]["seen"], batch.obs["agent_1"].sum(axis=2), rtol=1e-6)
    # max_cycles=25: truncated (never terminated) at steps 25 and 50 of every copy
    assert not batch.terminated.any()
    np.testing.assert_array_equal(np.flatnonzero(batch.truncated[:, 0]), [24, 49])
    assert lengths.tolist() == [25] * 6
    # the state after a step is the next step's state, except across a reset
    same = ~batch.episode_end[:-1]
    np.testing.assert_array_equal(batch.next_state[:-1][same], batch.state[1:][same])
    assert not np.array_equal(batch.next_state[24, 0], batch.state[25, 0])
    # a truncated step still hands the final observation to bootstrap from
    assert np.abs(batch.next_obs["agent_0"][24, 0, :18]).sum() > 0
    # finished episodes' returns are the rewards of their steps
    rewards = np.stack([batch.reward[a] for a in batch.agents], axis=-1)  # [T, E, N]
    per_episode = [rewards[start : start + 25, e].sum(axis=0) for e in range(3) for start in (0, 25)]
    np.testing.assert_allclose(np.sort(returns, axis=0), np.sort(np.array(per_episode), axis=0), rtol=1e-5)
    batch.agent_experience(["agent_0", "agent_2"]).validate()


def test_episodes_run_on_across_segments_and_terminations_are_flagged():
    collector = JointRollouts(TWO_STEP, num_envs=2, mapping=one_population_per_agent, seed=0)
    policies = {a: CountingUniform(3, 2) for a in ("agent_0", "agent_1")}
    first, _, _ = collector.collect(policies, steps=3)
    second, returns, lengths = collector.collect(policies, steps=3)
    # episodes are two steps long: segment 1 ends them at steps 1; segment 2 (steps 3..5) at 3 and 5
    np.testing.assert_array_equal(first.terminated[:, 0], [False, True, False])
    np.testing.assert_array_equal(second.terminated[:, 0], [True, False, True])
    assert lengths.tolist() == [2] * 4 and not first.truncated.any()
    assert not second.next_mask["agent_0"][0, 0].any()  # nothing to act on after the end
    assert set(returns[:, 0]) <= {0.0, 1.0, 7.0, 8.0}


def test_turn_based_environments_and_mismatched_sharing_are_refused_in_one_line():
    from marl_core.marl.config import MARLConfig, layout_and_spec

    with pytest.raises(ValueError, match="turn-based; MARL training needs a simultaneous environment"):
        layout_and_spec(MARLConfig(env="pettingzoo:classic.connect_four_v3"))
    rollouts = JointRollouts("pettingzoo:classic.connect_four_v3", 1, one_population_per_agent)
    with pytest.raises(ValueError, match="turn-based; a fragment of joint steps needs a simultaneous environment"):
        rollouts.collect({a: CountingUniform(84, 7) for a in ("player_0", "player_1")}, steps=1)
    with pytest.raises(ValueError, match=r"share policy 'all' but differ in \(observation size, actions\)"):
        JointRollouts("pettingzoo:mpe2.simple_adversary_v3", 1, lambda agent: "all")


def test_independent_learners_fragments_leave_the_global_state_out_and_centralized_ones_keep_it():
    from marl_core.marl.config import MARLConfig, layout_and_spec, make_learner, pool_config
    from marl_core.marl.learner_handles import LocalLearner
    from marl_core.marl.steps import collect_rollouts
    from marl_core.rollout.pool import WorkerPool

    for algorithm, state_size in (("ippo", 0), ("mappo", 54)):  # simple_spread: 3 agents x 18
        config = MARLConfig(
            env="pettingzoo:mpe2.simple_spread_v3", algorithm=algorithm, envs_per_worker=2, steps_per_round=5
        )
        layout, spec = layout_and_spec(config)
        learner = LocalLearner(make_learner(config, layout, spec.state_size))
        batch = collect_rollouts(config, WorkerPool(pool_config(config)), learner, 0).batch
        assert batch.state.shape == batch.next_state.shape == (5, 2, state_size), algorithm
        learner.learn(batch)  # each learns from what it was given


def _recorded(episode_ends: list[tuple[int, int]], steps: int = 4, envs: int = 2):
    """A segment whose observation at (t, e) is [10 t + e, 1]; an episode is truncated after the
    steps in `episode_ends`, with the final observation [100 + 10 t + e, 2]."""
    from marl_core.envs import TimeStep
    from marl_core.rollout.joint import JointRecorder

    record = JointRecorder(steps, envs, ("a",), {"a": 2}, {"a": 2}, 0, {"a": np.uint8})

    def seen(t, e):
        return np.array([10 * t + e, 1], np.uint8)

    for t in range(steps):
        for e in range(envs):
            done = (t, e) in episode_ends
            if done:  # nobody acts after the end; the final observation comes in the infos
                final = np.array([100 + 10 * t + e, 2], np.uint8)
                step = TimeStep({}, {}, {"a": 0.0}, {"a": False}, {"a": True}, {"a": {"final_observation": final}})
            else:
                step = TimeStep(
                    {"a": seen(t + 1, e)}, {"a": np.ones(2, bool)}, {"a": 0.0}, {"a": False}, {"a": False}, {"a": {}}
                )
            record.step(t, e, step, np.zeros(1), np.zeros(0, np.float32), False, done, {})
            if done:
                final[:] = 0  # an environment that reuses its observation's buffer after the reset
        record.acted(
            t,
            {"a": np.stack([seen(t, e) for e in range(envs)])},
            {"a": np.ones((envs, 2), bool)},
            np.zeros((envs, 0), np.float32),
            {"a": np.zeros(envs, np.int64)},
            {},
        )
    return record.batch()


def test_the_observation_after_each_step_is_recorded_only_where_the_next_row_lacks_it():
    import pickle

    from marl_core.rollout.joint_experience import FollowingObservations, JointExperience

    ends = [(1, 0), (0, 1), (3, 1)]
    batch = _recorded(ends)
    assert isinstance(batch.next_obs, FollowingObservations)
    assert batch.next_obs.ended["a"].tolist() == [[101, 2], [110, 2]]  # (0, 1) then (1, 0): row-major
    expected = np.array(
        [[[10 * (t + 1) + e, 1] if (t, e) not in ends else [100 + 10 * t + e, 2] for e in range(2)] for t in range(4)]
    )
    np.testing.assert_array_equal(batch.next_obs["a"], expected)
    assert batch.next_obs["a"].dtype == np.uint8

    shipped = pickle.loads(pickle.dumps(batch))  # what travels holds no full copy
    assert shipped.next_obs._built == {}
    np.testing.assert_array_equal(shipped.next_obs["a"], expected)
    np.testing.assert_array_equal(batch.float_observations().next_obs["a"], expected.astype(np.float32))
    np.testing.assert_array_equal(batch.flat().next_obs["a"][:, 0], expected.reshape(-1, 2))

    other = _recorded([(0, 0), (2, 1)])
    joined = JointExperience.concat_envs([batch, other])
    assert isinstance(joined.next_obs, FollowingObservations)
    np.testing.assert_array_equal(joined.next_obs["a"], np.concatenate([expected, other.next_obs["a"]], axis=1))
