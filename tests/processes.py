"""Finding the processes a test started, and only those: the machine may run other Ray or Prefect
instances, so tests mark their own by an environment entry every child inherits (a temporary
PREFECT_HOME or RAY_TMPDIR) instead of matching process names."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def pids_with_env(entry: str) -> list[int]:
    """Live (not zombie) processes whose environment holds ``entry`` (``KEY=value``)."""
    if "=" not in entry:  # a bare value matches no entry, and every check on it would pass
        raise ValueError(f"entry={entry!r}: an environment entry is KEY=value")
    found = []
    for proc in Path("/proc").iterdir():
        try:
            zombie = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            if not zombie and entry.encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def command_line(pid: int) -> str | None:
    """The process's whole command line, or None once it has gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def processes_with_env(entry: str) -> list[str]:
    """Command lines (their first 120 characters) of live (not zombie) processes whose
    environment holds ``entry``."""
    return [command[:120] for pid in pids_with_env(entry) if (command := command_line(pid)) is not None]


def start_bare_ray(temp_dir: Path) -> None:
    """A local Ray for tests that need Ray without a run, started as a run starts its own
    (`flows.services.ray_session.start_ray`: no cluster services), with its files in ``temp_dir``."""
    import ray

    from flows.services.patches import ray_agents_on_chosen_ports, ray_without_cluster_services

    with ray_agents_on_chosen_ports(), ray_without_cluster_services():
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=128 * 2**20,
            _temp_dir=str(temp_dir),
            log_to_driver=False,
        )


@contextlib.contextmanager
def bare_ray_shipping(module: str, temp_dir: Path) -> Iterator[None]:
    """`start_bare_ray`, with test module `module` sent to Ray's workers by value (they cannot
    import a test module, and its classes and functions run there); stopped on exit."""
    import ray
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[module])
    start_bare_ray(temp_dir)
    try:
        yield
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[module])


def assert_all_exited(entry: str, timeout: float = 30) -> None:
    """Wait for every marked process to exit (shutdowns take a moment); fail naming the rest."""
    deadline = time.monotonic() + timeout
    while (leftovers := processes_with_env(entry)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers, leftovers


def poll(read: Callable[[], T], done: Callable[[T], bool], timeout: float = 30) -> T:
    """Read until `done` holds or the deadline passes; returns the last reading either way, so
    the caller's assertion on it names what was still missing."""
    deadline = time.monotonic() + timeout
    while not done(value := read()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return value


def wait_until(predicate: Callable[[], T], timeout: float, what: str) -> T:
    """Poll `predicate` until it returns something truthy, and return that; fail naming `what`
    once the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Prefect:
    """Prefect's client on a test's server (settings are swapped in per call: the test process
    must not pick up a server from its environment, nor its credentials, which Prefect reads
    once per process). `prefect("read_flow_run", id)` calls the sync client's method."""

    def __init__(self, api_url: str, auth_string: str | None = None):
        self.api_url = api_url
        self.auth_string = auth_string  # "USER:PASSWORD" for a server that asks for it

    def __call__(self, method: str, *args, **kwargs):
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

        settings = {PREFECT_API_URL: self.api_url, PREFECT_API_AUTH_STRING: self.auth_string}
        with temporary_settings({key: value for key, value in settings.items() if value is not None}):
            with get_client(sync_client=True) as client:
                return getattr(client, method)(*args, **kwargs)

    def deployment(self, name: str):
        """The deployment `FLOW/NAME`, or None while it is not registered."""
        from prefect.exceptions import ObjectNotFound

        try:
            return self("read_deployment_by_name", name)
        except ObjectNotFound:
            return None

    def subflows(self, flow_run_id) -> list:
        """The flow runs whose parent is a task of the flow run `flow_run_id` (its steps)."""
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

        parent = FlowRunFilterParentFlowRunId(any_=[flow_run_id])
        return self("read_flow_runs", flow_run_filter=FlowRunFilter(parent_flow_run_id=parent))

    def task_runs(self, flow_run_ids) -> list:
        """The task runs of the flow runs `flow_run_ids`."""
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        return self("read_task_runs", flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(flow_run_ids))))

    def final_state(self, flow_run_id, timeout: float):
        def ended():
            state = self("read_flow_run", flow_run_id).state
            return state if state.is_final() else None

        return wait_until(ended, timeout, f"flow run {flow_run_id} to end")


@functools.cache
def _migrated_prefect_home() -> Path:
    """Made once per test process, by a real server start; removed when the process exits."""
    from flows.services.prefect_server import LocalPrefectServer

    template = Path(tempfile.mkdtemp(prefix="prefect-home-"))
    atexit.register(shutil.rmtree, template, True)
    server = LocalPrefectServer(template, one_run=True)
    try:
        server.wait()
    finally:
        server.stop()
    (template / "server.log").unlink()
    return template


def prefect_home(path: Path) -> Path:
    """A Prefect home of its own at `path`, with its database already migrated (a copy). A
    server started on a fresh home first creates its database and registers its block types,
    which takes seconds; a user's runs share one home (~/.prefect) and pay that once. A test
    that must see a home created from nothing gives the server a path that does not exist."""
    shutil.copytree(_migrated_prefect_home(), path)
    return path


@functools.cache
def _empty_mlflow_store() -> Path:
    """Made once per test process, in a process of its own started in the template's folder:
    the store's default experiment keeps the artifact folder of the directory it was made in."""
    import subprocess
    import sys

    template = Path(tempfile.mkdtemp(prefix="mlflow-store-"))
    atexit.register(shutil.rmtree, template, True)
    create = "import mlflow, sys; mlflow.MlflowClient(tracking_uri=sys.argv[1]).search_experiments()"
    subprocess.run(
        [sys.executable, "-c", create, f"sqlite:///{template}/mlflow.db"], cwd=template, check=True, capture_output=True
    )
    return template / "mlflow.db"


def mlflow_store(directory: Path) -> str:
    """The URI of an MLflow SQLite store in `directory` whose tables already exist (a copy): a
    new store runs every one of MLflow's schema migrations first, which takes seconds; a user's
    runs share one store."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_empty_mlflow_store(), directory / "mlflow.db")
    return f"sqlite:///{directory}/mlflow.db"


@dataclasses.dataclass
class FinishedRun:
    """A finished `psro run`: its output, and when each line of its standard output came."""

    stdout: str
    stderr: str
    timed_lines: list[tuple[float, str]]  # (time.monotonic() when read, line)


def run_config(work: Path, config_text: str, *flags: str, timeout: float = 600, env: dict | None = None) -> FinishedRun:
    """`psro run` on `config_text` (written to work/run.yaml) in a clean environment (plus `env`)
    with its own Prefect home, MLflow in work/mlflow.db and two CPUs; asserts it succeeded and
    left no process behind. Its standard output is read as it comes (not a terminal: progress
    shows as plain lines)."""
    import os
    import subprocess
    import sys
    import threading

    (work / "run.yaml").write_text(config_text)
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_"))}
    clean.update(env or {}, PREFECT_HOME=str(prefect_home(work / "prefect-home")))
    command = [
        str(Path(sys.executable).with_name("psro")),
        "run",
        "--config",
        "run.yaml",
        "--num-cpus",
        "2",
        "--tracking-uri",
        mlflow_store(work),
        *flags,
    ]
    process = subprocess.Popen(command, cwd=work, env=clean, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    timed: list[tuple[float, str]] = []
    errors: list[str] = []
    readers = [
        threading.Thread(target=lambda: timed.extend((time.monotonic(), line.rstrip("\n")) for line in process.stdout)),
        threading.Thread(target=lambda: errors.extend(process.stderr)),
    ]
    for reader in readers:
        reader.start()
    try:
        returncode = process.wait(timeout=timeout)
    finally:
        process.kill()
        for reader in readers:
            reader.join()
    finished = FinishedRun("\n".join(line for _, line in timed), "".join(errors), timed)
    assert returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert_all_exited(f"PREFECT_HOME={work / 'prefect-home'}")
    return finished


FAULT_INJECTION = Path(__file__).resolve().parent / "fault_injection"


def killed_at_commit(env: dict, step: int) -> dict:
    """`env` for a process that dies by SIGKILL just before it commits `step`, whatever the
    scenario (`tests/fault_injection/sitecustomize.py`, the suite's one fault-injection seam)."""
    path = os.pathsep.join(p for p in (str(FAULT_INJECTION), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, "PSRO_TEST_KILL_AT_COMMIT": str(step)}


def start_psro_server(argv: list[str], work: Path, env: dict, log: Path, up: Callable[[], object], **popen):
    """`psro server` (`argv`) started in `work`, its output in `log`, waited for until `up()`
    answers; stopped (SIGTERM, it stops what it started) where it does not come up."""
    with log.open("w") as out:
        server = subprocess.Popen(argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, **popen)
    try:
        wait_until(lambda: up() or server.poll() is not None, 180, "the psro server to come up")
    except AssertionError:
        server.terminate()
        server.wait(timeout=60)
        raise
    return server
