"""The services a run needs, started the way a user would start them, and always stopped.

- Prefect: when ``PREFECT_API_URL`` is unset, one real ``prefect server start`` on 127.0.0.1 and
  a free port (through `flows.prefect_server`, which fixes SQLite lock contention). Prefect's
  temporary in-process server cannot be used: every Ray worker would start its own on the same
  SQLite file.
- Ray: a fresh local instance limited to this machine's cores (``address="local"`` so an
  unrelated running cluster is never joined by accident), or the cluster at ``--ray-address``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

SERVER_START_TIMEOUT = 120.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


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


@contextlib.contextmanager
def prefect_server(home: Path | None = None) -> Iterator[str]:
    """Yield a Prefect API URL: the configured one, or a server started and stopped here."""
    configured = os.environ.get("PREFECT_API_URL")
    if configured:
        yield configured
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    home = Path(home or os.environ.get("PREFECT_HOME") or Path.cwd() / ".prefect").resolve()
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    log = open(home / "server.log", "ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "flows.prefect_server", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while not _healthy(url):
            if process.poll() is not None:
                raise RuntimeError(f"Prefect server exited with code {process.returncode}; see {home / 'server.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prefect server did not answer within {SERVER_START_TIMEOUT:.0f} s; see {home / 'server.log'}")
            time.sleep(0.2)
        os.environ["PREFECT_API_URL"] = url
        yield url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        _stop(process)
        log.close()


@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int | None, env_vars: dict[str, str]) -> Iterator[None]:
    """Start or join Ray; workers get the Prefect settings through the runtime environment."""
    import ray

    runtime_env = {"env_vars": env_vars}
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    else:
        ray.init(
            address="local",
            num_cpus=num_cpus or os.cpu_count(),
            object_store_memory=512 * 1024 * 1024,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",  # loopback only; a cluster is joined explicitly
            runtime_env=runtime_env,
            log_to_driver=False,
        )
    try:
        yield
    finally:
        ray.shutdown()
