"""Stops every process a run started once the run's driver has died without stopping them.

A driver killed with SIGKILL runs no clean-up: its Prefect server, Ray's raylet and Ray's agents
would live on. Before starting any of them the driver marks its environment with a token, which
every child inherits, and starts this watcher in a session of its own. While the driver lives,
the watcher keeps a list of its descendants (Ray's agents rename themselves and clobber their
environment, so the token alone does not find them); when the driver is gone, it terminates
those and every process that carries the token (SIGTERM, then SIGKILL), then exits. A driver
that ends normally stops its services itself and then stops the watcher.

Usage: ``python -m flows.services.reaper DRIVER_PID TOKEN`` (Linux: reads /proc).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

MARKER = "PSRO_RUN_TOKEN"


def marked_processes(token: str) -> list[int]:
    return processes_with(f"{MARKER}={token}")


def processes_with(entry: str) -> list[int]:
    """The processes (this one aside) whose environment holds `entry`, "NAME=value". A zombie's
    environment cannot be read, so only live processes are found."""
    entry = entry.encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if entry in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _started(pid: int) -> str | None:
    """The process's start time: tells a remembered process from a new one with a reused pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def descendants(root: int) -> dict[int, str]:
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(proc.name))
    found, stack = {}, list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if pid != os.getpid() and (started := _started(pid)) is not None:
            found[pid] = started
        stack.extend(children.get(pid, []))
    return found


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def reap(token: str, remembered: dict[int, str], grace: float = 5.0) -> None:
    def targets() -> list[int]:
        still = [pid for pid, started in remembered.items() if _started(pid) == started]
        return sorted(set(still) | set(marked_processes(token)))

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in targets():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while targets() and time.monotonic() < deadline:
            time.sleep(0.2)


@contextlib.contextmanager
def reap_on_crash() -> Iterator[None]:
    """Mark this process's environment so that a watcher can stop everything started from here
    if this process dies without doing it itself (this module)."""
    import uuid

    if MARKER in os.environ:  # an outer caller already watches this process
        yield
        return
    os.environ[MARKER] = uuid.uuid4().hex
    watcher = subprocess.Popen(
        [sys.executable, "-m", "flows.services.reaper", str(os.getpid()), os.environ[MARKER]],
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


def main(driver: int, token: str) -> None:
    remembered: dict[int, str] = {}
    while alive(driver):
        remembered.update(descendants(driver))
        time.sleep(0.5)
    reap(token, remembered)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
