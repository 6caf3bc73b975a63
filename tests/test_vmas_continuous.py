"""Continuous actions on VMAS (`vmas:<scenario>(continuous_actions=True)`) through the one rollout
engine: what the engine records is what VMAS returns for those actions clipped into their box
(replayed on VMAS itself), the Gaussian's log-probabilities and entropy are the textbook ones,
IPPO and MAPPO learn with them, and every other algorithm is refused in one line."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
import vmas
from joint_rollouts import JointRollouts
from test_marl_learning import final_sampled_return

from marl_core.envs import Box, make_env, shared_population
from marl_core.marl import MARL_ALGORITHMS
from marl_core.marl.config import MARLConfig, check, make_learner
from marl_core.policies.base import UniformPolicy
from marl_core.rl import gaussian
from marl_core.rl.ppo import GaussianActorCriticPolicy
from marl_core.rl.settings import PPOConfig
from marl_core.rollout.worker import Fragment, LearnerSpec, NetworkCopy, PolicyMixture, RolloutRequest, RolloutWorker

NAVIGATION = "vmas:navigation(n_agents=3,shared_rew=False,max_steps=7,continuous_actions=True)"
SQUARE = Box((-1.0, -1.0), (1.0, 1.0))  # navigation's actions: a force in x and y, each within [-1, 1]


def raw_navigation(copies: int):
    """NAVIGATION as VMAS itself makes it."""
    return vmas.make_env(
        "navigation",
        num_envs=copies,
        device="cpu",
        continuous_actions=True,
        max_steps=7,
        terminated_truncated=True,
        n_agents=3,
        shared_rew=False,
    )


def gaussian_network(seed: int = 0) -> GaussianActorCriticPolicy:
    """An untrained PPO actor-critic of navigation's agents (18 observations each), its spread
    raised so that many samples fall outside the box and are clipped."""
    torch.manual_seed(seed)
    network = GaussianActorCriticPolicy(18, SQUARE, PPOConfig(hidden=(16,)))
    with torch.no_grad():
        network.log_std.fill_(math.log(1.5))
    return network


def learner_request(network, **fields) -> RolloutRequest:
    return RolloutRequest(
        shared_population("agents"), learners={"agents": LearnerSpec("gaussian", NetworkCopy(network))}, **fields
    )


def test_the_flag_gives_every_agent_vmas_box_and_bad_actions_or_values_fail_in_one_line():
    env = make_env("vmas:navigation(n_agents=2,max_steps=5,continuous_actions=True)")
    spec = env.spec
    assert spec.action_boxes == {"agent_0": SQUARE, "agent_1": SQUARE} and spec.num_actions == {
        "agent_0": 0,
        "agent_1": 0,
    }
    step = env.reset(seed=3)
    assert all(mask.shape == (0,) for mask in step.action_masks.values())
    step = env.step({"agent_0": np.array([5.0, -0.5]), "agent_1": np.zeros(2)})  # 5.0 is clipped to 1.0
    assert step.acting == spec.agents
    with pytest.raises(ValueError, match=r"^vmas:[^\n]*: action 3 for agent 'agent_0' is not 2 finite numbers$"):
        env.step({"agent_0": 3, "agent_1": np.zeros(2)})
    with pytest.raises(ValueError, match=r"is not 2 finite numbers$"):
        env.step({"agent_0": np.array([np.nan, 0.0]), "agent_1": np.zeros(2)})
    with pytest.raises(
        ValueError, match=r"^environment 'vmas:navigation\(continuous_actions=1\)': continuous_actions=1 "
    ):
        make_env("vmas:navigation(continuous_actions=1)")
    assert not make_env("vmas:navigation(continuous_actions=False)").spec.action_boxes


def test_a_fragment_records_the_raw_samples_and_what_vmas_returns_for_them_clipped():
    copies, steps = 4, 10
    network = gaussian_network()
    worker = RolloutWorker(NAVIGATION, envs_per_worker=copies)
    result = worker.collect(learner_request(network, fragment=Fragment("train", 0, steps), seed=(5,)))
    joint, agents = result.joint, result.joint.agents
    assert all(joint.action[a].shape == (steps, copies, 2) and joint.action[a].dtype == np.float32 for a in agents)
    assert all(joint.mask[a].shape == (steps, copies, 0) for a in agents)
    recorded = np.stack([joint.action[a] for a in agents])
    assert (np.abs(recorded) > 1).mean() > 0.2  # the raw samples, many outside the box

    # the log-probability recorded is the raw sample's under the network that acted
    for a in agents:
        with torch.no_grad():
            mean, value = network.heads(torch.from_numpy(joint.obs[a].reshape(-1, 18)))
            logp = gaussian.log_prob(mean, network.log_std, torch.from_numpy(joint.action[a].reshape(-1, 2)))
        np.testing.assert_allclose(joint.extras[a]["logp"].reshape(-1), logp.numpy(), rtol=1e-5)
        np.testing.assert_allclose(joint.extras[a]["value"].reshape(-1), value.numpy(), rtol=1e-5)

    # VMAS itself, reset with the fragment's seed and given the recorded actions clipped into the
    # box, returns the same observations and rewards
    raw = raw_navigation(copies)
    observations = raw.reset(seed=int(np.random.default_rng((5,)).integers(2**31)))
    for t in range(steps):
        for i, a in enumerate(agents):
            np.testing.assert_allclose(joint.obs[a][t], observations[i].numpy(), err_msg=f"t={t}")
        observations, rewards, terminated, truncated, _ = raw.step(
            [torch.from_numpy(np.clip(joint.action[a][t], -1.0, 1.0)) for a in agents]
        )
        for i, a in enumerate(agents):
            np.testing.assert_allclose(joint.reward[a][t], rewards[i].numpy(), rtol=1e-6, err_msg=f"t={t}")
        if (terminated | truncated).all():  # every copy runs out at step 7: one batched reset
            observations = raw.reset()
    assert joint.truncated[6].all() and result.episode_lengths.tolist() == [7] * copies


def test_copies_stepped_one_by_one_record_the_same_fragment_as_one_batch():
    """A factory's copies (`VmasEnv`, one VMAS call each) take the one-by-one path; with one copy
    both paths seed and reset alike, so they must record the same fragment."""
    network = gaussian_network(seed=2)
    request = learner_request(network, fragment=Fragment("train", 0, 9), seed=(6,))
    batched = RolloutWorker(NAVIGATION, envs_per_worker=1).collect(request).joint
    one_by_one = RolloutWorker(lambda: make_env(NAVIGATION), envs_per_worker=1).collect(request).joint
    for a in batched.agents:
        np.testing.assert_array_equal(one_by_one.action[a], batched.action[a])
        np.testing.assert_allclose(one_by_one.reward[a], batched.reward[a], rtol=1e-6)
        np.testing.assert_allclose(one_by_one.next_obs[a], batched.next_obs[a], rtol=1e-6)
    np.testing.assert_array_equal(one_by_one.truncated, batched.truncated)


def test_greedy_whole_episodes_play_the_means_as_vmas_does():
    copies = 3
    network = gaussian_network(seed=1)
    worker = RolloutWorker(NAVIGATION, envs_per_worker=copies)
    result = worker.collect(learner_request(network, episodes=copies, seed=(8,), explore=False, experience=False))

    rng = np.random.default_rng((8,))
    seed = int(rng.integers(2**31))  # the first copy's seed seeds the batch's reset
    raw = raw_navigation(copies)
    observations, returns = raw.reset(seed=seed), np.zeros((copies, 3))
    for _ in range(7):
        with torch.no_grad():
            means = [network.heads(o)[0] for o in observations]
        observations, rewards, _, _, _ = raw.step([m.clamp(-1, 1) for m in means])
        returns += torch.stack(rewards, 1).numpy()
    np.testing.assert_allclose(result.episode_returns, returns, rtol=1e-5)


def test_gaussian_log_probabilities_entropy_and_draws_are_the_textbook_ones():
    log_2pi = math.log(2 * math.pi)
    mean, log_std = torch.tensor([[0.0, 1.0]]), torch.tensor([0.0, math.log(2.0)])
    # N(1; 0, 1): -1/2 - log(2 pi)/2; N(3; 1, 2^2): z = 1, so -1/2 - log 2 - log(2 pi)/2
    expected = (-0.5 - 0.5 * log_2pi) + (-0.5 - math.log(2.0) - 0.5 * log_2pi)
    assert gaussian.log_prob(mean, log_std, torch.tensor([[1.0, 3.0]])).item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(-3.5310242469692907)
    # each entry's entropy is 1/2 + log(2 pi)/2 + log sigma: 1 + log(2 pi) + log 2 = 1 + log(4 pi)
    assert gaussian.entropy(log_std).item() == pytest.approx(1 + math.log(4 * math.pi), rel=1e-6)

    with torch.inference_mode():
        action, logp = gaussian.sample(mean, log_std, True, np.random.default_rng(0))
    noise = np.random.default_rng(0).standard_normal((1, 2), dtype=np.float32)
    np.testing.assert_allclose(action, [[noise[0, 0], 1.0 + 2.0 * noise[0, 1]]], rtol=1e-6)
    z = noise[0]  # the standardised draw: log N = -z^2/2 - log sigma - log(2 pi)/2 per entry
    np.testing.assert_allclose(logp, [-(z**2).sum() / 2 - math.log(2.0) - log_2pi], rtol=1e-5)
    with torch.inference_mode():
        greedy, _ = gaussian.sample(mean, log_std, False, np.random.default_rng(0))
    np.testing.assert_array_equal(greedy, mean.numpy())


# VMAS's navigation with two agents and continuous actions. An untrained Gaussian team (means
# near 0, spread 1) returns about -0.08; after 24,000 joint steps a sampled team must return 0.4
# (docs/marl.md, "VMAS scenarios", has the figures).
CONTINUOUS_NAVIGATION = "vmas:navigation(n_agents=2,max_steps=25,continuous_actions=True)"
SETTINGS = {
    "ippo": {"ppo": dict(hidden=(64,), lr=3e-3, epochs=4, minibatch_size=256)},
    "mappo": dict(hidden=(64,), critic_hidden=(64,), lr=3e-3, epochs=4, minibatch_size=256),
}


@pytest.mark.parametrize("algorithm", sorted(SETTINGS))
def test_ippo_and_mappo_learn_continuous_navigation(algorithm):
    final = final_sampled_return(CONTINUOUS_NAVIGATION, algorithm, SETTINGS[algorithm], 30, 50, 16, eval_episodes=32)
    assert final >= 0.4, f"{algorithm}: {final:.2f} after 24,000 joint steps on {CONTINUOUS_NAVIGATION}"


@pytest.mark.parametrize("algorithm", sorted(SETTINGS))
def test_a_continuous_learner_restored_from_its_checkpoint_makes_exactly_the_same_next_update(algorithm):
    config = MARLConfig(env=CONTINUOUS_NAVIGATION, algorithm=algorithm, envs_per_worker=2, settings=SETTINGS[algorithm])
    workers = JointRollouts.of(config)
    original = make_learner(config, workers.layout, workers.spec.state_size)
    original.learn(workers.collect(original.policies, 40)[0])
    assert (original.policies["agent"].log_std != 0).all()  # the spread moved before the learner was saved
    saved = io.BytesIO()
    torch.save(original.state_dict(), saved)
    saved.seek(0)
    restored = make_learner(config, workers.layout, workers.spec.state_size)
    restored.load_state_dict(torch.load(saved, weights_only=True))
    second = workers.collect(original.policies, 40)[0]
    assert original.learn(second) == restored.learn(second)
    for name, weights in original.policies["agent"].state_dict().items():
        assert torch.equal(weights, restored.policies["agent"].state_dict()[name]), name


def test_asynchronous_ippo_streams_and_learns_continuous_actions():
    from marl_core.marl.rounds import iterate_marl_local

    config = MARLConfig(
        env=CONTINUOUS_NAVIGATION,
        algorithm="ippo",
        settings={"asynchronous": {}},
        rounds=2,
        steps_per_round=25,
        envs_per_worker=4,
        eval_every=2,
        eval_episodes=4,
    )
    records = [record for record, _ in iterate_marl_local(config)]
    assert np.isfinite(records[-1].eval_returns["policy/agent"])
    # two action entries, each of spread about 1: 1 + log(2 pi), learned a little
    assert records[-1].learner["agent/entropy"] == pytest.approx(1 + math.log(2 * math.pi), abs=0.05)


@pytest.mark.parametrize("algorithm", sorted(set(MARL_ALGORITHMS) - set(SETTINGS)))
def test_algorithms_without_continuous_actions_are_refused_before_anything_starts(algorithm):
    with pytest.raises(ValueError) as refused:
        check(MARLConfig(env=CONTINUOUS_NAVIGATION, algorithm=algorithm))
    assert str(refused.value) == (
        f"algorithm={algorithm!r}: environment {CONTINUOUS_NAVIGATION!r} has continuous actions, which {algorithm} "
        "cannot take; algorithms that can: ippo, mappo"
    )


def test_populations_and_uniform_play_are_refused_on_continuous_actions():
    with pytest.raises(ValueError, match=r"^eval_versus_uniform=True: environment .* set eval_versus_uniform: false$"):
        check(MARLConfig(env=CONTINUOUS_NAVIGATION, algorithm="mappo", eval_versus_uniform=True, agent_ids=False))
    worker = RolloutWorker(CONTINUOUS_NAVIGATION, envs_per_worker=2)
    uniform = {"agents": PolicyMixture([UniformPolicy()], np.ones(1))}
    with pytest.raises(ValueError, match=r"has continuous actions; population members act on discrete ones only"):
        worker.collect(RolloutRequest(shared_population("agents"), uniform, episodes=2))
    from marl_core.empirical_game.game import psro_game

    with pytest.raises(ValueError, match=r"^game 'vmas:.*' has continuous actions; populations \(PSRO, leagues\)"):
        psro_game(CONTINUOUS_NAVIGATION)
