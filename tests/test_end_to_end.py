"""A short PSRO run through the real `psro` command: a real Prefect server, a real local Ray
instance, a real MLflow SQLite store. Afterwards everything is read back: metrics, artifacts and
registered models from MLflow, flow and task runs from Prefect, the export through OpenSpiel.

Then the run as a person sees it: `prefect server start` on the run's Prefect home and `mlflow
ui` on its store, both on 127.0.0.1, and the pages the README points to in headless Chromium
(tests/headless_browser.py), with screenshots in test-artifacts/screenshots/."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from headless_browser import (
    chromium_page,
    close_mlflow_assistant,
    dismiss_mlflow_dialog,
    shoot,
    start_mlflow_ui,
    wait_for_text,
)
from processes import assert_all_exited, poll, processes_with_env, wait_until

pytestmark = pytest.mark.end_to_end

ITERATIONS = 3
EXPERIMENT = "e2e"
ROOT = Path(__file__).resolve().parents[1]


def _marker(prefect_home: Path) -> str:
    """What every process a run starts (its Prefect server, Ray's raylet and workers) inherits."""
    return f"PREFECT_HOME={prefect_home}"


def _clean_env(prefect_home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_"))}
    return {**env, "PREFECT_HOME": str(prefect_home)}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """The run, on a Prefect home made from nothing (as on a new machine), and what it left
    running once it returned (read before anything else here starts on that home)."""
    work = tmp_path_factory.mktemp("e2e")
    command = [
        str(Path(sys.executable).with_name("psro")),
        "run",
        "--game",
        "kuhn_poker",
        "--iterations",
        str(ITERATIONS),
        "--tracking-uri",
        f"sqlite:///{work}/mlflow.db",
        "--experiment",
        EXPERIMENT,
        "--export",
        str(work / "export"),
        "--num-cpus",
        "2",
    ]
    result = subprocess.run(
        command, cwd=work, env=_clean_env(work / "prefect-home"), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    result.left_running = poll(lambda: processes_with_env(_marker(work / "prefect-home")), lambda found: not found)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{work}/mlflow.db")
    run = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])[0]
    return work, result, client, run


@pytest.fixture(scope="module")
def served(finished_run):
    """Prefect's server (API and UI) on the run's home and `mlflow ui` on its store, both booting
    at once; yields their addresses."""
    from flows.services.prefect_server import LocalPrefectServer, free_port, healthy

    work = finished_run[0]
    home = work / "prefect-home"
    prefect = LocalPrefectServer(home)
    port = free_port()
    mlflow_ui = start_mlflow_ui(f"sqlite:///{work}/mlflow.db", work, _clean_env(home), port)
    try:
        prefect.wait()
        mlflow_url = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: healthy(mlflow_url) or mlflow_ui.poll() is not None,
            90,
            f"mlflow ui (log: {work / 'mlflow-ui.log'})",
        )
        assert mlflow_ui.poll() is None, (work / "mlflow-ui.log").read_text()[-2000:]
        yield prefect.url, mlflow_url
    finally:
        if mlflow_ui.poll() is None:
            os.killpg(mlflow_ui.pid, signal.SIGTERM)
            mlflow_ui.wait(timeout=30)
        prefect.stop()
        assert_all_exited(_marker(home))


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    with chromium_page(tmp_path_factory.mktemp("chromium-profile")) as page:
        yield page


def _post(url: str, body: dict):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_prints_one_line_per_iteration_and_leaves_no_process(finished_run):
    _, result, _, _ = finished_run
    lines = [line for line in result.stdout.splitlines() if line.startswith("iter ")]
    assert [int(line.split()[1]) for line in lines] == list(range(ITERATIONS + 1))
    assert "done:" in result.stdout
    assert result.left_running == []


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
    for name in (
        "player_0/best_response_gain",
        "player_1/population_size",
        "player_0/meta_entropy",
        "seconds/evaluate",
        "seconds/meta_solve",
        "iteration_seconds",
    ):
        assert len(client.get_metric_history(run.info.run_id, name)) == ITERATIONS + 1, name

    artifacts = {
        a.path
        for folder in ("payoffs", "meta_strategy", "plots")
        for a in client.list_artifacts(run.info.run_id, folder)
    }
    assert {f"payoffs/iteration_{i:04d}.csv" for i in range(ITERATIONS + 1)} | {"payoffs/final.csv"} <= artifacts
    assert f"meta_strategy/iteration_{ITERATIONS:04d}.json" in artifacts
    assert {"plots/exploitability.png", "plots/payoff_heatmap.png"} <= artifacts
    table = pd.read_csv(
        mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id,
            artifact_path="payoffs/final.csv",
            tracking_uri=f"sqlite:///{finished_run[0]}/mlflow.db",
        )
    )
    assert len(table) == (ITERATIONS + 1) ** 2
    newest = pd.read_csv(
        mlflow.artifacts.download_artifacts(  # an iteration logs only its new entries
            run_id=run.info.run_id,
            artifact_path=f"payoffs/iteration_{ITERATIONS:04d}.csv",
            tracking_uri=f"sqlite:///{finished_run[0]}/mlflow.db",
        )
    )
    assert (
        len(newest) == 2 * ITERATIONS + 1
        and ((newest["member_0"] == ITERATIONS) | (newest["member_1"] == ITERATIONS)).all()
    )
    assert (table["payoff_0"] + table["payoff_1"]).abs().max() < 1e-12  # zero-sum, exact


def test_every_member_is_registered_once_with_tags_and_alias(finished_run):
    _, _, client, run = finished_run
    for player in (0, 1):
        name = f"{EXPERIMENT}-kuhn_poker-player_{player}"
        versions = client.search_model_versions(f"name='{name}' and run_id='{run.info.run_id}'")
        members = sorted(int(v.tags["member"]) for v in versions)
        assert members == list(range(ITERATIONS + 1))
        assert all(v.tags["iteration"] == v.tags["member"] for v in versions)
        final = json.loads((finished_run[0] / "export" / "meta_strategy.json").read_text())[str(player)]
        for version in versions:  # tags carry the final meta-weights
            assert float(version.tags["meta_weight"]) == pytest.approx(
                final[int(version.tags["member"])], rel=1e-5, abs=1e-9
            )
        newest = client.get_model_version_by_alias(name, "newest")
        assert newest.tags["member"] == str(ITERATIONS)
        policy = json.loads(
            Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{newest.source}/policy.json")).read_text()
        )
        assert len(policy) == 6  # Kuhn: six information states per player
        exported = json.loads(
            (finished_run[0] / "export" / "policies" / f"player_{player}" / f"member_{ITERATIONS}.json").read_text()
        )
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


def test_prefect_recorded_the_flow_its_iterations_and_their_tasks(served):
    prefect_api, _ = served
    flows = {f["id"]: f["name"] for f in _post(f"{prefect_api}/flows/filter", {})}
    runs = _post(f"{prefect_api}/flow_runs/filter", {})
    tasks = _post(f"{prefect_api}/task_runs/filter", {})
    assert sorted(flows[r["flow_id"]] for r in runs) == ["psro"] + ["psro-iteration"] * (ITERATIONS + 1)
    assert {r["state"]["name"] for r in runs} == {"Completed"}
    names = " ".join(t["task_key"] for t in tasks)
    for task in ("train_best_response", "evaluate_payoffs", "solve_meta_game", "measure_exploitability"):
        assert task in names, names


def test_mlflow_ui_shows_the_run_its_exploitability_and_the_registered_population(finished_run, served, page):
    run = finished_run[3]
    _, mlflow_url = served
    run_page = f"{mlflow_url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"

    page.goto(run_page)
    wait_for_text(page, run.info.run_name)
    close_mlflow_assistant(page)
    page.get_by_placeholder("Search metrics").fill("exploitability")
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name="exploitability", exact=True))
    shown = row.get_by_role("cell").nth(1)
    shown.wait_for()
    assert float(shown.inner_text()) == run.data.metrics["exploitability"]  # the value the run logged last
    shoot(page, "01-mlflow-run-overview")

    page.goto(f"{run_page}/model-metrics")
    page.get_by_placeholder("Search metric charts").fill("exploitability")
    wait_for_text(page, "exploitability", exact=True)
    shoot(page, "02-mlflow-exploitability-chart")

    page.goto(f"{run_page}/artifacts/plots/exploitability.png")
    wait_for_text(page, "plots/exploitability.png")
    page.wait_for_function("() => [...document.images].some(image => image.complete && image.naturalWidth >= 400)")
    shoot(page, "03-mlflow-exploitability-plot")

    page.goto(f"{mlflow_url}/#/models")
    for player in (0, 1):
        wait_for_text(page, f"{EXPERIMENT}-kuhn_poker-player_{player}")
    dismiss_mlflow_dialog(page)
    shoot(page, "04-mlflow-registered-models")

    page.goto(f"{mlflow_url}/#/models/{EXPERIMENT}-kuhn_poker-player_0")
    wait_for_text(page, "@ newest")
    wait_for_text(page, f"Version {ITERATIONS + 1}")
    shoot(page, "05-mlflow-population-versions")


def test_prefect_ui_shows_the_flow_run_its_iterations_and_their_tasks(served, page):
    prefect_api, _ = served
    prefect_url = prefect_api.removesuffix("/api")
    flows = {f["id"]: f["name"] for f in _post(f"{prefect_api}/flows/filter", {})}
    runs = _post(f"{prefect_api}/flow_runs/filter", {})
    psro = next(r for r in runs if flows[r["flow_id"]] == "psro")
    iterations = [r for r in runs if flows[r["flow_id"]] == "psro-iteration"]
    assert len(iterations) == ITERATIONS + 1

    page.goto(f"{prefect_url}/runs")
    wait_for_text(page, iterations[0]["name"])
    page.get_by_text("Hide subflows", exact=True).click()  # the list then holds the psro run alone
    wait_for_text(page, psro["name"]).scroll_into_view_if_needed()
    shoot(page, "06-prefect-runs")

    page.goto(f"{prefect_url}/runs/flow-run/{psro['id']}")
    wait_for_text(page, psro["name"])
    page.get_by_text("Subflow Runs", exact=True).click()
    for run in iterations:
        wait_for_text(page, run["name"])
    shoot(page, "07-prefect-psro-subflows")

    last = max(iterations, key=lambda r: r["start_time"])
    page.goto(f"{prefect_url}/runs/flow-run/{last['id']}")
    page.get_by_text("Task Runs", exact=True).click()
    for task in ("train-best-response", "evaluate-payoffs", "solve-meta-game", "measure-exploitability"):
        wait_for_text(page, task)
    shoot(page, "08-prefect-iteration-tasks")
