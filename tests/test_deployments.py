"""prefect.yaml's deployments, served by `psro serve` against a real Prefect server.

The test does what the README tells a user to do: start a server on 127.0.0.1, run
`psro serve`, trigger the Kuhn smoke deployment with `prefect deployment run` (fewer iterations,
a temporary MLflow store and an export directory as the parameter override), and watch the run
complete. It then
reads through Prefect's client what the UI shows: the run, its `psro-iteration` subflows and
their tasks, and the nightly deployment with its cron schedule.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from processes import Prefect, assert_all_exited, mlflow_store, poll, prefect_home, processes_with_env, wait_until

pytestmark = pytest.mark.end_to_end

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 2
TASKS = {"train-best-response", "evaluate-payoffs", "solve-meta-game", "measure-exploitability"}


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from flows.services.prefect_server import LocalPrefectServer

    work = tmp_path_factory.mktemp("deployments")
    home = work / "prefect-home"
    marker = f"PREFECT_HOME={home}"
    assert not processes_with_env(marker)
    server = LocalPrefectServer(prefect_home(home))  # boots while `psro serve` imports; serve waits for it
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_"))}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_API_URL=server.url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_RUNNER_POLL_FREQUENCY="1",
    )  # the serving process looks for scheduled runs every second, not every 10
    log = open(work / "serve.log", "wb")
    serve = subprocess.Popen(
        [str(Path(sys.executable).with_name("psro")), "serve", "--prefect-yaml", str(ROOT / "prefect.yaml")],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        server.wait()
        prefect = Prefect(server.url)
        wait_until(lambda: prefect.deployment("psro/kuhn-smoke"), 90, "psro serve to register its deployments")
        yield work, env, prefect, serve
    finally:
        _stop(serve)
        server.stop()
        log.close()
        assert_all_exited(marker)


@pytest.fixture(scope="module")
def triggered_run(served):
    """A kuhn-smoke run triggered from the command line, as the README shows, run to completion."""
    work, env, prefect, _ = served
    config = {
        "game": "kuhn_poker",
        "meta_solver": "nash",
        "iterations": ITERATIONS,
        "num_cpus": 2,
        "tracking_uri": mlflow_store(work),
        "experiment": "smoke",
        "export": str(work / "export"),
    }
    command = [
        str(Path(sys.executable).with_name("prefect")),
        "deployment",
        "run",
        "psro/kuhn-smoke",
        "--params",
        json.dumps({"config": config}),
    ]
    out = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", out.stdout).group(1)
    run = wait_until(
        lambda: (r := prefect("read_flow_run", flow_run_id)).state.is_final() and r, 120, "the triggered run to finish"
    )
    assert run.state.is_completed(), (run.state, (work / "serve.log").read_text()[-3000:])
    return run


def test_triggered_run_has_its_iterations_and_their_tasks(served, triggered_run):
    _, _, prefect, _ = served
    flows = {flow.id: flow.name for flow in prefect("read_flows")}
    runs = prefect("read_flow_runs")
    assert flows[triggered_run.flow_id] == "psro"
    assert triggered_run.deployment_id == prefect.deployment("psro/kuhn-smoke").id
    assert triggered_run.parameters["config"]["iterations"] == ITERATIONS
    iterations = [r for r in runs if flows[r.flow_id] == "psro-iteration"]
    assert len(iterations) == ITERATIONS + 1 and all(r.state.is_completed() for r in iterations)
    ids = {r.id for r in iterations}

    def counted() -> Counter:
        return Counter(t.name.rsplit("-", 1)[0] for t in prefect("read_task_runs") if t.flow_run_id in ids)

    # task runs reach the server as events, possibly after their flow run's final state
    tasks = poll(counted, lambda tasks: set(tasks) == TASKS and tasks["train-best-response"] >= 2 * ITERATIONS)
    assert set(tasks) == TASKS, tasks
    assert tasks["train-best-response"] == 2 * ITERATIONS  # two players, none at iteration 0


def test_triggered_run_writes_the_export_it_was_given(served, triggered_run):
    """The flow writes the export, not the CLI: a deployment's run with `export` set writes one too."""
    work = served[0]
    summary = json.loads((work / "export" / "summary.json").read_text())
    assert summary["game"] == "kuhn_poker" and summary["iterations"] == ITERATIONS
    verified = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "verify_export.py"), str(work / "export")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_scheduled_deployment_is_listed_with_its_cron(served):
    _, _, prefect, _ = served
    declared = {d["name"]: d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}
    nightly = prefect.deployment("psro/leduc-nightly")
    assert [s.schedule.cron for s in nightly.schedules] == [declared["leduc-nightly"]["schedules"][0]["cron"]]
    assert nightly.schedules[0].schedule.timezone == "UTC" and nightly.schedules[0].active
    assert nightly.parameters == declared["leduc-nightly"]["parameters"]
    smoke = prefect.deployment("psro/kuhn-smoke")
    assert smoke.schedules == [] and smoke.parameters == declared["kuhn-smoke"]["parameters"]


def test_psro_serve_serves_every_deployment_of_prefect_yaml(served):
    _, _, prefect, _ = served
    for declared in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]:
        flow = declared["entrypoint"].rsplit(".", 1)[1]
        assert prefect.deployment(f"{flow}/{declared['name']}"), declared["name"]


def test_bad_deployment_names_fail_with_one_line():
    from typer.testing import CliRunner

    from flows.cli.app import app

    result = CliRunner().invoke(app, ["serve", "--deployment", "nightly", "--prefect-yaml", str(ROOT / "prefect.yaml")])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    names = sorted(d["name"] for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"])
    assert "no deployment 'nightly'" in result.output and f"choose from: {', '.join(names)}" in result.output
    result = CliRunner().invoke(app, ["serve", "--prefect-yaml", "missing.yaml"])
    assert result.exit_code == 2 and "no deployment file at 'missing.yaml'" in result.output


def test_entrypoints_import_the_flow_as_part_of_the_package():
    """A file-path entrypoint (flows/deployments/entrypoints.py:psro) makes Prefect load the file as a
    top-level module `entrypoints`; Ray workers cannot import that, and every worker-pool run fails.
    Every scenario has a deployment."""
    from prefect.flows import load_flow_from_entrypoint

    from flows.scenarios import SCENARIOS

    scenarios = set()
    for deployment in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]:
        flow = load_flow_from_entrypoint(deployment["entrypoint"])
        module, _, name = deployment["entrypoint"].rpartition(".")
        assert flow.name == name and flow.fn.__module__ == module == "flows.deployments.entrypoints", deployment["name"]
        scenarios.add(flow.scenario.name)
    assert scenarios == set(SCENARIOS)
