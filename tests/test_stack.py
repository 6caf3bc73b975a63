"""`psro stack up|status|down`: the team's services (PostgreSQL, Prefect, MLflow, Ray, a Prefect
worker) brought up by the real command, used by a real `psro run` that each service fails under
and that is then killed and resumed by `psro resume`, by every scenario's run at once from its
work pool, and stopped leaving nothing.

One stack serves every test of the module (starting it is the slow part); the tests run in file
order. Every process of the stack carries `PSRO_STACK=DIR` in its environment: that marker, not
process names, is how leftovers are found (tests/processes.py). DIR is made under /tmp, open to
other users: as root, PostgreSQL runs as the `postgres` user, which must reach its data.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow_reads import assert_each_metric_once, assert_each_version_once
from processes import FAULT_INJECTION, Prefect, assert_all_exited, processes_with_env, wait_until
from small_runs import PBT, SMALL_CFR, SMALL_LEAGUE, SYNC_MARL

from flows.tracking import layout

pytestmark = pytest.mark.end_to_end

PSRO = str(Path(sys.executable).with_name("psro"))
RUNS: list[str] = []  # the run tracked to the stack, which the stack brought up again must still hold
# The module's stack runs with `--auth`: its servers ask for these, which every client here sends
# from the environment (the test process's own too, set by the `stack` fixture).
SECRETS = ("prefect-secret-0517", "mlflow-secret-0517")
CREDENTIALS = {
    "PREFECT_API_AUTH_STRING": f"team:{SECRETS[0]}",
    "MLFLOW_TRACKING_USERNAME": "team",
    "MLFLOW_TRACKING_PASSWORD": SECRETS[1],
}


def _env(credentials: bool = True) -> dict[str, str]:
    own = ("PREFECT_", "RAY_", "PSRO_", "MLFLOW_")
    return {key: value for key, value in os.environ.items() if not key.startswith(own)} | (
        CREDENTIALS if credentials else {}
    )


def _stack(directory: Path, *args: str, timeout: float = 300, credentials: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PSRO, "stack", *args, "--dir", str(directory)],
        env=_env(credentials),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def stack():
    parent = Path(tempfile.mkdtemp(prefix="psro-stack-test-", dir="/tmp"))
    parent.chmod(0o755)
    directory = parent / "stack"
    try:
        started = _stack(directory, "up", "--workers", "1", "--auth")
        assert started.returncode == 0, started.stdout + started.stderr
        with pytest.MonkeyPatch.context() as patch:
            for key, value in CREDENTIALS.items():
                patch.setenv(key, value)
            yield directory, json.loads((directory / "stack.json").read_text()), started.stdout
    finally:
        _stack(directory, "down")
        with contextlib.suppress(OSError, ValueError):  # Ray's session files, outside DIR
            shutil.rmtree(json.loads((directory / "stack.json").read_text())["ray_temp_dir"])
        shutil.rmtree(parent, ignore_errors=True)


def _addresses(state: dict) -> dict[str, str]:
    ports = state["ports"]
    return {
        "prefect": f"http://127.0.0.1:{ports['prefect']}/api",
        "mlflow": f"http://127.0.0.1:{ports['mlflow']}",
        "ray": f"127.0.0.1:{ports['ray']}",
    }


def test_status_reports_every_service_up_and_each_answers(stack):
    from flows.services.prefect_server import healthy
    from flows.services.preflight import check_ray_address

    directory, state, printed = stack
    address = _addresses(state)
    for line in (f"--tracking-uri {address['mlflow']}", f"--ray-address {address['ray']}", address["prefect"]):
        assert line in printed, printed
    assert "password" not in (directory / "stack.json").read_text().lower()

    status = _stack(directory, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    rows = dict(line.split() for line in status.stdout.splitlines())
    assert rows == {
        name: "up" for name in ("postgres", "prefect-server", "mlflow", "ray-head", "ray-worker-1", "prefect-worker")
    }

    import psycopg2

    with psycopg2.connect(f"postgresql://psro@127.0.0.1:{state['ports']['postgres']}/postgres") as connection:
        with connection.cursor() as cursor:
            cursor.execute("SELECT datname FROM pg_database")
            assert {"prefect", "mlflow"} <= {row[0] for row in cursor.fetchall()}
    assert healthy(address["prefect"])
    assert healthy(address["mlflow"])
    check_ray_address(address["ray"])  # answers as Ray's GCS (gRPC)
    assert Prefect(address["prefect"])("read_work_pool", "psro-process").type == "process"


def test_the_mlflow_server_caches_credential_checks_and_runs_no_job_executors(stack):
    """MLflow reads the stack's auth config with its credential cache on (without it every
    request costs the server a scrypt check of the password), and the server started none of
    its GenAI job consumers."""
    import warnings

    from flows.services.stack import MLFLOW_AUTH_CACHE_S

    with warnings.catch_warnings():  # importing mlflow.server warns of starlette's WSGI middleware
        warnings.simplefilter("ignore")
        from mlflow.server.auth.config import read_auth_config

    directory, _, _ = stack
    commands = processes_with_env(f"PSRO_STACK={directory}")
    assert any("mlflow" in command for command in commands), commands
    assert not [command for command in commands if "huey" in command]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(directory / "mlflow-auth.ini"))
        config = read_auth_config()
    assert config.auth_cache_ttl_seconds == MLFLOW_AUTH_CACHE_S > 0
    assert config.authorization_function == "mlflow.server.auth:authenticate_request_basic_auth"


def _status_without_credentials(url: str, body: bytes | None = None) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_servers_refuse_requests_without_credentials(stack, tmp_path):
    """`up --auth`: both servers answer 401 to a request without credentials, and a run without
    them stops in one line before it starts anything."""
    _, state, _ = stack
    address = _addresses(state)
    assert _status_without_credentials(f"{address['prefect']}/flows/filter", b"{}") == 401
    assert _status_without_credentials(f"{address['mlflow']}/api/2.0/mlflow/experiments/search?max_results=1") == 401

    flags = ["--game", "kuhn_poker", "--iterations", "1", "--num-cpus", "1"]
    flags += ["--tracking-uri", address["mlflow"], "--ray-address", address["ray"]]
    env = dict(_env(credentials=False), PREFECT_API_URL=address["prefect"], RAY_AUTH_MODE="token")
    for given, line in [
        (
            {},
            f"error: tracking_uri='{address['mlflow']}': the server asks for credentials (401): "
            "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD",
        ),
        (
            {**CREDENTIALS, "PREFECT_API_AUTH_STRING": "team:wrong"},
            f"error: PREFECT_API_URL='{address['prefect']}': the server refused PREFECT_API_AUTH_STRING (401)",
        ),
    ]:
        run = subprocess.run([PSRO, "run", *flags], env=env | given, cwd=tmp_path, capture_output=True, text=True)
        assert run.returncode == 2 and run.stderr.strip().splitlines() == [line], run.stdout + run.stderr
    assert list(tmp_path.iterdir()) == []
    # that no secret is stored anywhere is checked once every run of the module has run
    # (`_assert_no_secret_stored`, at the end of the every-scenario test)


# Long enough for Prefect's task-run recorder to drop what it could not write (5 writes, 1 s apart)
POSTGRES_DOWN = 8.0


def test_prefect_waits_out_a_postgresql_restart_and_loses_no_task_run_of_it(stack, tmp_path):
    """While its database refuses connections the Prefect server answers 503, which clients
    retry (Prefect's own answer is 500, which they do not), and keeps the task-run events it
    cannot write until the database is back (Prefect's recorder drops one after 5 failed writes,
    a second apart): a request made in the outage is answered once PostgreSQL is back, and the
    tasks a flow ran in the outage reach Prefect Completed (`flows.services.patches`)."""
    from concurrent.futures import ThreadPoolExecutor

    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    directory, state, _ = stack
    prefect = _addresses(state)["prefect"]
    script = Path(__file__).with_name("outage_flow.py")
    env = _env() | {"PREFECT_API_URL": prefect}
    log = tmp_path / "flow.log"
    with open(log, "w") as out:
        flow = subprocess.Popen([sys.executable, str(script), str(tmp_path), "3"], env=env, stdout=out, stderr=out)
    try:
        wait_until(lambda: (tmp_path / "ready").exists() or flow.poll() is not None, 120, "the flow's first task")
        assert flow.poll() is None, log.read_text()[-3000:]
        stopped = _stack(directory, "stop", "postgres")
        assert stopped.stdout.strip() == "stopped postgres", stopped.stdout + stopped.stderr
        down = time.monotonic()
        (tmp_path / "go").touch()
        with temporary_settings({PREFECT_API_URL: prefect, PREFECT_CLIENT_MAX_RETRIES: 0}):
            with get_client(sync_client=True) as client, pytest.raises(PrefectHTTPStatusError) as refused:
                client.read_work_pool("psro-process")
        assert refused.value.response.status_code == 503, refused.value
        wait_until(lambda: (tmp_path / "ran").exists() or flow.poll() is not None, 60, "the tasks of the outage")
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(Prefect(prefect), "read_work_pool", "psro-process")
            time.sleep(max(0.0, down + POSTGRES_DOWN - time.monotonic()))  # the outage itself: nothing to poll
            assert not waiting.done(), waiting.exception()
            started = _stack(directory, "start", "postgres")
            assert started.stdout.strip() == "started postgres", started.stdout + started.stderr
            assert waiting.result(timeout=90).type == "process"
        assert flow.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        _stack(directory, "start", "postgres")  # already up again unless an assertion failed above
        if flow.poll() is None:
            flow.kill()
    flow_run_id = (tmp_path / "ready").read_text()

    def recorded() -> list:
        tasks = Prefect(prefect).task_runs([flow_run_id])
        return tasks if len(tasks) == 4 and all(task.state.is_completed() for task in tasks) else []

    wait_until(recorded, 30, "the flow's four task runs to reach Prefect Completed")


def _assert_no_secret_stored(directory: Path, state: dict, client, run_ids) -> None:
    """Neither secret in any file of the stack's directory or Ray's session, nor in any run's
    params and tags."""
    stored = [directory, Path(state["ray_temp_dir"])]
    files = [path for folder in stored for path in folder.rglob("*") if path.is_file() and not path.is_socket()]
    holding = [str(path) for path in files for secret in SECRETS if secret.encode() in path.read_bytes()]
    assert files and holding == []
    for run_id in run_ids:
        logged = client.get_run(run_id).data
        assert not any(secret in json.dumps([logged.params, logged.tags]) for secret in SECRETS)


# --- faults: one exact PSRO run on the stack, each fault at a commit it is held at -------------
#
# The run (Kuhn poker, exact best responses, Nash meta-solver) is held just before committing
# iteration K (tests/fault_injection: `PSRO_TEST_HOLD_AT_COMMIT`): the test fails a service, lets
# the run go on into the outage, brings the service back with `psro stack start`, and measures
# how long after that the held iteration's commit reaches MLflow. After the last fault the run
# dies by SIGKILL just before its next commit and `psro resume` continues it from the command
# line. The last test checks what a fault or the kill could have lost: every iteration's metrics
# once, every member's registry version once, the iterations completed in Prefect, and the
# exploitability of an uninterrupted run of the same config.
FAULTED_ITERATIONS = 6  # its exploitability then is still well above zero
KILLED_AT = 5  # the commit the faulted run dies just before, after its four faults
PREFECT_OUTAGE, MLFLOW_OUTAGE, POSTGRES_OUTAGE = 30.0, 60.0, 10.0  # seconds each service stays down
RECOVERED: dict[str, tuple[float, float]] = {}  # fault -> (outage, seconds from back to the commit)


class FaultedRun:
    """The run the faults hit, started by `psro run` in the background, held at commits 1-4 and
    killed at the fifth."""

    def __init__(self, stack_state: dict, folder: Path):
        address = _addresses(stack_state)
        self.holds = folder / "holds"
        self.holds.mkdir()
        self.cwd = folder / "cwd"
        self.cwd.mkdir()
        self.env = _env() | {"PREFECT_API_URL": address["prefect"], "RAY_AUTH_MODE": "token"}
        seam = {
            "PYTHONPATH": str(FAULT_INJECTION),
            "PSRO_TEST_HOLD_AT_COMMIT": "1,2,3,4",
            "PSRO_TEST_HOLD_DIR": str(self.holds),
            "PSRO_TEST_KILL_AT_COMMIT": str(KILLED_AT),
        }
        flags = ["--game", "kuhn_poker", "--iterations", str(FAULTED_ITERATIONS), "--num-cpus", "1"]
        flags += ["--tracking-uri", address["mlflow"], "--ray-address", address["ray"], "--experiment", "faults"]
        self.log = folder / "run.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                [PSRO, "run", *flags], env=self.env | seam, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT
            )
        self.tracking_uri = address["mlflow"]
        self.ray_address = address["ray"]

    def output(self) -> str:
        return self.log.read_text()[-3000:]

    def held(self, index: int) -> None:
        wait_until(
            lambda: (self.holds / f"held-{index}").exists() or self.process.poll() is not None,
            300,
            f"the run to reach commit {index}",
        )
        assert self.process.poll() is None, self.output()

    def release(self, index: int) -> None:
        (self.holds / f"release-{index}").touch()

    def run(self):
        import mlflow

        client = mlflow.MlflowClient(tracking_uri=self.tracking_uri)
        (found,) = client.search_runs([client.get_experiment_by_name("faults").experiment_id])
        return client, found

    def committed(self, index: int, since: float) -> float:
        """Seconds from `since` until the run's commit tag names `index` (read from MLflow)."""

        def reached() -> bool:
            try:
                if int(self.run()[1].data.tags.get("psro.committed_iteration", -1)) >= index:
                    return True
            except Exception:  # the server itself may still be coming back
                pass
            assert self.process.poll() is None, self.output()  # a run that died commits nothing more
            return False

        wait_until(reached, 400, f"commit {index} to reach MLflow")
        return time.monotonic() - since

    def resume(self) -> subprocess.CompletedProcess:
        """`psro resume RUN_ID` from the command line, once the run has died at its commit."""
        assert self.process.wait(timeout=600) == -signal.SIGKILL, self.output()
        _, found = self.run()
        assert found.data.tags["psro.committed_iteration"] == str(KILLED_AT - 1)
        command = [PSRO, "resume", found.info.run_id, "--tracking-uri", self.tracking_uri]
        command += ["--ray-address", self.ray_address]
        return subprocess.run(command, env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def faulted_run(stack, tmp_path_factory):
    _, state, _ = stack
    run = FaultedRun(state, tmp_path_factory.mktemp("faulted"))
    yield run
    if run.process.poll() is None:
        run.process.kill()
        run.process.wait()


def test_fault_a_ray_worker_node_killed_mid_run_leaves_the_run_on_the_head(stack, faulted_run):
    _, state, _ = stack
    faulted_run.held(1)
    os.killpg(state["groups"]["ray-worker-1"], signal.SIGKILL)
    killed = time.monotonic()
    faulted_run.release(1)
    RECOVERED["Ray worker node killed (SIGKILL)"] = (0.0, faulted_run.committed(1, killed))


def _outage(stack, faulted_run: FaultedRun, index: int, service: str, seconds: float, fault: str) -> None:
    """Hold the run at commit `index`, stop `service`, let the run go on, start it again after
    `seconds`; record the seconds from its return to the held commit in MLflow as `fault`'s."""
    directory, _, _ = stack
    faulted_run.held(index)
    stopped = _stack(directory, "stop", service)
    assert stopped.stdout.strip() == f"stopped {service}", stopped.stdout + stopped.stderr
    faulted_run.release(index)
    time.sleep(seconds)  # the outage itself: nothing to poll for
    started = _stack(directory, "start", service)
    assert started.stdout.strip() == f"started {service}", started.stdout + started.stderr
    RECOVERED[fault] = (seconds, faulted_run.committed(index, time.monotonic()))


def test_fault_the_prefect_server_down_for_30_s(stack, faulted_run):
    """Released into the outage, the run's driver begins iteration 4's subflow while the server is
    down (iteration 3's ran while it was held): that subflow's first request is refused until the
    server is back, and is retried (`flows.services.patches`: a new client of a server the process has
    reached retries as Prefect's first one would; without that the run died there). Iterations
    0-4 and all their tasks then reach Prefect Completed."""
    _, state, _ = stack
    _outage(stack, faulted_run, 2, "prefect-server", PREFECT_OUTAGE, "Prefect server stopped 30 s")
    prefect = Prefect(_addresses(state)["prefect"])
    flow_run_id = faulted_run.run()[1].data.tags[layout.FLOW_RUN_TAG]
    wait_until(lambda: _iterations_completed(prefect, flow_run_id, 5), 120, "iterations 0-4 to reach Prefect")


def _iterations_completed(prefect: Prefect, flow_run_id: str, count: int) -> bool:
    """Whether iterations 0..count-1 of the flow run, and every task of theirs, ended Completed."""
    iterations = {run.parameters["index"]: run for run in prefect.subflows(flow_run_id)}
    if not all(k in iterations and iterations[k].state.is_completed() for k in range(count)):
        return False
    tasks = prefect.task_runs(iterations[k].id for k in range(count))
    return bool(tasks) and all(task.state.is_completed() for task in tasks)


def test_fault_the_mlflow_server_down_for_60_s(stack, faulted_run):
    """The run's tracker waits for the server (`flows.tracking.patient`) and says so."""
    _outage(stack, faulted_run, 3, "mlflow", MLFLOW_OUTAGE, "MLflow server stopped 60 s")
    said = re.findall(r"MLflow at \S+ (did not answer|answered) \w+", faulted_run.log.read_text())
    assert said[:2] == ["did not answer", "answered"], faulted_run.output()


def test_fault_postgresql_restarted(stack, faulted_run):
    _outage(stack, faulted_run, 4, "postgres", POSTGRES_OUTAGE, "PostgreSQL stopped 10 s")


def test_the_faulted_run_killed_and_resumed_lost_nothing_and_ends_as_an_uninterrupted_one(stack, faulted_run):
    from mlflow_reads import registered_members

    from marl_core.psro.config import PSROConfig
    from marl_core.psro.steps import iterate_psro_local

    directory, _, _ = stack
    resumed = faulted_run.resume()
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    client, found = faulted_run.run()
    assert found.info.status == "FINISHED"
    assert found.data.tags["psro.committed_iteration"] == str(FAULTED_ITERATIONS)
    assert list(faulted_run.cwd.iterdir()) == []  # no mlflow.db, no mlruns: everything went to the servers
    assert found.info.artifact_uri.startswith("mlflow-artifacts:")  # through the server, into its store
    stored = directory / "artifacts" / found.info.experiment_id / found.info.run_id / "artifacts"
    assert (stored / "payoffs" / "final.csv").exists(), sorted(stored.rglob("*"))
    history = client.get_metric_history(found.info.run_id, "exploitability")
    assert sorted(metric.step for metric in history) == list(range(FAULTED_ITERATIONS + 1))  # each once
    assert_each_metric_once(client, found)
    assert_each_version_once(client, found.info.run_id)
    for player in ("player_0", "player_1"):  # one version per member, the one the kill orphaned replaced
        assert registered_members(client, "faults", player) == [(m, m) for m in range(FAULTED_ITERATIONS + 1)]

    *_, (reference, _) = iterate_psro_local(PSROConfig(game="kuhn_poker", iterations=FAULTED_ITERATIONS))
    assert found.data.metrics["exploitability"] == pytest.approx(reference.exploitability, abs=1e-9)

    # the first attempt's iterations, faults and all, reached Prefect completed
    prefect = Prefect(_addresses(json.loads((directory / "stack.json").read_text()))["prefect"])
    assert _iterations_completed(prefect, found.data.tags[layout.FLOW_RUN_TAG], KILLED_AT)
    started = _stack(directory, "start", "ray-worker-1")  # the node the first fault killed
    assert started.stdout.strip() == "started ray-worker-1", started.stdout + started.stderr
    for fault, (outage, recovered) in RECOVERED.items():
        print(f"{fault}: down {outage:.0f} s, its commit arrived {recovered:.1f} s after it was back")
    RUNS.append(found.info.run_id)


# prefect.yaml's deployment of each scenario -> (scenario, the config it is triggered with: small
# ones, each committing step 3 last). A run killed and resumed on the stack is the faulted one
# above; every scenario's killed and retried run is tests/test_scenarios.py's.
LOAD = {
    "psro/kuhn-smoke": ("psro", {"game": "kuhn_poker", "meta_solver": "nash", "iterations": 3}),
    "marl/spread-ippo-nightly": ("marl", SYNC_MARL),
    "league/kuhn-league": ("league", SMALL_LEAGUE),
    "pbt/spread-pbt-weekly": ("pbt", PBT),
    "cfr/leduc-neural": ("cfr", SMALL_CFR),
}
SCENARIO_RUNS: dict[str, str] = {}  # scenario -> its MLflow run id on the stack, for the UIs' screenshots


def test_every_scenario_at_once_from_the_stacks_work_pool(stack):
    """prefect.yaml deployed to the stack's pool (`prefect deploy --all`, as docs/operations.md
    tells a team) and one deployment of each scenario triggered at once: the stack's worker runs
    all of them together. Every run ends FINISHED at its last step, each metric logged once per
    step, each registry version registered once, its artifacts through the server; and after
    all the module's runs neither secret is stored anywhere."""
    import mlflow

    from flows.scenarios import SCENARIOS

    directory, state, _ = stack
    address = _addresses(state)
    env = dict(_env(), PREFECT_API_URL=address["prefect"])
    root = Path(__file__).resolve().parents[1]

    def prefect_cli(*args: str) -> subprocess.CompletedProcess:
        command = [str(Path(sys.executable).with_name("prefect")), *args]
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    assert {scenario for scenario, _ in LOAD.values()} == set(SCENARIOS), "a scenario without a deployment here"
    prefect_cli("--no-prompt", "deploy", "--all")
    prefect_cli("deployment", "schedule", "pause", "--all")  # no nightly run may start during the suite
    common = {"tracking_uri": address["mlflow"], "ray_address": address["ray"], "num_cpus": 1}
    flow_runs = {}
    for deployment, (scenario, config) in LOAD.items():
        placed = SCENARIOS[scenario].with_common(config, {**common, "experiment": f"load-{scenario}"})
        triggered = prefect_cli("deployment", "run", deployment, "--params", json.dumps({"config": placed}))
        flow_runs[scenario] = re.search(r"UUID: ([0-9a-f-]{36})", triggered.stdout).group(1)

    prefect = Prefect(address["prefect"])
    client = mlflow.MlflowClient(tracking_uri=address["mlflow"])
    for scenario, flow_run_id in flow_runs.items():
        ended = prefect.final_state(flow_run_id, 600)
        assert ended.is_completed(), (scenario, ended)

    def run_of(scenario: str):
        (found,) = client.search_runs([client.get_experiment_by_name(f"load-{scenario}").experiment_id])
        return found

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
    SCENARIO_RUNS["marl"] = run_of("marl").info.run_id
    SCENARIO_RUNS["psro"] = RUNS[0]  # the faulted run
    _assert_no_secret_stored(
        directory, state, client, [*RUNS, *(run_of(scenario).info.run_id for scenario in flow_runs)]
    )


def test_down_leaves_nothing_is_safe_twice_and_up_brings_the_data_back(stack):
    import mlflow

    directory, state, _ = stack
    marker = f"PSRO_STACK={directory}"
    assert processes_with_env(marker)  # the marker finds the stack's processes
    stopped = _stack(directory, "down")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert_all_exited(marker, timeout=10)
    assert not (directory / "postgres" / "postmaster.pid").exists()  # PostgreSQL's processes rename themselves
    for service in ("prefect-worker", "mlflow", "prefect-server", "ray-worker-1", "ray-head", "postgres"):
        assert f"stopped {service}" in stopped.stdout, stopped.stdout
    status = _stack(directory, "status")
    assert status.returncode == 1 and "up" not in status.stdout.split()

    again = _stack(directory, "down")
    assert again.returncode == 0 and again.stdout.strip() == "nothing was running", again.stdout + again.stderr

    started = _stack(directory, "up")  # without --auth: the servers take requests from anyone
    assert started.returncode == 0, started.stdout + started.stderr
    address = _addresses(json.loads((directory / "stack.json").read_text()))
    assert _status_without_credentials(f"{address['prefect']}/flows/filter", b"{}") == 200
    client = mlflow.MlflowClient(tracking_uri=address["mlflow"])
    for run_id in RUNS:
        assert client.get_run(run_id).info.status == "FINISHED"
        assert client.list_artifacts(run_id, "payoffs")


def test_the_stacks_uis_show_the_runs_of_both_scenarios(stack, tmp_path):
    """For a person to look at (test-artifacts/screenshots/): the stack's Prefect UI and MLflow UI,
    brought back by `up` (without --auth) after `down`, each showing the PSRO and the MARL run."""
    import mlflow
    from headless_browser import chromium_page, close_mlflow_assistant, shoot, wait_for_text

    from flows.tracking.layout import mlflow_run_link

    directory, _, _ = stack
    address = _addresses(json.loads((directory / "stack.json").read_text()))
    client = mlflow.MlflowClient(tracking_uri=address["mlflow"])
    prefect = Prefect(address["prefect"])
    with chromium_page(tmp_path / "profile") as page:
        for scenario, run_id in SCENARIO_RUNS.items():
            run = client.get_run(run_id)
            flow_run = prefect("read_flow_run", run.data.tags["prefect.flow_run_id"])
            page.goto(f"{address['prefect'].removesuffix('/api')}/runs/flow-run/{flow_run.id}")
            wait_for_text(page, flow_run.name)
            shoot(page, f"30-stack-prefect-{scenario}")
            page.goto(mlflow_run_link(address["mlflow"], run.info.experiment_id, run_id))
            wait_for_text(page, run.info.run_name)
            close_mlflow_assistant(page)
            shoot(page, f"31-stack-mlflow-{scenario}")
    assert set(SCENARIO_RUNS) == {"psro", "marl"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers", "0"], "error: workers=0: needs 1 or more (0 with --host, where worker hosts join)"),
        (
            ["--host", "127.0.0.2"],
            "error: host=127.0.0.2: serving beyond 127.0.0.1 needs --auth (else anyone who reaches it may use it)",
        ),
        (["--host", "head"], "error: host='head': expected an IPv4 address of this machine, such as 10.0.0.5"),
        (
            ["--host", "0.0.0.0", "--auth"],
            "error: host='0.0.0.0': expected one address of this machine (not every address, not multicast)",
        ),
        (  # TEST-NET-1, documentation's own: never this machine's
            ["--host", "192.0.2.1", "--auth"],
            "error: host=192.0.2.1: not an address of this machine (nothing can listen there)",
        ),
        (
            ["--auth"],
            "error: auth: PREFECT_API_AUTH_STRING, MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD unset; "
            "--auth takes the servers' credentials from them",
        ),
        (
            ["--workers", "two"],
            "error: workers='two': Input should be a valid integer, unable to parse string as an integer",
        ),
    ],
)
def test_bad_input_fails_in_one_line_before_anything_starts(tmp_path, args, message):
    directory = tmp_path / "stack"
    result = _stack(directory, "up", *args, timeout=120, credentials=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert not directory.exists()


RAY_TOKEN = "ray-token-0517-" + "x" * 24


@pytest.mark.parametrize(
    "args, credentials, message",
    [
        (["head"], True, "error: head='head': expected an IPv4 address, such as 10.0.0.5"),
        (["127.0.0.2", "--cpus", "0"], True, "error: cpus=0: needs 1 or more"),
        (
            ["127.0.0.2"],
            False,
            "error: auth: PREFECT_API_AUTH_STRING, MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD, "
            "RAY_AUTH_TOKEN unset; --auth takes the servers' credentials from them",
        ),
        (
            ["127.0.0.2", "--host", "192.0.2.1"],
            True,
            "error: host=192.0.2.1: not an address of this machine (nothing can listen there)",
        ),
    ],
)
def test_join_refuses_bad_input_in_one_line_before_anything_starts(tmp_path, args, credentials, message):
    directory = tmp_path / "worker"
    env = _env(credentials) | ({"RAY_AUTH_TOKEN": RAY_TOKEN} if credentials else {})
    result = subprocess.run(
        [PSRO, "stack", "join", *args, "--dir", str(directory)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert not directory.exists()


def test_join_names_the_head_that_does_not_answer(tmp_path):
    """Nothing listens on 127.0.0.9: `join` says so in one line and starts nothing."""
    from flows.services.stack import HOST_PORTS

    directory = tmp_path / "worker"
    env = _env() | {"RAY_AUTH_TOKEN": RAY_TOKEN}
    result = subprocess.run(
        [PSRO, "stack", "join", "127.0.0.9", "--host", "127.0.0.8", "--dir", str(directory)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    asked = f"Prefect at http://127.0.0.9:{HOST_PORTS['prefect']}/api, Ray at 127.0.0.9:{HOST_PORTS['ray']}"
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: head=127.0.0.9: no stack answers there (asked {asked})"]
    assert not directory.exists()
