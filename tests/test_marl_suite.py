"""benchmarks/marl_suite.py: its smoke run (`--quick`) end to end, and how it builds a pair's run.

The suite's figures are learning results over minutes to hours (docs/marl.md); here it runs one
short round a pair, to check that every piece a full run needs works: the per-task configs, the
seeds, uniform play, the table and what goes to MLflow.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import mlflow
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import marl_suite  # noqa: E402


def test_a_quick_run_tables_every_applicable_pair_and_logs_a_plot_per_task(tmp_path, capsys):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    arguments = [
        "--quick",
        "--jobs",
        "0",
        "--tasks",
        "simple_spread",
        "simple_push",
        "--algorithms",
        "ippo",
        "qmix",
        "--results",
        str(tmp_path / "runs"),
        "--tracking-uri",
        store,
    ]
    assert marl_suite.main(arguments) == 0
    out = capsys.readouterr().out
    assert out.count("] simple_") == 3  # a line per run as it finishes
    rows = [line for line in out.splitlines() if line.startswith("| simple_")]
    assert [tuple(cell.strip() for cell in row.split("|")[1:4]) for row in rows] == [
        ("simple_spread", "team", "ippo"),
        ("simple_spread", "team", "qmix"),  # cooperative: the team's return
        ("simple_push", "adversary", "ippo"),
        ("simple_push", "agent", "ippo"),  # competitive: each role against uniform play
    ]  # and QMIX, which needs one team reward, not on simple_push
    client = mlflow.MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("marl-suite").experiment_id])
    assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == {
        "plots/simple_spread.png",
        "plots/simple_push.png",
    }
    assert "| simple_push | agent | ippo |" in mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/table.md")
    assert set(run.data.metrics) >= {"simple_spread/team/qmix/final", "simple_push/adversary/ippo/margin"}

    # run again, as after Ctrl-C: the finished runs are read back, none trains again, the table is the same
    assert marl_suite.main(arguments) == 0
    again = capsys.readouterr().out
    assert "3 of them finished before" in again and "] simple_" not in again
    assert [line for line in again.splitlines() if line.startswith("| simple_")] == rows


def test_a_saved_run_stands_only_for_the_config_it_ran(tmp_path):
    task = marl_suite.TASKS["simple_spread"]
    job = marl_suite.Job(task, "ippo", seed=0, budget=2048, evaluations=1, eval_episodes=4)
    marl_suite.save(tmp_path, marl_suite.Curve(job, [0, 2048], {"team": [-30.0, -25.0]}, 1.0))
    assert marl_suite.load(tmp_path, job).scores == {"team": [-30.0, -25.0]}
    assert marl_suite.load(tmp_path, dataclasses.replace(job, eval_episodes=8)) is None  # another evaluation
    assert marl_suite.load(tmp_path, dataclasses.replace(job, budget=4096)) is None  # more rounds
    assert marl_suite.load(tmp_path, dataclasses.replace(job, seed=1)) is None  # never ran


def test_the_table_shows_the_joint_steps_each_pair_played():
    """The budget sizes the rounds; what a pair played is its seeds' last evaluation's steps (an
    asynchronous learner's workers may play more than its learners take), shown beside its time."""
    task = marl_suite.TASKS["simple_tag"]
    curves = [
        marl_suite.Curve(marl_suite.Job(task, algorithm, seed, 100_000, 1, 4), [0, steps], {"team": [1.0, final]}, 10.0)
        for algorithm, steps in (("ippo", 100_352), ("appo", 200_704))
        for seed, final in ((0, 3.0), (1, 5.0))
    ]
    lines = marl_suite.table(marl_suite.rows(curves, {"simple_tag": {"team": (1.0, 0.1)}})).splitlines()
    assert lines[0].split("|")[-3:-1] == [" joint steps ", " seconds "]
    assert [line.split("|")[3:4] + line.split("|")[-3:-1] for line in lines[2:]] == [
        [" ippo ", " 100,352 ", " 20 "],
        [" appo ", " 200,704 ", " 20 "],
    ]
    assert all(line.count("|") == lines[1].count("|") for line in lines)  # every row has every column


def test_a_pair_runs_its_tasks_config_with_the_suites_budget_seed_and_evaluations():
    """simple_spread/ippo.yaml: 256 steps x 8 copies a round; the seed reaches the learner's
    settings at the level its class keeps it (IPPO's under `ppo`, MAPPO's at the top)."""
    task = marl_suite.TASKS["simple_spread"]
    config = marl_suite.run_config(marl_suite.Job(task, "ippo", seed=4, budget=20_480, evaluations=5, eval_episodes=10))
    assert (config.rounds, config.eval_every, config.steps_per_round, config.envs_per_worker) == (10, 2, 256, 8)
    assert config.seed == 4 and config.algorithm_settings.ppo.seed == 4 and config.algorithm_settings.ppo.lr == 3e-4
    assert config.agent_ids and config.eval_greedy and not config.eval_versus_uniform  # cooperative: the team, greedy

    competitive = marl_suite.run_config(marl_suite.Job(marl_suite.TASKS["simple_adversary"], "mappo", 2, 1, 1, 10))
    assert competitive.algorithm_settings.seed == 2 and competitive.rounds == 1  # MAPPO's defaults: no file
    assert competitive.eval_versus_uniform and not competitive.agent_ids  # each agent alone among uniform players,
    assert not competitive.eval_greedy  # sampling from its policy: a mixed strategy stays mixed


def test_uniform_play_in_a_roles_seats_faces_the_trained_opponents():
    """simple_push: uniform play in the adversary's seat faces the agent's policy, and in the
    agent's seat the adversary's; a cooperative task's one score is the whole team's."""
    from marl_core.marl.steps import UniformInSeats

    seats = UniformInSeats(("adversary_0",), lambda agent: agent.split("_")[0])
    assert (seats("adversary_0"), seats("agent_0")) == ("uniform/adversary_0", "agent")
    push = {"adversary": ("adversary_0",), "agent": ("agent_0",)}
    assert marl_suite.score_groups(marl_suite.TASKS["simple_push"], push) == push
    assert marl_suite.score_groups(marl_suite.TASKS["simple_spread"], {"agent": ("agent_0", "agent_1")}) == {
        "team": ("agent_0", "agent_1")
    }


def test_a_config_file_for_another_task_is_refused_before_any_run(tmp_path):
    (tmp_path / "simple_push").mkdir()
    (tmp_path / "simple_push" / "ippo.yaml").write_text("env: pettingzoo:mpe2.simple_tag_v3\nalgorithm: ippo\n")
    with pytest.raises(ValueError, match="simple_push/ippo.yaml: env 'pettingzoo:mpe2.simple_tag_v3'"):
        marl_suite.main(["--quick", "--tasks", "simple_push", "--algorithms", "ippo", "--configs", str(tmp_path)])
