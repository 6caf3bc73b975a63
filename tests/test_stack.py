"""`psro stack up|status|down`: the team's services (PostgreSQL, Prefect, MLflow, Ray, a Prefect
worker) brought up by the real command, with `--auth`; the servers refuse requests without
credentials, and one exact PSRO run on the stack survives each service failed under it.

One stack serves every test of the module (starting it is the slow part); the tests run in file
order. `test_stack_load.py` runs four scenarios at once on a stack of its own (`team_stack.py`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from processes import FAULT_INJECTION, Prefect, wait_until
from team_stack import (
    CREDENTIALS,
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


def test_status_reports_every_service_up_and_each_answers(stack):
    from flows.preflight import check_ray_address
    from flows.services import healthy

    directory, state, printed = stack
    address = addresses(state)
    for line in (f"--tracking-uri {address['mlflow']}", f"--ray-address {address['ray']}", address["prefect"]):
        assert line in printed, printed
    assert "password" not in (directory / "stack.json").read_text().lower()

    status = stack_command(directory, "status")
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


def test_the_servers_refuse_requests_without_credentials(stack, tmp_path):
    """`up --auth`: both servers answer 401 to a request without credentials, and a run without
    them stops in one line before it starts anything."""
    _, state, _ = stack
    address = addresses(state)
    assert status_without_credentials(f"{address['prefect']}/flows/filter", b"{}") == 401
    assert status_without_credentials(f"{address['mlflow']}/api/2.0/mlflow/experiments/search?max_results=1") == 401

    flags = ["--game", "kuhn_poker", "--iterations", "1", "--num-cpus", "1"]
    flags += ["--tracking-uri", address["mlflow"], "--ray-address", address["ray"]]
    env = dict(stack_env(credentials=False), PREFECT_API_URL=address["prefect"], RAY_AUTH_MODE="token")
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
    # that no secret is stored anywhere is checked once the module's run has ended
    # (`assert_no_secret_stored`, at the end of the faulted run's last test)


# --- faults: one exact PSRO run on the stack, each fault at a commit it is held at -------------
#
# The run (Kuhn poker, exact best responses, Nash meta-solver) is held just before committing
# iteration K (tests/fault_injection: `PSRO_TEST_HOLD_AT_COMMIT`): the test fails a service, lets
# the run go on into the outage, brings the service back with `psro stack start`, and measures
# how long after that the held iteration's commit reaches MLflow. The last test checks what a
# fault could have lost: every iteration's metrics once, every member's registry version once,
# the flow run and its subflows completed in Prefect, and the exploitability of an uninterrupted
# run of the same config.
FAULTED_ITERATIONS = 5  # its exploitability then is still well above zero
PREFECT_OUTAGE, MLFLOW_OUTAGE, POSTGRES_OUTAGE = 30.0, 60.0, 10.0  # seconds each service stays down
RECOVERED: dict[str, tuple[float, float]] = {}  # fault -> (outage, seconds from back to the commit)


class FaultedRun:
    """The run the faults hit, started by `psro run` in the background, held at commits 1-4."""

    def __init__(self, stack_state: dict, folder: Path):
        address = addresses(stack_state)
        self.holds = folder / "holds"
        self.holds.mkdir()
        self.cwd = folder / "cwd"
        self.cwd.mkdir()
        env = stack_env() | {
            "PREFECT_API_URL": address["prefect"],
            "RAY_AUTH_MODE": "token",
            "PYTHONPATH": str(FAULT_INJECTION),
            "PSRO_TEST_HOLD_AT_COMMIT": "1,2,3,4",
            "PSRO_TEST_HOLD_DIR": str(self.holds),
        }
        flags = ["--game", "kuhn_poker", "--iterations", str(FAULTED_ITERATIONS), "--num-cpus", "1"]
        flags += ["--tracking-uri", address["mlflow"], "--ray-address", address["ray"], "--experiment", "faults"]
        self.log = folder / "run.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                [PSRO, "run", *flags], env=env, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT
            )
        self.tracking_uri = address["mlflow"]

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
            assert self.process.poll() in (None, 0), self.output()  # a run that died commits nothing more
            try:
                return int(self.run()[1].data.tags.get("psro.committed_iteration", -1)) >= index
            except Exception:  # the server itself may still be coming back
                return False

        wait_until(reached, 400, f"commit {index} to reach MLflow")
        return time.monotonic() - since


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
    stopped = stack_command(directory, "stop", service)
    assert stopped.stdout.strip() == f"stopped {service}", stopped.stdout + stopped.stderr
    faulted_run.release(index)
    time.sleep(seconds)  # the outage itself: nothing to poll for
    started = stack_command(directory, "start", service)
    assert started.stdout.strip() == f"started {service}", started.stdout + started.stderr
    RECOVERED[fault] = (seconds, faulted_run.committed(index, time.monotonic()))


def test_fault_the_prefect_server_down_for_30_s(stack, faulted_run):
    _outage(stack, faulted_run, 2, "prefect-server", PREFECT_OUTAGE, "Prefect server stopped 30 s")


def test_fault_the_mlflow_server_down_for_60_s(stack, faulted_run):
    """The run's tracker waits for the server (`flows.tracking.patient`) and says so."""
    _outage(stack, faulted_run, 3, "mlflow", MLFLOW_OUTAGE, "MLflow server stopped 60 s")
    said = re.findall(r"MLflow at \S+ (did not answer|answered) \w+", faulted_run.log.read_text())
    assert said[:2] == ["did not answer", "answered"], faulted_run.output()


def test_fault_postgresql_restarted(stack, faulted_run):
    _outage(stack, faulted_run, 4, "postgres", POSTGRES_OUTAGE, "PostgreSQL stopped 10 s")


def test_the_faulted_run_lost_nothing_and_ends_as_an_uninterrupted_one(stack, faulted_run):
    from marl_core.psro.config import PSROConfig
    from marl_core.psro.steps import iterate_psro_local

    directory, _, _ = stack
    assert faulted_run.process.wait(timeout=600) == 0, faulted_run.output()
    client, found = faulted_run.run()
    assert found.info.status == "FINISHED"
    assert found.data.tags["psro.committed_iteration"] == str(FAULTED_ITERATIONS)
    assert list(faulted_run.cwd.iterdir()) == []  # no mlflow.db, no mlruns: everything went to the servers
    assert found.info.artifact_uri.startswith("mlflow-artifacts:")  # through the server, into its store
    stored = directory / "artifacts" / found.info.experiment_id / found.info.run_id / "artifacts"
    assert (stored / "payoffs" / "final.csv").exists(), sorted(stored.rglob("*"))
    history = client.get_metric_history(found.info.run_id, "exploitability")
    assert sorted(metric.step for metric in history) == list(range(FAULTED_ITERATIONS + 1))  # each once
    versions = client.search_model_versions(f"run_id = '{found.info.run_id}'")
    for player in ("player_0", "player_1"):
        numbers = sorted(int(v.version) for v in versions if v.name == f"faults-kuhn_poker-{player}")
        assert numbers == list(range(1, FAULTED_ITERATIONS + 2)), numbers  # one per member, none twice

    *_, (reference, _) = iterate_psro_local(PSROConfig(game="kuhn_poker", iterations=FAULTED_ITERATIONS))
    assert found.data.metrics["exploitability"] == pytest.approx(reference.exploitability, abs=1e-9)

    prefect = Prefect(addresses(json.loads((directory / "stack.json").read_text()))["prefect"])
    flow_run = prefect("read_flow_run", found.data.tags["prefect.flow_run_id"])
    assert flow_run.state.is_completed(), flow_run.state
    started = stack_command(directory, "start", "ray-worker-1")  # the node the first fault killed
    assert started.stdout.strip() == "started ray-worker-1", started.stdout + started.stderr
    for fault, (outage, recovered) in RECOVERED.items():
        print(f"{fault}: down {outage:.0f} s, its commit arrived {recovered:.1f} s after it was back")
    assert_no_secret_stored(directory, json.loads((directory / "stack.json").read_text()), client, [found.info.run_id])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers", "0"], "error: workers=0: needs 1 or more"),
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
    result = stack_command(directory, "up", *args, timeout=120, credentials=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert not directory.exists()
