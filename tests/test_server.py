"""`psro server`: later runs reuse its Prefect server and Ray, and Ctrl-C/SIGTERM leaves nothing.

Everything started here carries the test's own PREFECT_HOME in its environment; that marker,
not process names, is how leftovers are found (tests/processes.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes import assert_all_exited, mlflow_store, poll, prefect_home, wait_until

pytestmark = pytest.mark.slow

PSRO = str(Path(sys.executable).with_name("psro"))


def _env(home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_ADDRESS"))}
    env["PREFECT_HOME"] = str(home)
    return env


@pytest.fixture
def psro_server(tmp_path):
    home = prefect_home(tmp_path / "prefect-home")
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [PSRO, "server", "--port", "0", "--num-cpus", "2"],
        env=_env(home),
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    state = home / "psro-server.json"
    try:
        wait_until(lambda: state.exists() or server.poll() is not None, 180, "the psro server to come up")
        assert server.poll() is None, (tmp_path / "server.log").read_text()
        yield server, home, json.loads(state.read_text())
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
        log.close()


def test_runs_reuse_the_server_a_second_server_is_refused_and_sigterm_stops_everything(psro_server, tmp_path):
    """One server for every check: starting one (Prefect and Ray) is the slow part."""
    server, home, state = psro_server
    run = subprocess.run(
        [PSRO, "run", "--game", "kuhn_poker", "--iterations", "2", "--tracking-uri", mlflow_store(tmp_path)],
        env=_env(home),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert (
        f"Prefect UI during the run: {state['prefect_api_url'].removesuffix('/api')} "
        f"(the running psro server's; Ray at {state['ray_address']})" in run.stdout
    )
    assert "done: 2 iterations" in run.stdout
    assert server.poll() is None, "the run must leave the server it reused running"

    # a MARL run reuses them the same way (it once started a Ray of its own beside the server's)
    (tmp_path / "marl.yaml").write_text("steps_per_round: 10\nworkers: 1\nenvs_per_worker: 1\neval_episodes: 1\n")
    marl = subprocess.run(
        [
            PSRO,
            "marl",
            "run",
            "--config",
            "marl.yaml",
            "--env",
            "pettingzoo:mpe2.simple_spread_v3",
            "--algorithm",
            "ippo",
            "--rounds",
            "1",
            "--tracking-uri",
            mlflow_store(tmp_path),
        ],
        env=_env(home),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert marl.returncode == 0, marl.stdout[-2000:] + marl.stderr[-2000:]
    assert (
        f"Prefect UI during the run: {state['prefect_api_url'].removesuffix('/api')} "
        f"(the running psro server's; Ray at {state['ray_address']})" in marl.stdout
    )
    assert "done: 1 rounds" in marl.stdout
    assert server.poll() is None

    # a second server for the same home is refused, and the first keeps running
    second = subprocess.run([PSRO, "server"], env=_env(home), capture_output=True, text=True, timeout=120)
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        f"error: a psro server already runs for {home.resolve()} "
        f"(pid {state['pid']}, Prefect at {state['prefect_api_url']})"
    ]
    assert server.poll() is None

    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 0
    assert not (home / "psro-server.json").exists()
    assert_all_exited(f"PREFECT_HOME={home}")


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
