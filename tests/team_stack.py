"""The team's stack for the tests that run on it (`test_stack.py`: status, credentials, faults;
`test_stack_load.py`: four scenarios at once, `down` and `up`, the UIs): each file brings up a
stack of its own through the real command, so that the two run side by side in the suite's two
processes (the faults mostly wait while services are down; the load keeps the cores busy).

Every process of a stack carries `PSRO_STACK=DIR` in its environment: that marker, not process
names, is how leftovers are found (tests/processes.py). DIR is made under /tmp, open to other
users: as root, PostgreSQL runs as the `postgres` user, which must reach its data.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PSRO = str(Path(sys.executable).with_name("psro"))
# The tests' stacks run with `--auth`: their servers ask for these, which every client here sends
# from the environment (the test process's own too, set by `running_stack`).
SECRETS = ("prefect-secret-0517", "mlflow-secret-0517")
CREDENTIALS = {
    "PREFECT_API_AUTH_STRING": f"team:{SECRETS[0]}",
    "MLFLOW_TRACKING_USERNAME": "team",
    "MLFLOW_TRACKING_PASSWORD": SECRETS[1],
}


def stack_env(credentials: bool = True) -> dict[str, str]:
    own = ("PREFECT_", "RAY_", "PSRO_", "MLFLOW_")
    return {key: value for key, value in os.environ.items() if not key.startswith(own)} | (
        CREDENTIALS if credentials else {}
    )


def stack_command(
    directory: Path, *args: str, timeout: float = 300, credentials: bool = True
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PSRO, "stack", *args, "--dir", str(directory)],
        env=stack_env(credentials),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def running_stack() -> Iterator[tuple[Path, dict, str]]:
    """A stack brought up by `psro stack up --workers 1 --auth`, the credentials in this process's
    environment while it runs: (its directory, stack.json, what `up` printed); `down` after."""
    parent = Path(tempfile.mkdtemp(prefix="psro-stack-test-", dir="/tmp"))
    parent.chmod(0o755)
    directory = parent / "stack"
    try:
        started = stack_command(directory, "up", "--workers", "1", "--auth")
        assert started.returncode == 0, started.stdout + started.stderr
        with pytest.MonkeyPatch.context() as patch:
            for key, value in CREDENTIALS.items():
                patch.setenv(key, value)
            yield directory, json.loads((directory / "stack.json").read_text()), started.stdout
    finally:
        stack_command(directory, "down")
        with contextlib.suppress(OSError, ValueError):  # Ray's session files, outside DIR
            shutil.rmtree(json.loads((directory / "stack.json").read_text())["ray_temp_dir"])
        shutil.rmtree(parent, ignore_errors=True)


def addresses(state: dict) -> dict[str, str]:
    ports = state["ports"]
    return {
        "prefect": f"http://127.0.0.1:{ports['prefect']}/api",
        "mlflow": f"http://127.0.0.1:{ports['mlflow']}",
        "ray": f"127.0.0.1:{ports['ray']}",
    }


def status_without_credentials(url: str, body: bytes | None = None) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def assert_no_secret_stored(directory: Path, state: dict, client, run_ids) -> None:
    """Neither secret in any file of the stack's directory or Ray's session, nor in any run's
    params and tags."""
    stored = [directory, Path(state["ray_temp_dir"])]
    files = [path for folder in stored for path in folder.rglob("*") if path.is_file() and not path.is_socket()]
    holding = [str(path) for path in files for secret in SECRETS if secret.encode() in path.read_bytes()]
    assert files and holding == []
    for run_id in run_ids:
        logged = client.get_run(run_id).data
        assert not any(secret in json.dumps([logged.params, logged.tags]) for secret in SECRETS)
