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
from marl_core.marl.collector import JointCollector
from marl_core.marl.settings import IPPOConfig
from marl_core.marl.training import MARLConfig, Workers, iterate_marl_local, make_learner

SPREAD = "pettingzoo:mpe2.simple_spread_v3"

torch.set_num_threads(1)


@pytest.mark.parametrize("algorithm", sorted(MARL_ALGORITHMS))
def test_a_restored_learner_makes_exactly_the_same_next_update(algorithm):
    config = MARLConfig(env=SPREAD, algorithm=algorithm, envs_per_worker=2, steps_per_round=40)
    workers = Workers(config)
    original = make_learner(config, workers.layout, workers.spec.state_size)
    first, _, _ = workers.collectors[0].collect(original.policies, 40)
    original.learn(first)
    saved = io.BytesIO()
    torch.save(original.state_dict(), saved)
    saved.seek(0)
    restored = make_learner(config, workers.layout, workers.spec.state_size)
    restored.load_state_dict(torch.load(saved, weights_only=True))

    second, _, _ = workers.collectors[0].collect(original.policies, 40)
    assert original.learn(second) == restored.learn(second)
    for policy in original.policies:
        for (name, a), b in zip(original.policies[policy].state_dict().items(), restored.policies[policy].state_dict().values()):
            assert torch.equal(a, b), f"{algorithm}: {policy}.{name} differs after the same update"


def test_agents_of_a_role_share_one_network_by_default_and_their_own_when_mapped_apart():
    shared = MARLConfig(env=SPREAD, algorithm="ippo", envs_per_worker=2)
    workers = Workers(shared)
    learner = make_learner(shared, workers.layout, workers.spec.state_size)
    assert list(learner.policies) == ["agent"]
    weight = next(learner.policies["agent"].parameters())
    before = weight.detach().clone()
    batch, _, _ = workers.collectors[0].collect(learner.policies, 32)
    learner.learn(batch)
    assert not torch.equal(before, weight.detach())  # the one tensor every agent acts with moved

    apart = shared.model_copy(update={"policies": {"agent_0": "a", "agent_1": "b", "agent_2": "c"}})
    workers = Workers(apart)
    assert workers.layout.groups == {"a": ("agent_0",), "b": ("agent_1",), "c": ("agent_2",)}
    assert workers.layout.obs_size == {"a": 18, "b": 18, "c": 18}  # alone: no agent one-hot


def test_greedy_evaluation_plays_the_episodes_asked_for_and_repeats_with_its_seed():
    collector = JointCollector("pettingzoo:marl_core.envs.two_step", 3, from_dict({"agent_0": "a", "agent_1": "b"}))
    config = IPPOConfig()
    from marl_core.rl.ppo import ActorCriticPolicy

    policies = {p: ActorCriticPolicy(3, 2, config.ppo) for p in ("a", "b")}
    explored = collector.play_episodes(policies, 7, seed=11, explore=True)
    assert explored.shape == (7, 2)
    np.testing.assert_array_equal(explored, collector.play_episodes(policies, 7, seed=11, explore=True))
    greedy = collector.play_episodes(policies, 5, seed=0)
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
