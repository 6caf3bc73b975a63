"""The MARL training scenario in this process: every registered algorithm trains and resumes
exactly, parameter sharing shares, greedy evaluation counts the episodes it is asked for, and
bad settings fail in one line before anything starts."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from flows import cli
from marl_core.envs import from_dict
from marl_core.marl import MARL_ALGORITHMS
from marl_core.marl.settings import SETTINGS
from marl_core.marl.training import MARLConfig, iterate_marl_local, make_learner
from joint_rollouts import JointRollouts

SPREAD = "pettingzoo:mpe2.simple_spread_v3"

torch.set_num_threads(1)


def test_every_algorithm_has_its_settings():
    assert set(SETTINGS) == set(MARL_ALGORITHMS)
    for name in MARL_ALGORITHMS:
        assert MARL_ALGORITHMS[name].config is SETTINGS[name]


@pytest.mark.parametrize("algorithm", sorted(MARL_ALGORITHMS))
def test_a_restored_learner_makes_exactly_the_same_next_update(algorithm):
    config = MARLConfig(env=SPREAD, algorithm=algorithm, envs_per_worker=2, steps_per_round=40)
    workers = JointRollouts.of(config)
    original = make_learner(config, workers.layout, workers.spec.state_size)
    first, _, _ = workers.collect(original.policies, 40)
    original.learn(first)
    saved = io.BytesIO()
    torch.save(original.state_dict(), saved)
    saved.seek(0)
    restored = make_learner(config, workers.layout, workers.spec.state_size)
    restored.load_state_dict(torch.load(saved, weights_only=True))

    second, _, _ = workers.collect(original.policies, 40)
    assert original.learn(second) == restored.learn(second)
    for policy in original.policies:
        for (name, a), b in zip(original.policies[policy].state_dict().items(), restored.policies[policy].state_dict().values()):
            assert torch.equal(a, b), f"{algorithm}: {policy}.{name} differs after the same update"


def test_agents_of_a_role_share_one_network_by_default_and_their_own_when_mapped_apart():
    shared = MARLConfig(env=SPREAD, algorithm="ippo", envs_per_worker=2)
    workers = JointRollouts.of(shared)
    learner = make_learner(shared, workers.layout, workers.spec.state_size)
    assert list(learner.policies) == ["agent"]
    weight = next(learner.policies["agent"].parameters())
    before = weight.detach().clone()
    batch, _, _ = workers.collect(learner.policies, 32)
    learner.learn(batch)
    assert not torch.equal(before, weight.detach())  # the one tensor every agent acts with moved

    apart = shared.model_copy(update={"policies": {"agent_0": "a", "agent_1": "b", "agent_2": "c"}})
    workers = JointRollouts.of(apart)
    assert workers.layout.groups == {"a": ("agent_0",), "b": ("agent_1",), "c": ("agent_2",)}
    assert workers.layout.obs_size == {"a": 18, "b": 18, "c": 18}  # alone: no agent one-hot


def test_greedy_evaluation_plays_the_episodes_asked_for_and_repeats_with_its_seed():
    from marl_core.marl import training
    from marl_core.rollout.pool import LocalWorkerPool

    config = MARLConfig(
        env="pettingzoo:marl_core.envs.two_step", algorithm="ippo", policies={"agent_0": "a", "agent_1": "b"},
        workers=2, envs_per_worker=3, eval_episodes=7,
    )
    layout, spec = training.layout_and_spec(config)
    learner = training.LocalLearner(make_learner(config, layout, spec.state_size))
    greedy = training.evaluate_policies(config, LocalWorkerPool(training.pool_config(config)), learner, round=0)
    assert greedy.shape == (7, 2)
    again = training.evaluate_policies(config, LocalWorkerPool(training.pool_config(config)), learner, round=0)
    np.testing.assert_array_equal(greedy, again)  # fresh workers, the same seed: the same episodes
    assert len(set(greedy[:, 0])) == 1  # a deterministic policy on a deterministic game: one outcome


def test_the_local_loop_reports_returns_per_agent_and_policy_and_counts_steps():
    config = MARLConfig(env=SPREAD, algorithm="ippo", rounds=2, eval_every=2, eval_episodes=4, envs_per_worker=2, steps_per_round=50)
    records = [record for record, _ in iterate_marl_local(config)]
    assert [r.env_steps for r in records] == [100, 200]
    assert records[0].eval_returns is None and set(records[1].eval_returns) == {"agent_0", "agent_1", "agent_2", "policy/agent"}
    agents = [records[1].eval_returns[a] for a in ("agent_0", "agent_1", "agent_2")]
    assert records[1].eval_returns["policy/agent"] == pytest.approx(np.mean(agents))
    assert set(records[0].train_returns) == {"agent_0", "agent_1", "agent_2", "policy/agent"}  # 4 episodes ended


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--env", SPREAD, "--algorithm", "nosuch"], "error: algorithm='nosuch': unknown MARL algorithm; choose one of:"),
        (["--env", "pettingzoo:classic.connect_four_v3", "--algorithm", "ippo"], "is turn-based; MARL training needs a simultaneous environment"),
        (["--env", SPREAD, "--algorithm", "ippo", "--rounds", "0"], "error: rounds=0: Input should be greater than 0"),
        (["--algorithm", "ippo"], "error: no environment: pass --env or set env in --config"),
    ],
)
def test_bad_settings_fail_in_one_line_before_anything_starts(flags, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["marl", "run", *flags])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # no store, no server home: nothing started
