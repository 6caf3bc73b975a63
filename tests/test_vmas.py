"""VMAS scenarios through the one rollout engine: named like every environment, stepped in one
batched call per joint step for fragments, and recording exactly what VMAS returned (checked by
replaying the fragment's actions on VMAS itself)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import vmas

from marl_core.envs import make_batched_env, make_env, shared_population
from marl_core.envs.vmas_env import VmasBatchedEnv
from marl_core.policies.base import UniformPolicy
from marl_core.rollout.worker import Fragment, PolicyMixture, RolloutRequest, RolloutWorker

NAVIGATION = "vmas:navigation(n_agents=3,shared_rew=False,max_steps=7)"  # a reward of its own per agent


@pytest.fixture
def calls(monkeypatch) -> list:
    """One entry per call of a VMAS batch's `step`."""
    made = []
    step = VmasBatchedEnv.step
    monkeypatch.setattr(VmasBatchedEnv, "step", lambda self, actions: made.append(1) or step(self, actions))
    return made


def test_a_vmas_name_takes_the_scenarios_arguments_and_bad_names_fail_in_one_line():
    env = make_env("vmas:navigation(n_agents=2,max_steps=5)")
    assert env.spec.agents == ("agent_0", "agent_1") and env.spec.simultaneous
    step = env.reset(seed=3)
    for _ in range(5):
        assert step.acting == env.spec.agents
        step = env.step({a: 0 for a in step.acting})
    assert step.done and all(step.truncations.values()) and not any(step.terminations.values())
    assert set(step.infos["agent_0"]) == {"final_observation"}
    for name, message in [
        ("vmas:no_such_scenario", "VMAS has no scenario 'no_such_scenario'; its scenarios: ["),
        ("vmas:navigation(n_agents)", "argument 'n_agents' is not key=<Python literal>"),
        ("vmas:navigation(n_agents=two)", "argument 'n_agents=two' is not key=<Python literal>"),
    ]:
        with pytest.raises(
            ValueError, match=r"^environment 'vmas:[^\n]*" + message.replace("(", r"\(").replace("[", r"\[")
        ):
            make_env(name)
    assert make_batched_env("pettingzoo:mpe2.simple_spread_v3", 4) is None  # its copies step one by one


def test_a_fragment_steps_all_copies_in_one_call_and_records_what_vmas_returns(calls):
    copies, steps = 4, 10
    worker = RolloutWorker(NAVIGATION, envs_per_worker=copies)
    request = RolloutRequest(
        shared_population("agents"),
        {"agents": PolicyMixture([UniformPolicy()], np.ones(1))},
        fragment=Fragment("train", 0, steps),
        seed=(11,),
    )
    result = worker.collect(request)
    joint = result.joint
    assert len(calls) == steps and result.env_steps == steps * copies

    # every copy's episode ends after max_steps=7, truncated, and the next one starts
    assert result.episode_lengths.tolist() == [7] * copies and result.episode_returns.shape == (copies, 3)
    assert joint.truncated[6].all() and not joint.truncated[[0, 1, 2, 3, 4, 5, 7, 8, 9]].any()
    assert not joint.terminated.any()

    # VMAS itself, reset with the fragment's seed and given the same actions, returns the same
    seed = int(np.random.default_rng((11,)).integers(2**31))
    raw = vmas.make_env(
        "navigation",
        num_envs=copies,
        device="cpu",
        continuous_actions=False,
        max_steps=7,
        terminated_truncated=True,
        n_agents=3,
        shared_rew=False,
    )
    observations = raw.reset(seed=seed)
    agents = joint.agents
    for t in range(steps):
        for i, a in enumerate(agents):
            np.testing.assert_allclose(joint.obs[a][t], observations[i].numpy(), err_msg=f"t={t}")
        observations, rewards, terminated, truncated, _ = raw.step(
            [torch.as_tensor(joint.action[a][t]) for a in agents]
        )
        for i, a in enumerate(agents):
            np.testing.assert_allclose(joint.reward[a][t], rewards[i].numpy(), rtol=1e-6, err_msg=f"t={t}")
        ended = terminated | truncated
        if ended.all():  # every copy ran out at once: one batched reset
            observations = raw.reset()
        elif ended.any():
            for e in torch.nonzero(ended).flatten().tolist():
                observations = raw.reset_at(e)
    np.testing.assert_allclose(result.episode_returns.sum(), sum(joint.reward[a][:7].sum() for a in agents), rtol=1e-6)

    # the next fragment goes on where this one stopped (mid-episode), in the same copies
    after = worker.collect(RolloutRequest(**{**request.__dict__, "fragment": Fragment("train", 1, 4), "seed": (11, 1)}))
    assert len(calls) == steps + 4 and after.joint.truncated[3].all()  # steps 8-10 before, 11-14 here: 14 = 2 x 7


@pytest.mark.parametrize("algorithm", ["mappo", "ippo", "qmix"])
def test_marl_learners_train_on_a_vmas_scenario_and_evaluate_on_its_single_copies(algorithm):
    from marl_core.marl.config import MARLConfig
    from marl_core.marl.rounds import iterate_marl_local

    config = MARLConfig(
        env="vmas:navigation(n_agents=2,max_steps=20)",
        algorithm=algorithm,
        rounds=2,
        steps_per_round=20,
        workers=1,
        envs_per_worker=4,
        eval_every=1,
        eval_episodes=2,
        seed=1,
    )
    records = [record for record, _ in iterate_marl_local(config)]
    assert [r.env_steps for r in records] == [80, 160]
    for record in records:  # four copies of 20-step episodes: each fragment ends four episodes
        assert np.isfinite(record.metrics["train_return/policy/agent"])
        assert np.isfinite(record.metrics["eval_return/policy/agent"])


def test_whole_episodes_play_as_one_wave_every_copy_stepped_in_one_call(calls):
    worker = RolloutWorker(NAVIGATION, envs_per_worker=4)
    uniform = {"agents": PolicyMixture([UniformPolicy()], np.ones(1))}
    result = worker.collect(RolloutRequest(shared_population("agents"), uniform, episodes=5, seed=(4,)))
    # more episodes than the worker's 4 copies: a batch of 5, one episode each, 7 joint steps in 7 calls
    assert len(calls) == 7 and result.env_steps == 5 * 7
    assert result.episode_lengths.tolist() == [7] * 5 and np.isfinite(result.episode_returns).all()
    again = worker.collect(RolloutRequest(shared_population("agents"), uniform, episodes=5, seed=(4,)))
    np.testing.assert_array_equal(again.episode_returns, result.episode_returns)  # seeded: the same episodes
    fewer = worker.collect(RolloutRequest(shared_population("agents"), uniform, episodes=3, seed=(4,)))
    assert len(calls) == 21 and fewer.episode_lengths.tolist() == [7] * 3  # on the worker's own copies
    worker.close()


def test_psro_plays_a_competitive_vmas_scenario_with_sampled_payoffs():
    """VMAS's tag (one chaser, one runner): PSRO with learned responses, every payoff sampled
    with its standard error. The chaser is only ever rewarded for a tag, the runner only ever
    punished (for being tagged, or for leaving the arena): their payoffs have opposite signs."""
    from marl_core.psro.config import build_config
    from marl_core.psro.steps import iterate_psro_local

    config = build_config(
        dict(
            game="vmas:simple_tag(max_steps=10,num_good_agents=1,num_adversaries=1,num_landmarks=0)",
            roles={"adversary_": "adversary", "agent_": "agent"},
            oracle="ppo",
            iterations=1,
            episodes=8,
            best_response={"episodes": 16, "episodes_per_round": 16},
            approx_exploitability={"every": 1, "episodes": 16, "eval_episodes": 8},
            seed=2,
        )
    )
    (_, first), (record, last) = list(iterate_psro_local(config))
    assert [p.role for p in last.populations] == ["adversary", "agent"]
    assert [len(p) for p in first.populations] == [1, 1] and [len(p) for p in last.populations] == [2, 2]
    payoffs = last.payoffs
    assert payoffs.mean.shape == payoffs.stderr.shape == (2, 2, 2) and (payoffs.episodes == 8).all()
    assert (payoffs.mean[0] >= 0).all() and (payoffs.mean[1] <= 0).all()
    assert record.report is None and record.approx is not None  # no game tree: approximate only
