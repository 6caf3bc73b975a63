"""Prefect's server for one run or for many, started the way a user starts it, and always stopped.

When ``PREFECT_API_URL`` is unset a run starts one real ``prefect server start`` on 127.0.0.1 and
a free port (through `flows.services.patched_prefect_server`, which fixes SQLite lock contention).
Prefect's temporary in-process server cannot be used: every Ray worker would start its own on
the same SQLite file. A running `psro server` (`flows.services.psro_server`) is found and reused
instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from flows.services.reaper import alive

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
    """A `prefect server start` process on `host` (127.0.0.1 unless a team's stack serves other
    hosts); `wait()` blocks until it answers.

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
        host: str = "127.0.0.1",
    ):
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}/api"
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
                "flows.services.patched_prefect_server",
                "server",
                "start",
                "--host",
                host,
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
