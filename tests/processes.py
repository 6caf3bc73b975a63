"""Finding the processes a test started, and only those: the machine may run other Ray or Prefect
instances, so tests mark their own by an environment entry every child inherits (a temporary
PREFECT_HOME or RAY_TMPDIR) instead of matching process names."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def processes_with_env(entry: str) -> list[str]:
    """Command lines of live (not zombie) processes whose environment holds ``entry``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            zombie = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            if not zombie and entry.encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120])
        except (OSError, IndexError):
            continue
    return found


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


def run_config(work: Path, config_text: str, *flags: str, timeout: float = 600):
    """`psro run` on `config_text` (written to work/run.yaml) in a clean environment with its own
    Prefect home, MLflow in work/mlflow.db and two CPUs; asserts it succeeded and left no
    process behind, and returns the finished process."""
    import os
    import subprocess
    import sys

    (work / "run.yaml").write_text(config_text)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_"))}
    env["PREFECT_HOME"] = str(work / "prefect-home")
    command = [
        str(Path(sys.executable).with_name("psro")), "run", "--config", "run.yaml", "--num-cpus", "2",
        "--tracking-uri", f"sqlite:///{work}/mlflow.db", *flags,
    ]
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_all_exited(f"PREFECT_HOME={work / 'prefect-home'}")
    return result
