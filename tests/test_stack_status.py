"""`psro stack status` counts a Ray node up while its raylet lives, not while any process of its
group does: once a worker host's head is gone, the node's log monitor outlived its raylet by
minutes, and status said `ray-worker-1 up` all that while (tests/test_hosts.py, seen once).

No Ray here: the processes are `sleep`s in a group of their own, one of them run as `raylet`
(Linux names a process for its executable), carrying the stack's marker as a stack's do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from flows.services import stack as stack_module
from flows.services.stack import Ports, Stack, start, status


@pytest.fixture
def worker_host(tmp_path: Path):
    """A worker host's stack whose `ray-worker-1` group is started by the test (`node(...)`)."""
    stack = Stack(str(tmp_path), Ports.pick(None), 0, str(tmp_path / "ray"), {}, host="127.0.0.3", head="127.0.0.2")
    started: list[subprocess.Popen] = []

    def node(*names: str) -> Stack:
        """A process group holding a `sleep` run under each of `names`; the stack's `ray-worker-1`."""
        leader = None
        for name in names:
            executable = tmp_path / name
            shutil.copy(shutil.which("sleep"), executable)
            process = subprocess.Popen(
                [str(executable), "600"],
                env={**os.environ, stack_module.MARKER: stack.directory},
                process_group=0 if leader is None else leader.pid,
            )
            leader = leader or process
            started.append(process)
        stack.groups["ray-worker-1"] = leader.pid
        return stack

    yield node
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()


def test_a_ray_node_is_up_while_its_raylet_lives(worker_host):
    stack = worker_host("raylet", "log_monitor")
    assert dict(status(stack))["ray-worker-1"] is True


def test_a_ray_node_whose_raylet_died_is_down_though_its_log_monitor_lives(worker_host):
    stack = worker_host("log_monitor")
    assert dict(status(stack))["ray-worker-1"] is False


def test_start_stops_what_outlived_a_node_before_it_starts_the_node_again(worker_host, monkeypatch):
    stack = worker_host("log_monitor")
    stack.save()
    started: list[list[str]] = []
    monkeypatch.setattr(stack_module, "_bring_up", lambda stack, names, credentials: started.append(names))
    assert start(Path(stack.directory), ["ray-worker-1"]) == ["ray-worker-1"]
    assert started == [["ray-worker-1"]]
    assert stack_module._processes(stack.marker) == {}  # the log monitor: stopped first
