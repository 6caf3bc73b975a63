"""Four scenarios at once on the team's stack (`psro stack up --auth`, a stack of this module's
own: `team_stack.py`), deployed from prefect.yaml to its work pool, three of them killed and
resumed; then `down` leaves nothing, `up` brings their runs back, and both servers' UIs show them.

Beside `test_stack.py` (the same kind of stack, failing services under one run) in the suite's
other process: that file mostly waits while its services are down, this one keeps the cores busy.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from processes import FAULT_INJECTION, Prefect, assert_all_exited, processes_with_env, wait_until
from small_runs import PBT, SMALL_LEAGUE, SYNC_MARL
from team_stack import (
    PSRO,
    addresses,
    assert_no_secret_stored,
    running_stack,
    stack_command,
    stack_env,
    status_without_credentials,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack():
    with running_stack() as running:
        yield running


# prefect.yaml's deployment of each scenario -> (scenario, the config it is triggered with: small
# ones, each committing step 3 last)
LOAD = {
    "psro/kuhn-smoke": ("psro", {"game": "kuhn_poker", "meta_solver": "nash", "iterations": 3}),
    "marl/spread-ippo-nightly": ("marl", SYNC_MARL),
    "league/kuhn-league": ("league", SMALL_LEAGUE),
    "pbt/spread-pbt-weekly": ("pbt", PBT),
}
# SIGKILLed just before this commit (the one after step 1's), then resumed from the command line
KILLED = {"marl": 3, "league": 2, "pbt": 3}
RUNS: dict[str, str] = {}  # scenario -> its MLflow run id on the stack: `up` again must still hold them


def test_four_scenarios_at_once_from_the_stacks_work_pool_and_three_resumed_after_sigkill(stack, tmp_path):
    """prefect.yaml deployed to the stack's pool (`prefect deploy --all`, as docs/operations.md
    tells a team) and one deployment of each scenario triggered at once: the stack's worker runs
    all four together. Three of them die by SIGKILL just before their second commit (the suite's
    seam, passed to those runs alone as job variables); `psro SCENARIO resume RUN_ID` on the
    command line continues each as soon as it has crashed. Every run ends FINISHED at its last
    step, each metric logged once per step, each registry version registered once, nothing
    written where they ran; and after all the module's runs neither secret is stored anywhere."""
    import mlflow
    from mlflow_reads import assert_each_metric_once, assert_each_version_once

    from flows.scenarios import SCENARIOS

    directory, state, _ = stack
    address = addresses(state)
    env = dict(stack_env(), PREFECT_API_URL=address["prefect"])
    root = Path(__file__).resolve().parents[1]

    def prefect_cli(*args: str) -> subprocess.CompletedProcess:
        command = [str(Path(sys.executable).with_name("prefect")), *args]
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    prefect_cli("--no-prompt", "deploy", "--all")
    prefect_cli("deployment", "schedule", "pause", "--all")  # no nightly run may start during the suite
    common = {"tracking_uri": address["mlflow"], "ray_address": address["ray"], "num_cpus": 1}
    flow_runs = {}
    for deployment, (scenario, config) in LOAD.items():
        placed = SCENARIOS[scenario].with_common(config, {**common, "experiment": f"load-{scenario}"})
        flags = ["--params", json.dumps({"config": placed})]
        if scenario in KILLED:
            seam = {"PYTHONPATH": str(FAULT_INJECTION), "PSRO_TEST_KILL_AT_COMMIT": str(KILLED[scenario])}
            flags += ["--job-variable", f"env={json.dumps(seam)}"]
        triggered = prefect_cli("deployment", "run", deployment, *flags)
        flow_runs[scenario] = re.search(r"UUID: ([0-9a-f-]{36})", triggered.stdout).group(1)

    prefect = Prefect(address["prefect"])
    client = mlflow.MlflowClient(tracking_uri=address["mlflow"])

    def run_of(scenario: str):
        (found,) = client.search_runs([client.get_experiment_by_name(f"load-{scenario}").experiment_id])
        return found

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run_env = dict(
        stack_env(), PREFECT_API_URL=address["prefect"], RAY_AUTH_MODE="token", PREFECT_HOME=str(tmp_path / "home")
    )
    resumes = {}

    def resume(scenario: str) -> None:
        """`psro SCENARIO resume RUN_ID` of a run that crashed, started at once, beside the others."""
        crashed = run_of(scenario)
        assert crashed.data.tags[SCENARIOS[scenario].commit_tag] == "1", scenario
        command = [PSRO, scenario, "resume", crashed.info.run_id, "--tracking-uri", address["mlflow"]]
        command += ["--ray-address", address["ray"]]
        with open(tmp_path / f"{scenario}.log", "w") as out:
            resumes[scenario] = subprocess.Popen(command, env=run_env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)

    running = dict(flow_runs)

    def one_ended() -> bool:
        for scenario, flow_run_id in list(running.items()):
            ended = prefect("read_flow_run", flow_run_id).state
            if ended.is_final():
                del running[scenario]
                assert ended.is_crashed() if scenario in KILLED else ended.is_completed(), (scenario, ended)
                if scenario in KILLED:
                    resume(scenario)
        return not running

    wait_until(one_ended, 600, "the four runs to end")
    for scenario, process in resumes.items():
        assert process.wait(timeout=600) == 0, (tmp_path / f"{scenario}.log").read_text()[-3000:]
    assert list(cwd.iterdir()) == []

    for scenario in flow_runs:
        found = run_of(scenario)
        assert found.info.status == "FINISHED", scenario
        assert found.data.tags[SCENARIOS[scenario].commit_tag] == "3", scenario
        assert found.info.artifact_uri.startswith("mlflow-artifacts:")
        assert_each_metric_once(client, found)
        assert_each_version_once(client, found.info.run_id)
        assert client.search_model_versions(f"run_id = '{found.info.run_id}'"), scenario  # its checkpoints
    psro_steps = [m.step for m in client.get_metric_history(run_of("psro").info.run_id, "exploitability")]
    assert sorted(psro_steps) == [0, 1, 2, 3]
    RUNS.update({scenario: run_of(scenario).info.run_id for scenario in flow_runs})
    assert_no_secret_stored(directory, state, client, list(RUNS.values()))


def test_down_leaves_nothing_is_safe_twice_and_up_brings_the_data_back(stack):
    import mlflow

    directory, state, _ = stack
    marker = f"PSRO_STACK={directory}"
    assert processes_with_env(marker)  # the marker finds the stack's processes
    stopped = stack_command(directory, "down")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert_all_exited(marker, timeout=10)
    assert not (directory / "postgres" / "postmaster.pid").exists()  # PostgreSQL's processes rename themselves
    for service in ("prefect-worker", "mlflow", "prefect-server", "ray-worker-1", "ray-head", "postgres"):
        assert f"stopped {service}" in stopped.stdout, stopped.stdout
    status = stack_command(directory, "status")
    assert status.returncode == 1 and "up" not in status.stdout.split()

    again = stack_command(directory, "down")
    assert again.returncode == 0 and again.stdout.strip() == "nothing was running", again.stdout + again.stderr

    started = stack_command(directory, "up")  # without --auth: the servers take requests from anyone
    assert started.returncode == 0, started.stdout + started.stderr
    address = addresses(json.loads((directory / "stack.json").read_text()))
    assert status_without_credentials(f"{address['prefect']}/flows/filter", b"{}") == 200
    client = mlflow.MlflowClient(tracking_uri=address["mlflow"])
    for scenario, run_id in RUNS.items():
        assert client.get_run(run_id).info.status == "FINISHED", scenario
    assert client.list_artifacts(RUNS["psro"], "payoffs")


def test_the_stacks_uis_show_the_runs_of_both_scenarios(stack, tmp_path):
    """For a person to look at (test-artifacts/screenshots/): the stack's Prefect UI and MLflow UI,
    brought back by `up` (without --auth) after `down`, each showing the PSRO and the MARL run."""
    import mlflow
    from headless_browser import chromium_page, close_mlflow_assistant, shoot, wait_for_text

    from flows.tracking.layout import mlflow_run_link

    directory, _, _ = stack
    address = addresses(json.loads((directory / "stack.json").read_text()))
    client = mlflow.MlflowClient(tracking_uri=address["mlflow"])
    prefect = Prefect(address["prefect"])
    with chromium_page(tmp_path / "profile") as page:
        for scenario in ("psro", "marl"):
            run_id = RUNS[scenario]
            run = client.get_run(run_id)
            flow_run = prefect("read_flow_run", run.data.tags["prefect.flow_run_id"])
            page.goto(f"{address['prefect'].removesuffix('/api')}/runs/flow-run/{flow_run.id}")
            wait_for_text(page, flow_run.name)
            shoot(page, f"30-stack-prefect-{scenario}")
            page.goto(mlflow_run_link(address["mlflow"], run.info.experiment_id, run_id))
            wait_for_text(page, run.info.run_name)
            close_mlflow_assistant(page)
            shoot(page, f"31-stack-mlflow-{scenario}")
