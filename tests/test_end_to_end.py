"""A short PSRO run through the real `psro` command: a real Prefect server, a real local Ray
instance, a real MLflow SQLite store. Afterwards everything is read back: metrics, artifacts and
registered models from MLflow, flow and task runs from Prefect, the export through OpenSpiel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from processes import assert_all_exited

pytestmark = pytest.mark.slow

ITERATIONS = 3
ROOT = Path(__file__).resolve().parents[1]


def _marker(prefect_home: Path) -> str:
    """What every process a run starts (its Prefect server, Ray's raylet and workers) inherits."""
    return f"PREFECT_HOME={prefect_home}"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("e2e")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_"))}
    env["PREFECT_HOME"] = str(work / "prefect-home")
    command = [
        str(Path(sys.executable).with_name("psro")), "run", "--game", "kuhn_poker",
        "--iterations", str(ITERATIONS), "--tracking-uri", f"sqlite:///{work}/mlflow.db",
        "--experiment", "e2e", "--export", str(work / "export"), "--num-cpus", "2",
    ]
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{work}/mlflow.db")
    run = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])[0]
    return work, result, client, run


def test_prints_one_line_per_iteration_and_leaves_no_process(finished_run):
    work, result, _, _ = finished_run
    lines = [line for line in result.stdout.splitlines() if line.startswith("iter ")]
    assert [int(line.split()[1]) for line in lines] == list(range(ITERATIONS + 1))
    assert "done:" in result.stdout
    assert_all_exited(_marker(work / "prefect-home"))


def test_mlflow_holds_params_metrics_and_artifacts(finished_run):
    _, _, client, run = finished_run
    assert run.info.status == "FINISHED"
    assert run.data.params["game"] == "kuhn_poker" and run.data.params["meta_solver"] == "nash"
    history = client.get_metric_history(run.info.run_id, "exploitability")
    assert sorted(m.step for m in history) == list(range(ITERATIONS + 1))
    values = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert values[-1] < values[0]  # PSRO with exact best responses improves on uniform play
    nash_conv = client.get_metric_history(run.info.run_id, "nash_conv")
    assert [m.value / 2 for m in sorted(nash_conv, key=lambda m: m.step)] == pytest.approx(values)
    for name in ("player_0/best_response_gain", "player_1/population_size", "player_0/meta_entropy",
                 "seconds/evaluate", "seconds/meta_solve", "iteration_seconds"):
        assert len(client.get_metric_history(run.info.run_id, name)) == ITERATIONS + 1, name

    artifacts = {a.path for folder in ("payoffs", "meta_strategy", "plots")
                 for a in client.list_artifacts(run.info.run_id, folder)}
    assert {f"payoffs/iteration_{i:04d}.csv" for i in range(ITERATIONS + 1)} | {"payoffs/final.csv"} <= artifacts
    assert f"meta_strategy/iteration_{ITERATIONS:04d}.json" in artifacts
    assert {"plots/exploitability.png", "plots/payoff_heatmap.png"} <= artifacts
    table = pd.read_csv(mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="payoffs/final.csv",
        tracking_uri=f"sqlite:///{finished_run[0]}/mlflow.db"))
    assert len(table) == (ITERATIONS + 1) ** 2
    newest = pd.read_csv(mlflow.artifacts.download_artifacts(  # an iteration logs only its new entries
        run_id=run.info.run_id, artifact_path=f"payoffs/iteration_{ITERATIONS:04d}.csv",
        tracking_uri=f"sqlite:///{finished_run[0]}/mlflow.db"))
    assert len(newest) == 2 * ITERATIONS + 1 and ((newest["member_0"] == ITERATIONS) | (newest["member_1"] == ITERATIONS)).all()
    assert (table["payoff_0"] + table["payoff_1"]).abs().max() < 1e-12  # zero-sum, exact


def test_every_member_is_registered_once_with_tags_and_alias(finished_run):
    _, _, client, run = finished_run
    for player in (0, 1):
        name = f"e2e-kuhn_poker-player_{player}"
        versions = client.search_model_versions(f"name='{name}' and run_id='{run.info.run_id}'")
        members = sorted(int(v.tags["member"]) for v in versions)
        assert members == list(range(ITERATIONS + 1))
        assert all(v.tags["iteration"] == v.tags["member"] for v in versions)
        final = json.loads((finished_run[0] / "export" / "meta_strategy.json").read_text())[str(player)]
        for version in versions:  # tags carry the final meta-weights
            assert float(version.tags["meta_weight"]) == pytest.approx(final[int(version.tags["member"])], rel=1e-5, abs=1e-9)
        newest = client.get_model_version_by_alias(name, "newest")
        assert newest.tags["member"] == str(ITERATIONS)
        policy = json.loads(Path(mlflow.artifacts.download_artifacts(
            artifact_uri=f"{newest.source}/policy.json")).read_text())
        assert len(policy) == 6  # Kuhn: six information states per player
        exported = json.loads((finished_run[0] / "export" / "policies" / f"player_{player}" / f"member_{ITERATIONS}.json").read_text())
        from marl_core.games.tree import build_tree
        from marl_core.policies.tabular import policy_from_dict

        player_tree = build_tree("kuhn_poker").players[player]
        np.testing.assert_array_equal(policy_from_dict(player_tree, policy), policy_from_dict(player_tree, exported))


def test_export_agrees_with_openspiel(finished_run):
    work, _, _, run = finished_run
    sys.path.insert(0, str(ROOT / "scripts"))
    from verify_export import verify

    summary = verify(work / "export", tolerance=1e-6)
    assert summary["passed"]
    reported = json.loads((work / "export" / "summary.json").read_text())
    assert reported["iterations"] == ITERATIONS
    assert reported["exploitability"] == pytest.approx(run.data.metrics["exploitability"])


def test_prefect_recorded_the_flow_its_iterations_and_their_tasks(finished_run):
    work, _, _, _ = finished_run
    from flows.runtime import LocalPrefectServer

    server = LocalPrefectServer(work / "prefect-home")
    try:
        server.wait()
        script = (
            "import asyncio, collections, json\n"
            "from prefect.client.orchestration import get_client\n"
            "async def main():\n"
            "    async with get_client() as client:\n"
            "        flows = {f.id: f.name for f in await client.read_flows()}\n"
            "        runs = await client.read_flow_runs()\n"
            "        tasks = await client.read_task_runs()\n"
            "        print(json.dumps({'flows': collections.Counter(flows[r.flow_id] for r in runs),\n"
            "                          'states': sorted({r.state_name for r in runs}),\n"
            "                          'tasks': collections.Counter(t.task_key.rsplit('-', 1)[0] for t in tasks)}))\n"
            "asyncio.run(main())\n"
        )
        env = dict(os.environ, PREFECT_API_URL=server.url)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        seen = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        server.stop()
    assert seen["flows"] == {"psro": 1, "psro-iteration": ITERATIONS + 1}
    assert seen["states"] == ["Completed"]
    names = " ".join(seen["tasks"])
    for task in ("train_best_response", "evaluate_payoffs", "solve_meta_game", "measure_exploitability"):
        assert task in names, seen["tasks"]

