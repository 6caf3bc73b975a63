"""MADDPG (marl_core/marl/maddpg.py) on MPE's simple_adversary (adversary_0 -> "adversary",
agent_0 and agent_1 -> "agent", sharing one actor and one critic):

- a centralized critic sees every agent's observation and action, and only those (plus which
  agent it values): other agents' actions and observations move its value;
- actors act on their own observation only, sample exactly their softmax over legal actions,
  and the greedy policy is its argmax;
- the actor's gradient flows through the straight-through Gumbel-softmax sample into its actor
  (and no other);
- the replay buffer keeps every agent's own reward, and a learner restored mid-training makes
  exactly the same updates.
"""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
from joint_rollouts import JointRollouts

from marl_core.marl.config import MARLConfig, make_learner
from marl_core.marl.maddpg import GumbelSoftmaxPolicy, MADDPGLearner, gumbel_softmax

torch.set_num_threads(1)

ADVERSARY = "pettingzoo:mpe2.simple_adversary_v3"
SMALL = dict(batch_size=32, buffer_size=2_000, learning_starts=0, train_every=20)


@pytest.fixture(scope="module")
def setup():
    config = MARLConfig(env=ADVERSARY, algorithm="maddpg", settings=SMALL, envs_per_worker=2)
    workers = JointRollouts.of(config)
    learner = make_learner(config, workers.layout, workers.spec.state_size)
    batch, _, _ = workers.collect(learner.policies, 50)
    return config, workers, learner, batch


def sampled(learner: MADDPGLearner, batch, size: int = 64, seed: int = 0):
    """A minibatch of the collected transitions (a fresh buffer: the learner's own stays as it is)."""
    from marl_core.marl.maddpg import PerAgentReplayBuffer

    buffer = PerAgentReplayBuffer(1_000, learner.layout, batch.state.shape[-1])
    buffer.add(batch)
    return buffer.sample(size, np.random.default_rng(seed))


def test_the_layout_maps_agents_by_role(setup):
    _, workers, learner, _ = setup
    assert workers.layout.groups == {"adversary": ("adversary_0",), "agent": ("agent_0", "agent_1")}
    assert workers.layout.obs_size == {"adversary": 8, "agent": 12}  # the shared policy's agents see a one-hot
    assert list(learner.policies) == list(learner.critics) == ["adversary", "agent"]


def test_a_centralized_critic_sees_every_agents_observation_and_action(setup):
    _, _, learner, batch = setup
    # every agent's environment observation (8 + 10 + 10) and one-hot action (3 x 5), plus, for the
    # critic that two agents share, which of them it values
    assert learner.joint_size == 8 + 10 + 10 + 3 * 5
    assert learner.critics["adversary"].q[0].in_features == learner.joint_size
    assert learner.critics["agent"].q[0].in_features == learner.joint_size + 2

    t = sampled(learner, batch)
    taken = learner.one_hot(t.action)

    def values(obs, action):
        joint = learner.joint(obs, learner.one_hot(action))
        with torch.no_grad():
            return learner.critics["adversary"](joint.unsqueeze(1))[:, 0], learner.critics["agent"](
                joint.unsqueeze(1).expand(-1, 2, -1)
            )

    adversary, agent = values(t.obs, t.action)
    # agent_1 plays another action: the adversary's critic and agent_0's (same network, other one-hot) move
    other = {**t.action, "agent": t.action["agent"].clone()}
    other["agent"][:, 1] = (other["agent"][:, 1] + 1) % 5
    moved_adversary, moved_agent = values(t.obs, other)
    assert (moved_adversary != adversary).all() and (moved_agent[:, 0] != agent[:, 0]).all()
    # the adversary observes something else: both agents' values move
    seen = {**t.obs, "adversary": t.obs["adversary"] + 0.5}
    moved_adversary, moved_agent = values(seen, t.action)
    assert (moved_agent != agent).all()
    # the agents' own one-hot ids are constant parts of the joint vector and are left out of it
    relabelled = {
        **t.obs,
        "agent": torch.cat([t.obs["agent"][..., :10], torch.zeros_like(t.obs["agent"][..., 10:])], dim=2),
    }
    assert torch.equal(learner.joint(relabelled, taken), learner.joint(t.obs, taken))
    # the shared critic tells its agents apart
    assert (agent[:, 0] != agent[:, 1]).all()


def test_actors_act_on_their_own_observation_only(setup):
    _, workers, learner, _ = setup
    for p, policy in learner.policies.items():
        assert policy.actor[0].in_features == workers.layout.obs_size[p] < learner.joint_size
    # greedy play is reproduced by each agent's actor from what that agent saw, alone
    batch, _, _ = workers.collect(learner.policies, 10, explore=False)
    for agent in workers.layout.agents:
        policy = learner.policies[workers.layout.policy_of[agent]]
        for t in range(batch.steps):
            actions, _ = policy.act(batch.obs[agent][t], batch.mask[agent][t], False, np.random.default_rng(0))
            np.testing.assert_array_equal(actions, batch.action[agent][t])


def test_acting_and_gumbel_samples_follow_the_softmax_over_legal_actions():
    torch.manual_seed(0)
    policy = GumbelSoftmaxPolicy(4, 5, (16,))
    obs = np.random.default_rng(0).normal(size=(1, 4)).astype(np.float32).repeat(20_000, axis=0)
    mask = np.array([[True, False, True, True, False]]).repeat(20_000, axis=0)
    probs = policy.action_probs(obs[:1], mask[:1])[0]
    assert probs[1] == probs[4] == 0.0 and probs.sum() == pytest.approx(1.0)

    explored, _ = policy.act(obs, mask, True, np.random.default_rng(1))
    np.testing.assert_allclose(np.bincount(explored, minlength=5) / len(explored), probs, atol=0.015)
    greedy, _ = policy.act(obs[:3], mask[:3], False, np.random.default_rng(1))
    assert (greedy == probs.argmax()).all()

    with torch.no_grad():
        logits = policy.actor(torch.from_numpy(obs))
    sample = gumbel_softmax(logits, torch.from_numpy(mask), 1.0, torch.Generator().manual_seed(2))
    assert torch.equal(sample.sum(dim=1), torch.ones(len(sample))) and set(sample.unique().tolist()) == {0.0, 1.0}
    np.testing.assert_allclose(
        sample.mean(dim=0).numpy(), probs, atol=0.015
    )  # an exact sample, whatever the temperature


def test_the_actor_gradient_flows_through_the_gumbel_softmax_sample_into_its_actor(setup):
    config, workers, _, batch = setup
    no_penalty = config.model_copy(update={"settings": {**SMALL, "logit_penalty": 0.0}})
    learner = make_learner(no_penalty, workers.layout, workers.spec.state_size)
    t = sampled(learner, batch)
    loss = learner.actor_loss("agent", t, learner.one_hot(t.action))
    loss.backward()
    for name, weight in learner.actors["agent"].named_parameters():
        assert weight.grad is not None and weight.grad.abs().sum() > 0, name
    assert all(weight.grad is None for weight in learner.actors["adversary"].parameters())

    # straight-through: the forward value is the hard one-hot, the gradient the soft relaxation's
    logits = torch.zeros(3, 5, requires_grad=True)
    sample = gumbel_softmax(logits, torch.ones(3, 5, dtype=torch.bool), 0.5, torch.Generator().manual_seed(0))
    (sample * torch.arange(5.0)).sum().backward()
    assert set(sample.detach().unique().tolist()) == {0.0, 1.0} and logits.grad.abs().sum() > 0
    # an illegal action gets no gradient
    logits.grad = None
    legal = torch.tensor([[True, True, False, True, True]]).expand(3, -1)
    (gumbel_softmax(logits, legal, 0.5, torch.Generator().manual_seed(0)) * torch.arange(5.0)).sum().backward()
    assert (logits.grad[:, 2] == 0).all()


def test_the_buffer_keeps_every_agents_own_reward_and_the_team_mean(setup):
    _, workers, learner, batch = setup
    from marl_core.marl.maddpg import PerAgentReplayBuffer

    buffer = PerAgentReplayBuffer(1_000, workers.layout, workers.spec.state_size)
    buffer.add(batch)
    rows = batch.flat()
    np.testing.assert_array_equal(buffer.agent_reward["adversary"][: len(buffer), 0], rows.reward["adversary_0"][:, 0])
    np.testing.assert_array_equal(buffer.agent_reward["agent"][: len(buffer), 1], rows.reward["agent_1"][:, 0])
    assert not np.allclose(
        buffer.agent_reward["adversary"][: len(buffer), 0], buffer.agent_reward["agent"][: len(buffer), 0]
    )
    team = np.mean([rows.reward[a][:, 0] for a in rows.agents], axis=0)
    np.testing.assert_allclose(buffer.reward[: len(buffer)], team, rtol=1e-6)  # VDN/QMIX's field, unchanged
    np.testing.assert_array_equal(buffer.mask["agent"][: len(buffer), 0], rows.mask["agent_0"][:, 0])

    saved = io.BytesIO()
    torch.save(buffer.state_dict(), saved)
    saved.seek(0)
    restored = PerAgentReplayBuffer(1_000, workers.layout, workers.spec.state_size)
    restored.load_state_dict(torch.load(saved, weights_only=True))
    a, b = buffer.sample(16, np.random.default_rng(3)), restored.sample(16, np.random.default_rng(3))
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        assert all(torch.equal(x[p], y[p]) for p in x) if isinstance(x, dict) else torch.equal(x, y)


def test_a_learner_restored_mid_training_makes_exactly_the_same_updates(setup):
    config, workers, _, _ = setup
    original = make_learner(config, workers.layout, workers.spec.state_size)
    first, _, _ = workers.collect(original.policies, 40)
    assert original.learn(first)["updates"] == 4
    saved = io.BytesIO()
    torch.save(original.state_dict(), saved)
    saved.seek(0)
    restored = make_learner(config, workers.layout, workers.spec.state_size)
    restored.load_state_dict(torch.load(saved, weights_only=True))

    second, _, _ = workers.collect(original.policies, 40)
    metrics = original.learn(second)
    assert metrics == restored.learn(second) and metrics["updates"] == 4 and np.isfinite(metrics["agent/critic_loss"])
    for name in ("policies", "critics", "target_actors", "target_critics"):
        for p, module in getattr(original, name).items():
            for (key, a), b in zip(module.state_dict().items(), getattr(restored, name)[p].state_dict().values()):
                assert torch.equal(a, b), f"{name}.{p}.{key}"


def test_a_frozen_policy_acts_but_does_not_learn_while_the_others_do(setup):
    config, workers, _, batch = setup
    frozen = MARLConfig(
        env=ADVERSARY, algorithm="maddpg", settings={**SMALL, "frozen": ("adversary",)}, envs_per_worker=2
    )
    learner = make_learner(frozen, workers.layout, workers.spec.state_size)
    before = {
        name: {p: copy.deepcopy(m.state_dict()) for p, m in getattr(learner, name).items()}
        for name in ("policies", "critics")
    }
    metrics = learner.learn(batch)
    assert metrics["updates"] == 5 and "agent/actor_loss" in metrics and "adversary/actor_loss" not in metrics
    for name, networks in before.items():
        for p, state in networks.items():
            now = getattr(learner, name)[p].state_dict()
            unchanged = all(torch.equal(state[key], now[key]) for key in state)
            assert unchanged == (p == "adversary"), f"{name}.{p}"
    learner.frozen = set()  # unfrozen between rounds: it learns again
    learner.learn(batch)
    assert not torch.equal(
        before["policies"]["adversary"]["actor.0.weight"], learner.policies["adversary"].state_dict()["actor.0.weight"]
    )


def test_freezing_a_policy_the_layout_lacks_is_refused_before_any_work():
    from marl_core.marl.config import check

    config = MARLConfig(env=ADVERSARY, algorithm="maddpg", settings={**SMALL, "frozen": ("adversaries",)})
    with pytest.raises(
        ValueError,
        match=r"settings.frozen=\['adversaries'\]: no such policy; the policies are \['adversary', 'agent'\]",
    ):
        check(config)
