"""Two-player Pong from pixels: ROMs from ale-py's wheel, the preprocessing checked on hand-made
frames and against SuperSuit's wrappers on real ones, and the convolutional actor-critic."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from marl_core.envs import make_env
from marl_core.envs.atari import AtariEnv, AtariSettings, rom_directory

AGENTS = ("first_0", "second_0")


def test_pong_runs_from_the_rom_that_ale_py_ships_with_no_download():
    assert (rom_directory() / "roms" / "pong.bin").is_file()
    env = make_env("atari:pong_v3")
    assert env.spec.agents == AGENTS and env.spec.simultaneous
    assert env.spec.observation_size == dict.fromkeys(AGENTS, 6 * 84 * 84) and env.spec.num_actions == dict.fromkeys(
        AGENTS, 6
    )
    step = env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        step = env.step({a: int(rng.integers(6)) for a in step.acting})
    assert step.acting == AGENTS and all(o.dtype == np.uint8 and o.max() == 255 for o in step.observations.values())
    assert env.state().shape == (env.spec.state_size,) == (4 * 84 * 84,)
    raw = make_env("pettingzoo:atari.pong_v3")  # PettingZoo's own screen, through the same ROM directory
    assert raw.reset(seed=0).observations["first_0"].shape == (210 * 160 * 3,)


class ScriptedEmulator:
    """A stand-in for PettingZoo's ParallelAtariEnv that plays back hand-made frames: each
    emulator frame is a constant grayscale image [210, 160, 1] with the given rewards."""

    def __init__(self, script: list[tuple[int, dict, bool, bool]], first: int):
        self.possible_agents, self.agents = list(AGENTS), []
        self.script, self.first = list(script), first

    def action_space(self, agent):
        return spaces.Discrete(6)

    def reset(self, seed=None):
        self.agents = list(AGENTS)
        return dict.fromkeys(AGENTS, np.full((210, 160, 1), self.first, np.uint8)), {a: {} for a in AGENTS}

    def step(self, actions):
        value, rewards, terminated, truncated = self.script.pop(0)
        observations = dict.fromkeys(self.agents, np.full((210, 160, 1), value, np.uint8))
        rewards = {a: float(rewards.get(a, 0)) for a in self.agents}
        terminations = dict.fromkeys(self.agents, terminated)
        truncations = dict.fromkeys(self.agents, truncated)
        if terminated or truncated:
            self.agents = []
        return observations, rewards, terminations, truncations, {a: {} for a in observations}

    def close(self):
        pass


def frames(observation: np.ndarray) -> np.ndarray:
    """The [channels] value of a constant-per-channel observation, checking it is constant."""
    planes = observation.reshape(6, 84, 84)
    assert all(len(np.unique(plane)) == 1 for plane in planes)
    return planes[:, 0, 0]


def test_preprocessing_of_a_hand_made_frame_sequence():
    point = {"first_0": 1, "second_0": -1}
    script = [
        (10, {}, False, False),
        (50, point, False, False),
        (30, {"second_0": -1}, False, False),
        (20, {}, False, False),
        (60, {}, False, False),
        (70, {}, False, False),
        (40, {}, False, False),
        (90, {}, False, False),
        (80, point, True, False),
        (0, {}, False, False),  # the game ends in the second frame of the third step
    ]
    env = AtariEnv(settings=AtariSettings(), emulator=ScriptedEmulator(script, first=5))
    step = env.reset(seed=0)
    np.testing.assert_array_equal(frames(step.observations["first_0"]), [0, 0, 0, 5, 255, 0])
    np.testing.assert_array_equal(frames(step.observations["second_0"]), [0, 0, 0, 5, 0, 255])

    step = env.step({"first_0": 0, "second_0": 0})
    # frames 10, 50, 30, 20: the maximum of the last two (30), not of all four (50)
    np.testing.assert_array_equal(frames(step.observations["first_0"]), [0, 0, 5, 30, 255, 0])
    # second_0 lost a point and a serve: -2, clipped to -1; the infos keep the two apart
    assert step.rewards == {"first_0": 1.0, "second_0": -1.0}
    assert step.infos["first_0"] == {"points": 1.0, "serve_penalty": 0.0}
    assert step.infos["second_0"] == {"points": -1.0, "serve_penalty": -1.0}

    step = env.step({"first_0": 1, "second_0": 2})
    np.testing.assert_array_equal(frames(step.observations["second_0"]), [0, 5, 30, 90, 0, 255])

    step = env.step({"first_0": 1, "second_0": 2})  # frames 80 (game over): one frame, no pooling partner
    assert step.done and step.terminations == dict.fromkeys(AGENTS, True)
    assert step.rewards == {"first_0": 1.0, "second_0": -1.0}
    np.testing.assert_array_equal(env.state().reshape(4, 84, 84)[:, 0, 0], [5, 30, 90, 80])
    assert env.env.script == [(0, {}, False, False)]  # stopped at the frame that ended the game


def test_a_game_cut_by_max_cycles_hands_its_final_observation_for_bootstrapping():
    env = AtariEnv(emulator=ScriptedEmulator([(7, {}, False, False), (9, {}, False, True)], first=1))
    env.reset()
    step = env.step({"first_0": 0, "second_0": 0})
    assert step.done and not any(step.terminations.values()) and all(step.truncations.values())
    np.testing.assert_array_equal(frames(step.infos["second_0"]["final_observation"]), [0, 0, 1, 9, 0, 255])


def test_preprocessing_matches_supersuits_wrappers_frame_for_frame():
    """The same game, seed and actions through SuperSuit's chain of wrappers (channels last) and
    through the adapter (channels first), bilinear resizing on both sides. SuperSuit's resize
    truncates to whole gray levels where the adapter rounds, so pixels may differ by one level;
    the indicator channels, the stacking order and the pooling must agree exactly."""
    import supersuit as ss

    from marl_core.envs.atari import _parallel_game

    game = _parallel_game("pong_v3", obs_type="grayscale_image")
    wrapped = ss.frame_skip_v0(ss.max_observation_v0(game, 2), 4)
    wrapped = ss.clip_reward_v0(wrapped, lower_bound=-1, upper_bound=1)
    wrapped = ss.resize_v1(wrapped, x_size=84, y_size=84, linear_interp=True)
    wrapped = ss.agent_indicator_v0(ss.frame_stack_v1(wrapped, 4), type_only=False)
    ours = AtariEnv(settings=AtariSettings(interpolation="bilinear"))

    theirs, _ = wrapped.reset(seed=3)
    step = ours.reset(seed=3)
    rng = np.random.default_rng(0)
    compared = rewarded = moved = 0
    for _ in range(400):
        for agent in AGENTS:
            expected = np.transpose(theirs[agent], (2, 0, 1)).astype(np.float32)
            observed = step.observations[agent].reshape(6, 84, 84)
            np.testing.assert_array_equal(observed[4:], expected[4:])
            assert np.abs(observed[:4] - expected[:4]).max() <= 1
            moved += int(np.abs(observed[:4] - expected[:4]).mean() < 0.5 and observed[3].std() > 0)
            compared += 1
        actions = {a: int(rng.integers(6)) for a in AGENTS}
        theirs, their_rewards, *_ = wrapped.step(actions)
        step = ours.step(actions)
        assert step.rewards == {a: float(r) for a, r in their_rewards.items()}
        rewarded += any(step.rewards.values())
    assert compared == 800 and rewarded > 0  # points were scored on the way
    assert moved == compared  # nearly every pixel equal, in frames that are not blank


def test_the_nature_cnn_actor_critic_acts_learns_and_round_trips_its_weights(tmp_path):
    from marl_core.policies.neural import NeuralPolicy
    from marl_core.policies.storage import load_policy, save_policy
    from marl_core.rl.ppo import ActorCriticPolicy, PPOTrainer
    from marl_core.rl.settings import PPOConfig

    config = PPOConfig(encoder="nature_cnn", hidden=(32,), minibatch_size=8, epochs=1)
    trainer = PPOTrainer(6 * 84 * 84, 6, config)
    policy = trainer.policy
    assert isinstance(policy, ActorCriticPolicy) and policy.actor[0] is policy.critic[0]  # one trunk
    obs = np.random.default_rng(0).integers(0, 256, (5, 6 * 84 * 84)).astype(np.float32)
    mask = np.ones((5, 6), bool)
    actions, extras = policy.act(obs, mask, True, np.random.default_rng(1))
    assert actions.shape == (5,) and set(extras) == {"logp", "value"}
    logits, value = policy.logits_and_value(torch.from_numpy(obs), torch.from_numpy(mask))
    torch.testing.assert_close(logits, policy.logits(torch.from_numpy(obs), torch.from_numpy(mask)))
    torch.testing.assert_close(value, policy.value(torch.from_numpy(obs)))

    save_policy(tmp_path / "member", NeuralPolicy.of("ppo", config, policy))
    loaded = load_policy(tmp_path / "member")  # weights only (torch.load(weights_only=True))
    np.testing.assert_array_equal(loaded.network.action_probs(obs, mask), policy.action_probs(obs, mask))

    with pytest.raises(ValueError, match="observation size 100 is not a multiple of 7056"):
        PPOTrainer(100, 6, config)


def test_self_play_on_pong_ships_frames_as_bytes_and_learns_from_them_as_floats():
    """One round of the README's Pong config, small: the fragment's observations stay uint8 on
    the way to the learner (a quarter of the bytes), the learner's update runs on them."""
    import yaml

    from marl_core.marl.config import MARLConfig, check, layout_and_spec, make_learner, pool_config
    from marl_core.marl.learner_handles import LocalLearner
    from marl_core.marl.steps import collect_rollouts
    from marl_core.rollout.pool import WorkerPool

    settings = yaml.safe_load(open("configs/marl/pong/ippo.yaml"))
    settings["settings"]["ppo"].update(hidden=[16], minibatch_size=8, epochs=1)
    config = MARLConfig(**{**settings, "workers": 1, "envs_per_worker": 2, "steps_per_round": 6})
    check(config)
    layout, spec = layout_and_spec(config)
    learner = LocalLearner(make_learner(config, layout, spec.state_size))
    batch = collect_rollouts(config, WorkerPool(pool_config(config)), learner, 0).batch
    assert all(batch.obs[a].dtype == np.uint8 and batch.obs[a].shape == (6, 2, 6 * 84 * 84) for a in AGENTS)
    assert batch.state.shape == (6, 2, 0)  # an independent learner: no global state shipped
    before = {k: v.clone() for k, v in learner.learner.policies["pong"].state_dict().items()}
    metrics = learner.learn(batch)
    assert np.isfinite(metrics["pong/loss"])
    after = learner.learner.policies["pong"].state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
