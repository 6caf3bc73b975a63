"""The services a run needs, started the way a user would start them, and always stopped.

- Prefect: when ``PREFECT_API_URL`` is unset, one real ``prefect server start`` on 127.0.0.1 and
  a free port (through `flows.patched_prefect_server`, which fixes SQLite lock contention).
  Prefect's temporary in-process server cannot be used: every Ray worker would start its own on
  the same SQLite file. A running `psro server` (`flows.psro_server`) is found and reused instead.
- Ray: a fresh local instance limited to this machine's cores (``address="local"`` so an
  unrelated running cluster is never joined by accident), or the cluster at ``--ray-address``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from flows.patches import no_ray_auto_init, quiet_ray_notices, ray_on_loopback, ray_without_cluster_services
from flows.reaper import MARKER, alive

SERVER_START_TIMEOUT = 120.0


# Ports for servers started here: above Ray's worker ports (10002-19999) and below the kernel's
# ephemeral range (32768 and up), where Ray picks every other port it opens. A port found free
# here is not bound until the server process has booted, seconds later; Ray, starting at the
# same time, must not take it meanwhile (it did once: the health check then read Ray's gRPC).
SERVER_PORTS = range(20000, 32768)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, from `SERVER_PORTS` where one is, else any the kernel gives."""
    for port in random.sample(SERVER_PORTS, 50):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def healthy(url: str) -> bool:
    """Whether the server at `url` (Prefect's API; the tests' `mlflow ui` too) answers its
    `/health` check (anything else on the port, HTTP or not, is not it)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except (OSError, http.client.HTTPException):
        return False


# Where a running `psro server` says what it started, for runs of the same Prefect home to reuse.
STATE_FILE = "psro-server.json"


@dataclasses.dataclass(frozen=True)
class RunningServer:
    prefect_api_url: str
    ray_address: str
    pid: int


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser().resolve()


def find_running_server(home: Path | None = None) -> RunningServer | None:
    """The `psro server` of this Prefect home, if one is up and answering; else None."""
    path = (home or prefect_home()) / STATE_FILE
    try:
        server = RunningServer(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return server if alive(server.pid) and healthy(server.prefect_api_url) else None


def _stop(process: subprocess.Popen) -> None:
    """Stop the server and everything it spawned (it runs in its own process group)."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)


# Services a server kept for one run does without: it schedules no deployments, runs no
# automations and outlives no worker, so their loops would only take CPU from the run.
ONE_RUN_SERVICES_OFF = ("SCHEDULER", "LATE_RUNS", "FOREMAN", "TRIGGERS", "PAUSE_EXPIRATIONS", "REPOSSESSOR")


# Prefect's task-run recorder writes each task-run event in its own transaction by default
# (batch size 1); a PSRO iteration sends about fifteen. Written in batches, flushed at least every
# second, they cost the server a fraction of the CPU and reach the UI within a second.
TASK_RUN_RECORDER_BATCHING = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
}


class LocalPrefectServer:
    """A `prefect server start` process on 127.0.0.1; `wait()` blocks until it answers.

    `one_run`: the server records a single run and stops with it (`ONE_RUN_SERVICES_OFF`).
    `database_url`: its database (the team's stack: PostgreSQL), else Prefect's SQLite in `home`.
    `detached`: it outlives the process that started it (the stack's, stopped by `psro stack
    down`); otherwise it stops itself once that process is gone. `extra_env`: more of its environment.
    """

    def __init__(
        self,
        home: Path,
        port: int | None = None,
        one_run: bool = False,
        database_url: str | None = None,
        detached: bool = False,
        extra_env: dict[str, str] | None = None,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        # The UI asks the API at PREFECT_UI_API_URL, which otherwise defaults to port 4200, not this one
        env = dict(
            os.environ,
            PREFECT_HOME=str(home),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_UI_API_URL=self.url,
            PSRO_SERVER_EXIT_WITH_PARENT="0" if detached else "1",  # a killed driver cannot stop it: it stops itself
            **TASK_RUN_RECORDER_BATCHING,
            **(extra_env or {}),
        )
        if database_url:
            env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
        if one_run:
            env.update({f"PREFECT_SERVER_SERVICES_{service}_ENABLED": "false" for service in ONE_RUN_SERVICES_OFF})
        self._log = open(home / "server.log", "ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flows.patched_prefect_server",
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self) -> None:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while not healthy(self.url):
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"Prefect server exited with code {self.process.returncode}; see {self.home / 'server.log'}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Prefect server did not answer within {SERVER_START_TIMEOUT:.0f} s; see {self.home / 'server.log'}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        _stop(self.process)
        self._log.close()


@contextlib.contextmanager
def reap_on_crash() -> Iterator[None]:
    """Mark this process's environment so that a watcher can stop everything started from here
    if this process dies without doing it itself (see `flows/reaper.py`)."""
    import uuid

    if MARKER in os.environ:  # an outer caller already watches this process
        yield
        return
    os.environ[MARKER] = uuid.uuid4().hex
    watcher = subprocess.Popen(
        [sys.executable, "-m", "flows.reaper", str(os.getpid()), os.environ[MARKER]],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        watcher.terminate()
        watcher.wait(timeout=10)
        os.environ.pop(MARKER, None)


@contextlib.contextmanager
def prefect_api(home: Path | None = None) -> Iterator[tuple[str, Callable[[], None]]]:
    """Yield the Prefect API URL and a function that waits until it answers.

    Uses ``PREFECT_API_URL`` when set, else the server of a running `psro server` for this
    Prefect home; otherwise starts a server and stops it on exit. The server boots while the
    caller starts other things; call the wait function before use.
    """
    configured = os.environ.get("PREFECT_API_URL")
    if configured:
        yield configured, lambda: None
        return
    # Prefect's own default home (~/.prefect): a plain `prefect server start` later shows these
    # runs, and the database migrations happen once per machine, not once per run.
    home = Path(home).expanduser().resolve() if home else prefect_home()
    running = find_running_server(home)
    if running:
        os.environ["PREFECT_API_URL"] = running.prefect_api_url
        try:
            yield running.prefect_api_url, lambda: None
        finally:
            _flush_prefect_clients()
            os.environ.pop("PREFECT_API_URL", None)
        return
    server = LocalPrefectServer(home, one_run=True)
    os.environ["PREFECT_API_URL"] = server.url
    try:
        yield server.url, server.wait
    finally:
        _flush_prefect_clients()
        os.environ.pop("PREFECT_API_URL", None)
        server.stop()


def _flush_prefect_clients() -> None:
    """Send queued logs and events while the server still listens."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):
            worker.drain_all(timeout=5)


@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int | None, env_vars: dict[str, str]) -> Iterator[None]:
    """Start or join Ray, with ``env_vars`` (the Prefect API URL) set in every worker.

    A local instance's workers inherit this process's environment; a cluster's workers get the
    variables through Ray's runtime environment, which costs an agent round trip per worker.
    """
    start_ray(address, num_cpus, env_vars)
    try:
        yield
    finally:
        stop_ray()


def start_ray(address: str | None, num_cpus: int | None, env_vars: dict[str, str], shared: bool = False) -> None:
    """Join the Ray at `address`, or start a local one. A run's own local Ray starts without
    the cluster services only a shared Ray needs (`flows.patches.ray_without_cluster_services`);
    ``shared``: a Ray that outlives the run, as a `psro server`'s, keeps them."""
    import ray

    quiet_ray_notices()
    no_ray_auto_init()
    if address:
        running = find_running_server()
        if running and running.ray_address == address:
            from ray._private.authentication.authentication_token_setup import (
                maybe_enable_token_auth_if_token_available,
            )

            # A `psro server`'s Ray was started by `ray.init()`, which turns token authentication
            # on; joining it by address needs what `ray.init(address="auto")` would do: take
            # the token Ray saved for this user. Other clusters keep Ray's own rules.
            maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        runtime_env = {"env_vars": env_vars} if env_vars else None
        # a Ray on this machine's loopback (a `psro server`'s, a test cluster's) is joined there
        on_loopback = address.rsplit(":", 1)[0] in ("127.0.0.1", "localhost")
        with ray_on_loopback() if on_loopback else contextlib.nullcontext():
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    else:
        os.environ.update(env_vars)
        lean = contextlib.nullcontext() if shared else ray_without_cluster_services()
        with ray_on_loopback(), lean:  # loopback only; a cluster is joined explicitly
            ray.init(
                address="local",
                num_cpus=num_cpus or os.cpu_count(),
                object_store_memory=512 * 1024 * 1024,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )


def ray_to_use(config_address: str | None, api_url: str) -> tuple[str | None, dict[str, str]]:
    """The Ray to start or join, and the variables its workers need: a running `psro server`'s
    Ray, when the run uses that server's Prefect API, already gives its workers the address."""
    running = None if config_address else find_running_server()
    if running and running.prefect_api_url == api_url:
        return running.ray_address, {}
    return config_address, {"PREFECT_API_URL": api_url}


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM ends the run as Ctrl-C does, so every context unwinds (Ray, the Prefect server,
    the MLflow run marked failed) and the run stays resumable; the process then exits with
    SIGTERM's status, 143.

    The handler raises Ctrl-C's own exception: a main thread waiting in `ray.get` runs signal
    handlers from inside Ray, which ends the wait on a KeyboardInterrupt as on Ctrl-C. A
    SystemExit raised there instead ended a bare `ray.get` with status 1, and left `psro league
    run` waiting on its generation's tasks for minutes (tests/test_stop_on_sigterm.py)."""
    terminated = False

    def handler(signum, frame):
        nonlocal terminated
        terminated = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except KeyboardInterrupt:
        if terminated:
            raise SystemExit(128 + signal.SIGTERM) from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def rearm_sigterm_handler() -> None:
    """Put Python's SIGTERM handler back where the operating system calls it. Ray's driver,
    started on another thread, installs its own failure handler for SIGTERM there: it printed a
    stack trace, and the process, though it unwound as on Ctrl-C, ended by SIGABRT (status 134).
    Python still reports its own handler, which setting it again reinstates. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGTERM)
    if handler is not None:  # None: a handler not set from Python, left as it is
        signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def ray_in_background(
    address: str | None, num_cpus: int | None, env_vars: dict[str, str], environment: str
) -> Iterator[Callable[[], None]]:
    """`ray_session`, started on a thread, with its workers warming up: the caller goes on with
    its own slow imports meanwhile. Yields a function that waits until Ray is up."""
    from concurrent.futures import ThreadPoolExecutor

    def start() -> None:
        start_ray(address, num_cpus, env_vars)
        warm_up_workers(environment)

    # Ray's serializers (on the thread, once the warm-up exports its function) and Prefect (in
    # the caller's imports meanwhile) both import pydantic.v1. Its modules import each other, and
    # a thread that enters that cycle while another is inside it gets a half-initialised module:
    # "cannot import name 'Field' from partially initialized module 'pydantic.v1.fields'" failed
    # a run once. Imported here first, it is whole before either thread asks for it.
    import pydantic.v1.fields  # noqa: F401

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ray-start") as thread:
        started = thread.submit(start)

        def wait_for_ray() -> None:
            started.result()
            rearm_sigterm_handler()

        try:
            yield wait_for_ray
        finally:
            with contextlib.suppress(Exception):
                started.result()  # never shut down under a start still in flight
            stop_ray()


def stop_ray() -> None:
    """Stop this process's Ray once no step's wait is inside it (`flows.task_steps.waits_ended`),
    and wait for its processes to exit (else it stops waiting for a slow one after about 2 s)."""
    import ray

    from flows.task_steps import waits_ended

    with waits_ended():
        ray.shutdown(wait_for_processes=True)


_stragglers: list = []  # futures of flow threads that must end before the Prefect API stops
STRAGGLER_TIMEOUT = 60.0


def finish_before_prefect_stops(*futures) -> None:
    """Have the run's exit wait for these threads (a subflow that was still working when the run
    failed) after Ray stops, which ends their work, and before the Prefect API stops.

    A subflow records its end through the API. Left for after the server stopped, its thread
    retries each request for a minute, several requests in a row: the interpreter, which joins
    such threads at exit, then hung for minutes after the run had failed.
    """
    _stragglers.extend(futures)


@contextlib.contextmanager
def stragglers_finished() -> Iterator[None]:
    from concurrent.futures import wait

    try:
        yield
    finally:
        pending = list(_stragglers)
        _stragglers.clear()
        wait(pending, timeout=STRAGGLER_TIMEOUT)


@dataclasses.dataclass(frozen=True)
class StartingServices:
    """The Prefect API and Ray of a run, both still starting; ``joined_ray`` is the address of a
    running `psro server`'s Ray the run joins, else None."""

    prefect_api_url: str
    wait_for_prefect: Callable[[], None]
    wait_for_ray: Callable[[], None]
    joined_ray: str | None

    @property
    def ui_line(self) -> str:
        reuse = f" (the running psro server's; Ray at {self.joined_ray})" if self.joined_ray else ""
        return f"Prefect UI during the run: {self.prefect_api_url.removesuffix('/api')}{reuse}"


@contextlib.contextmanager
def services_starting(ray_address: str | None, num_cpus: int | None, environment: str) -> Iterator[StartingServices]:
    """Start a run's Prefect API and Ray in the background (Ray's workers warming up on
    ``environment``), for every scenario's command: it goes on with its slow imports meanwhile,
    and everything stops on exit, a crash included."""
    with reap_on_crash(), prefect_api() as (api_url, wait_for_prefect), stragglers_finished():
        address, worker_env = ray_to_use(ray_address, api_url)
        with ray_in_background(address, num_cpus, worker_env, environment) as wait_for_ray:
            yield StartingServices(api_url, wait_for_prefect, wait_for_ray, None if worker_env else address)


@contextlib.contextmanager
def run_services(
    ray_address: str | None,
    num_cpus: int | None,
    environment: str,
    tracking_uri: str,
    services: StartingServices | None = None,
) -> Iterator[None]:
    """Everything a scenario's run needs, up and waited for: the Prefect API, Ray and the MLflow
    store, started in parallel (the server boots in its own process, Ray starts and warms its
    workers on a thread, the store is prepared on another), or ``services`` where the caller
    began them before its own slow imports (`services_starting`). Stopped on exit."""
    from concurrent.futures import ThreadPoolExecutor

    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.tracking.scenario_tracker import prepare_store

    with contextlib.ExitStack() as stack:
        if services is None:
            services = stack.enter_context(services_starting(ray_address, num_cpus, environment))
        # the outer run's heartbeat too (the scenarios' flows turn off only their subflows'): a run has its terminal
        stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        store = stack.enter_context(ThreadPoolExecutor(max_workers=1)).submit(prepare_store, tracking_uri)
        services.wait_for_prefect()
        store.result()
        services.wait_for_ray()
        yield


def warm_up_workers(environment: str) -> list:
    """Start one worker per CPU and load what tasks need (Prefect, the environment, the game
    tree where there is one) in each. A warm-up that fails costs nothing but its time: nobody
    waits for it, and the run's own first use of the environment reports the error.

    Returns Ray object refs; the workers warm up while the Prefect server boots and the flow
    starts, and the first tasks queue behind the warm-up.
    """
    import ray

    @ray.remote(num_cpus=1)
    def warm_up(game_string: str) -> None:
        import tasks  # noqa: F401  (imports Prefect, marl_core)
        from marl_core.empirical_game.game import psro_game
        from marl_core.games.tree import build_tree

        if psro_game(game_string).has_tree:  # makes the environment once on the way
            build_tree(game_string)
        time.sleep(0.3)  # hold the CPU so the next warm-up lands on another worker

    return [warm_up.remote(environment) for _ in range(int(ray.cluster_resources().get("CPU", 1)))]
