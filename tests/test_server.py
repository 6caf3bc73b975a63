"""`psro server`: bad settings refused in one line, and what a server kept for one run turns off.

A running `psro server` (runs reuse it, a second one is refused, SIGTERM stops everything it
started) is `tests/test_stopping.py`'s: its runs are stopped and continued on one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from processes import poll

PSRO = str(Path(sys.executable).with_name("psro"))


def _env(home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_ADDRESS"))}
    env["PREFECT_HOME"] = str(home)
    return env


@pytest.mark.parametrize(
    "args, message",
    [
        (["--port", "80"], "error: port=80: choose a port from 1024 to 65535, or 0 for a free one"),
        (["--num-cpus", "0"], "error: num_cpus=0: needs 1 or more"),
    ],
)
def test_bad_server_settings_fail_in_one_line(tmp_path, args, message):
    result = subprocess.run([PSRO, "server", *args], env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "psro-server.json").exists()


@pytest.mark.end_to_end  # a real Prefect server's process
@pytest.mark.parametrize("one_run", [True, False])
def test_only_a_one_run_server_turns_its_scheduling_services_off(tmp_path, one_run):
    """A server kept for one run (`prefect_api` without a `psro server`) drops the services that only
    schedule or reap; a long-lived server (`psro server`, which serves deployments) keeps them."""
    from flows.services.prefect_server import ONE_RUN_SERVICES_OFF, LocalPrefectServer

    server = LocalPrefectServer(tmp_path / "prefect-home", one_run=one_run)
    try:  # read empty while the process is still in its exec (seen once), so poll
        environ = poll(
            lambda: Path(f"/proc/{server.process.pid}/environ").read_bytes().decode().split("\0"),
            lambda entries: len(entries) > 1,
            timeout=10,
        )
    finally:
        server.stop()
    off = {f"PREFECT_SERVER_SERVICES_{service}_ENABLED=false" for service in ONE_RUN_SERVICES_OFF}
    assert "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED=false" in off
    assert (off <= set(environ)) is one_run
    assert not (off & set(environ)) or one_run
