"""MAPPO (marl_core/marl/mappo.py).

- The centralized critic values the global state (plus the agent's one-hot): changing only
  `batch.state` changes its values and its loss, changing only the observations does not; the
  actors see only observations.
- Parameter sharing shares: simple_spread's three agents act through one actor in one forward
  pass per step, and its one weight tensor moves when the learner learns.
- GAE follows `batch.py`: a termination ends the return, a truncation and the segment's last row
  bootstrap from the critic's value of `next_state`, each agent with its own reward.
- On the two-step game of the QMIX paper MAPPO finds the optimal joint policy (return 8).
- Initialisation is seeded and leaves the global torch RNG alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from joint_rollouts import JointRollouts

from marl_core.envs import make_env
from marl_core.envs.agent_mapping import by_prefix
from marl_core.marl.config import MARLConfig, make_learner
from marl_core.marl.mappo import MAPPOLearner
from marl_core.marl.rounds import iterate_marl_local
from marl_core.marl.settings import MAPPOConfig
from marl_core.rollout.joint_experience import JointExperience
from marl_core.rollout.layout import PolicyLayout

torch.set_num_threads(1)

SPREAD = "pettingzoo:mpe2.simple_spread_v3"
TWO_STEP = "pettingzoo:marl_core.envs.two_step"
SMALL = dict(hidden=(16,), critic_hidden=(16,), minibatch_size=64, epochs=2)


def spread_learner_and_batch(steps: int = 20):
    config = MARLConfig(env=SPREAD, algorithm="mappo", settings=SMALL, envs_per_worker=2)
    workers = JointRollouts.of(config)
    learner = make_learner(config, workers.layout, workers.spec.state_size)
    batch, _, _ = workers.collect(learner.policies, steps)
    return config, workers, learner, batch


def test_the_critic_values_the_global_state_and_the_actors_only_their_observations():
    config, workers, learner, batch = spread_learner_and_batch()
    state_size = workers.spec.state_size
    assert batch.state.shape == (20, 2, state_size)
    critic, actor = learner.critics["agent"], learner.policies["agent"]
    assert critic.net[0].in_features == state_size + 3  # the global state and the agent's one-hot
    assert actor.actor[0].in_features == workers.layout.obs_size["agent"] == 18 + 3  # observation and one-hot

    values = learner.values("agent", batch.state)
    assert values.shape == (3, 20, 2)
    assert not np.allclose(values[0], values[1])  # one critic, yet a value per agent

    moved_state = dataclasses.replace(batch, state=batch.state + 0.5, next_state=batch.next_state + 0.5)
    assert not np.allclose(learner.values("agent", moved_state.state), values)
    _, returns, _ = learner.advantages("agent", batch)
    _, moved_returns, _ = learner.advantages("agent", moved_state)
    assert not np.allclose(returns, moved_returns)

    moved_obs = dataclasses.replace(
        batch,
        obs={a: o + 0.5 for a, o in batch.obs.items()},
        next_obs={a: o + 0.5 for a, o in batch.next_obs.items()},
    )
    np.testing.assert_array_equal(learner.advantages("agent", moved_obs)[1], returns)

    twin = make_learner(config, workers.layout, state_size)  # same seed: same networks
    assert learner.learn(batch)["agent/value_loss"] != twin.learn(moved_state)["agent/value_loss"]


def test_the_agents_of_a_role_act_and_learn_through_one_shared_actor():
    config = MARLConfig(env=SPREAD, algorithm="mappo", settings=SMALL, envs_per_worker=2)
    workers = JointRollouts.of(config)
    assert set(workers.layout.policy_of.values()) == {"agent"} and len(workers.layout.agents) == 3
    learner = make_learner(config, workers.layout, workers.spec.state_size)
    assert list(learner.policies) == list(learner.critics) == ["agent"]
    actor = learner.policies["agent"]
    weight = actor.actor[0].weight
    assert any(weight is w for w in learner.optimizers["agent"].param_groups[0]["params"])

    calls = []
    act = actor.act
    actor.act = lambda obs, *rest: calls.append(len(obs)) or act(obs, *rest)
    batch, _, _ = workers.collect(learner.policies, 16)
    del actor.act
    assert calls == [3 * 2] * 16  # every step: all three agents of both copies in one forward pass

    before, critic_before = weight.detach().clone(), learner.critics["agent"].net[0].weight.detach().clone()
    metrics = learner.learn(batch)
    assert learner.policies["agent"].actor[0].weight is weight
    assert not torch.equal(before, weight.detach())  # the one tensor every agent acts with moved
    assert not torch.equal(critic_before, learner.critics["agent"].net[0].weight.detach())
    assert np.isfinite(list(metrics.values())).all()


def test_gae_stops_at_terminations_and_bootstraps_truncations_and_the_segment_end():
    env = make_env(TWO_STEP)
    layout = PolicyLayout.of(env.spec, by_prefix({"agent": "agent"}), agent_ids=True)
    gamma = 0.5
    learner = MAPPOLearner(layout, 3, MAPPOConfig(hidden=(8,), critic_hidden=(8,), gamma=gamma, gae_lambda=1.0))
    T, E = 4, 2
    rng = np.random.default_rng(0)
    agents = layout.agents
    reward = {a: rng.normal(size=(T, E)).astype(np.float32) for a in agents}
    terminated = np.zeros((T, E), bool)
    truncated = np.zeros((T, E), bool)
    truncated[1, 0] = True  # copy 0: a time limit at step 1
    terminated[1, 1] = True  # copy 1: the episode ends for good at step 1
    batch = JointExperience(
        agents=agents,
        obs={a: np.zeros((T, E, 5), np.float32) for a in agents},
        mask={a: np.ones((T, E, 2), bool) for a in agents},
        action={a: np.zeros((T, E), np.int64) for a in agents},
        reward=reward,
        next_obs={a: np.zeros((T, E, 5), np.float32) for a in agents},
        next_mask={a: np.ones((T, E, 2), bool) for a in agents},
        state=rng.normal(size=(T, E, 3)).astype(np.float32),
        next_state=rng.normal(size=(T, E, 3)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
    )
    next_value = learner.values("agent", batch.next_state)  # [agent, T, E]
    _, returns, _ = learner.advantages("agent", batch)
    returns = returns.reshape(len(agents), E, T)  # streams: agent, then copy, then time
    for k, a in enumerate(agents):
        r = reward[a].astype(np.float64)
        for e in range(E):
            after_1 = next_value[k, 1, e] if e == 0 else 0.0  # truncation bootstraps, termination not
            expected_1 = r[1, e] + gamma * after_1
            expected_3 = r[3, e] + gamma * next_value[k, 3, e]  # the segment's last row bootstraps
            expected = [r[0, e] + gamma * expected_1, expected_1, r[2, e] + gamma * expected_3, expected_3]
            np.testing.assert_allclose(returns[k, e], expected, rtol=1e-5, atol=1e-6)


def test_mappo_finds_the_optimal_joint_policy_of_the_two_step_game():
    """Uniform play returns 4.75 on average, the safe choice (state 2A) 7; only coordinating on
    state 2B and both playing action 1 returns 8."""
    settings = dict(hidden=(32,), critic_hidden=(32,), lr=3e-3, epochs=4, minibatch_size=32, seed=3)
    config = MARLConfig(
        env=TWO_STEP,
        algorithm="mappo",
        settings=settings,
        rounds=20,
        steps_per_round=16,
        envs_per_worker=4,
        eval_every=10,
        eval_episodes=4,
        seed=3,
    )
    returns = [r.eval_returns["policy/agent"] for r, _ in iterate_marl_local(config) if r.eval_returns]
    assert returns[-1] == 8.0, returns


def test_initialisation_is_seeded_and_leaves_the_global_rng_alone():
    env = make_env(TWO_STEP)
    layout = PolicyLayout.of(env.spec, by_prefix({"agent": "agent"}), agent_ids=True)
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    first = MAPPOLearner(layout, 3, MAPPOConfig(seed=7))
    assert torch.equal(torch.rand(1), expected)
    second = MAPPOLearner(layout, 3, MAPPOConfig(seed=7))
    other = MAPPOLearner(layout, 3, MAPPOConfig(seed=8))
    for name, value in first.state_dict()["critics"]["agent"].items():
        assert torch.equal(value, second.state_dict()["critics"]["agent"][name])
    assert not torch.equal(first.policies["agent"].actor[0].weight, other.policies["agent"].actor[0].weight)
