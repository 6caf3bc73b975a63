"""The MARL training scenario in this process: every registered algorithm trains and resumes
exactly, parameter sharing shares, greedy evaluation counts the episodes it is asked for, and
bad settings fail in one line before anything starts."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from joint_rollouts import JointRollouts
from typer.testing import CliRunner

from flows.cli import app as cli
from marl_core.marl import MARL_ALGORITHMS
from marl_core.marl.config import MARLConfig, make_learner
from marl_core.marl.rounds import iterate_marl_local

SPREAD = "pettingzoo:mpe2.simple_spread_v3"

torch.set_num_threads(1)


# Settings small enough that each learner takes gradient steps (and copies into or averages
# into its target networks, where it has them) on one SEGMENT of 2 copies: past a replay
# learner's learning_starts, batch sizes below what one segment holds. An algorithm missing here
# trains with its defaults; the restore test then fails if that takes no gradient step.
SMALL_SETTINGS = {
    "ippo": {"ppo": {"hidden": (16,), "minibatch_size": 32, "epochs": 2}},
    "a2c": {"a2c": {"hidden": (16,)}},
    "mappo": {"hidden": (16,), "critic_hidden": (16,), "minibatch_size": 32, "epochs": 2},
    # per segment: 96 agent transitions, 16 gradient steps, a target copy every 3
    "iql": {
        "dqn": {
            "hidden": (16,),
            "batch_size": 16,
            "buffer_size": 512,
            "learning_starts": 32,
            "train_every": 4,
            "target_update_interval": 3,
        }
    },
    # per segment: 32 joint steps, 12 gradient steps, a target copy every 5
    "vdn": {
        "hidden": (16,),
        "batch_size": 16,
        "buffer_size": 512,
        "learning_starts": 8,
        "train_every": 2,
        "target_update_interval": 5,
    },
    "qmix": {
        "hidden": (16,),
        "batch_size": 16,
        "buffer_size": 512,
        "learning_starts": 8,
        "train_every": 2,
        "target_update_interval": 5,
        "mixing_embed": 8,
        "hypernet_hidden": 16,
    },
    # per segment: 32 joint steps, 6 updates, each averaging into the targets
    "maddpg": {
        "hidden": (16,),
        "critic_hidden": (16,),
        "batch_size": 16,
        "buffer_size": 512,
        "learning_starts": 8,
        "train_every": 4,
    },
}
SEGMENT = 16  # joint steps per environment copy


def _segment(workers: JointRollouts, policies, steps: int):
    """A JointExperience of the next `steps` joint steps of every copy."""
    batch, _, _ = workers.collect(policies, steps)
    return batch


def _networks_and_optimizers(learner) -> dict[str, torch.nn.Module | torch.optim.Optimizer]:
    """Every network and optimizer the learner holds, by attribute path ("trainers.agent.target").

    Found by walking the learner's attributes, not its state_dict, so that one its state_dict
    leaves out is compared too."""
    found, seen = {}, set()

    def walk(value, path: str) -> None:
        if isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
            found[path] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}")
        elif type(value).__module__.startswith("marl_core.") and hasattr(value, "__dict__") and id(value) not in seen:
            seen.add(id(value))
            for key, item in vars(value).items():
                walk(item, f"{path}.{key}" if path else key)

    walk(learner, "")
    return found


def _assert_same(a, b, where: str) -> None:
    """Nested dicts and lists of tensors and plain values, equal exactly."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    else:
        assert a == b, f"{where} differs: {a!r} != {b!r}"


@pytest.mark.parametrize("algorithm", sorted(MARL_ALGORITHMS))
def test_a_learner_restored_after_gradient_steps_makes_exactly_the_same_next_update(algorithm):
    config = MARLConfig(env=SPREAD, algorithm=algorithm, envs_per_worker=2, settings=SMALL_SETTINGS.get(algorithm, {}))
    workers = JointRollouts.of(config)
    original = make_learner(config, workers.layout, workers.spec.state_size)
    original.learn(_segment(workers, original.policies, SEGMENT))
    saved = io.BytesIO()
    torch.save(original.state_dict(), saved)
    saved.seek(0)
    restored = make_learner(config, workers.layout, workers.spec.state_size)

    # Before it was saved, every network (target networks included) and every optimizer moved
    # away from where a fresh learner starts: else a restore that lost one would go unnoticed.
    held, fresh = _networks_and_optimizers(original), _networks_and_optimizers(restored)
    assert held.keys() == fresh.keys()
    assert any(isinstance(thing, torch.optim.Optimizer) for thing in held.values()), f"{algorithm}: no optimizer found"
    for path, thing in held.items():
        if isinstance(thing, torch.optim.Optimizer):
            assert thing.state_dict()["state"], f"{algorithm}: {path} took no step before the learner was saved"
        elif any(True for _ in thing.parameters()):  # (VDN's mixer has no weights)
            moved = [not torch.equal(w, w_fresh) for w, w_fresh in zip(thing.parameters(), fresh[path].parameters())]
            assert any(moved), f"{algorithm}: {path} never moved before the learner was saved"

    restored.load_state_dict(torch.load(saved, weights_only=True))
    second = _segment(workers, original.policies, SEGMENT)
    assert original.learn(second) == restored.learn(second)
    restored_held = _networks_and_optimizers(restored)
    for path, thing in held.items():
        _assert_same(thing.state_dict(), restored_held[path].state_dict(), f"{algorithm}: {path}")
    _assert_same(original.state_dict(), restored.state_dict(), f"{algorithm}: state_dict")  # buffers, RNGs, counters


def test_agents_of_a_role_share_one_network_by_default_and_their_own_when_mapped_apart():
    shared = MARLConfig(env=SPREAD, algorithm="ippo", envs_per_worker=2)
    workers = JointRollouts.of(shared)
    learner = make_learner(shared, workers.layout, workers.spec.state_size)
    assert list(learner.policies) == ["agent"]
    weight = next(learner.policies["agent"].parameters())
    before = weight.detach().clone()
    learner.learn(_segment(workers, learner.policies, 32))
    assert not torch.equal(before, weight.detach())  # the one tensor every agent acts with moved

    apart = shared.model_copy(update={"policies": {"agent_0": "a", "agent_1": "b", "agent_2": "c"}})
    workers = JointRollouts.of(apart)
    assert workers.layout.groups == {"a": ("agent_0",), "b": ("agent_1",), "c": ("agent_2",)}
    assert workers.layout.obs_size == {"a": 18, "b": 18, "c": 18}  # alone: no agent one-hot


def test_greedy_evaluation_plays_the_episodes_asked_for_and_repeats_with_its_seed():
    from marl_core.marl.config import layout_and_spec, pool_config
    from marl_core.marl.learner_handles import LocalLearner
    from marl_core.marl.steps import evaluate_policies
    from marl_core.rollout.pool import WorkerPool

    config = MARLConfig(
        env="pettingzoo:marl_core.envs.two_step",
        algorithm="ippo",
        policies={"agent_0": "a", "agent_1": "b"},
        workers=2,
        envs_per_worker=3,
        eval_episodes=7,
    )
    layout, spec = layout_and_spec(config)
    learner = LocalLearner(make_learner(config, layout, spec.state_size))
    greedy = evaluate_policies(config, WorkerPool(pool_config(config)), learner, round=0).returns
    assert greedy.shape == (7, 2)
    again = evaluate_policies(config, WorkerPool(pool_config(config)), learner, round=0).returns
    np.testing.assert_array_equal(greedy, again)  # fresh workers, the same seed: the same episodes
    assert len(set(greedy[:, 0])) == 1  # a deterministic policy on a deterministic game: one outcome


def test_the_local_loop_reports_returns_per_agent_and_policy_and_counts_steps():
    config = MARLConfig(
        env=SPREAD, algorithm="ippo", rounds=2, eval_every=2, eval_episodes=4, envs_per_worker=2, steps_per_round=50
    )
    records = [record for record, _ in iterate_marl_local(config)]
    assert [r.env_steps for r in records] == [100, 200]
    assert records[0].eval_returns is None and set(records[1].eval_returns) == {
        "agent_0",
        "agent_1",
        "agent_2",
        "policy/agent",
    }
    agents = [records[1].eval_returns[a] for a in ("agent_0", "agent_1", "agent_2")]
    assert records[1].eval_returns["policy/agent"] == pytest.approx(np.mean(agents))
    assert set(records[0].train_returns) == {"agent_0", "agent_1", "agent_2", "policy/agent"}  # 4 episodes ended


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--env", SPREAD, "--algorithm", "nosuch"],
            "error: algorithm='nosuch': unknown MARL algorithm; choose one of:",
        ),
        (
            ["--env", "pettingzoo:classic.connect_four_v3", "--algorithm", "ippo"],
            "is turn-based; MARL training needs a simultaneous environment",
        ),
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


def test_evaluation_against_uniform_play_matches_the_two_step_games_expected_returns():
    """Each agent alone, greedy, against a uniformly random partner: the expected return follows
    from its greedy actions by hand (two-step game: 2A pays 7, 2B pays [[0, 1], [1, 8]])."""
    from marl_core.envs.two_step import PAYOFF_2B
    from marl_core.marl.config import check, layout_and_spec, pool_config
    from marl_core.marl.learner_handles import LocalLearner
    from marl_core.marl.steps import evaluate_policies
    from marl_core.rollout.pool import WorkerPool

    config = MARLConfig(
        env="pettingzoo:marl_core.envs.two_step",
        algorithm="ippo",
        policies={"agent_0": "a", "agent_1": "b"},
        envs_per_worker=4,
        eval_episodes=400,
        eval_versus_uniform=True,
        seed=3,
    )
    check(config)
    layout, spec = layout_and_spec(config)
    learner = make_learner(config, layout, spec.state_size)
    evaluation = evaluate_policies(config, WorkerPool(pool_config(config)), LocalLearner(learner), round=0)
    assert evaluation.returns.shape == evaluation.versus_uniform.shape == (400, 2)

    def greedy(policy: str, state: int) -> int:
        obs = np.eye(3, dtype=np.float32)[[state]]
        return int(learner.policies[policy].act(obs, np.ones((1, 2), bool), False, np.random.default_rng(0))[0][0])

    a_first, a_in_2b, b_in_2b = greedy("a", 0), greedy("a", 2), greedy("b", 2)
    expected_a = 7.0 if a_first == 0 else PAYOFF_2B[a_in_2b].mean()  # agent_1 uniform
    expected_b = 0.5 * 7.0 + 0.5 * PAYOFF_2B[:, b_in_2b].mean()  # agent_0 uniform: 2A or 2B half the time each
    played = evaluation.versus_uniform
    for column, expected in ((0, expected_a), (1, expected_b)):
        stderr = played[:, column].std(ddof=1) / np.sqrt(len(played)) + 1e-9
        assert abs(played[:, column].mean() - expected) < 4 * stderr + 1e-9, (
            column,
            played[:, column].mean(),
            expected,
        )
    assert not np.array_equal(played, evaluation.returns)  # uniform partners, not the learners themselves


def test_evaluation_against_uniform_play_where_agents_differ_in_shape():
    """simple_adversary: the adversary sees 8 numbers, the good agents 10; each uniform player
    gets a role of its own, since a role is one policy of one shape."""
    from marl_core.marl.config import layout_and_spec, pool_config
    from marl_core.marl.learner_handles import LocalLearner
    from marl_core.marl.steps import evaluate_policies
    from marl_core.rollout.pool import WorkerPool

    config = MARLConfig(
        env="pettingzoo:mpe2.simple_adversary_v3",
        algorithm="ippo",
        agent_ids=False,
        envs_per_worker=2,
        eval_episodes=4,
        eval_versus_uniform=True,
    )
    layout, spec = layout_and_spec(config)
    learner = make_learner(config, layout, spec.state_size)
    pool = WorkerPool(pool_config(config))
    try:
        evaluation = evaluate_policies(config, pool, LocalLearner(learner), round=0)
    finally:
        pool.close()
    assert evaluation.versus_uniform.shape == (4, 3) and np.isfinite(evaluation.versus_uniform).all()


def test_evaluation_against_uniform_play_is_refused_where_a_shared_policy_sees_agent_ids():
    from marl_core.marl.config import check

    config = MARLConfig(env="pettingzoo:marl_core.envs.two_step", algorithm="ippo", eval_versus_uniform=True)
    with pytest.raises(ValueError, match="eval_versus_uniform=True with agent_ids=True"):
        check(config)
