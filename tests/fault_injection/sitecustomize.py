"""The suite's one fault-injection seam: kill a run's process at a chosen commit, or hold it there.

A test starts a process (a `psro ... run`, a `psro serve` and the flow runs it starts) with this
folder on PYTHONPATH. Python imports `sitecustomize` at start-up from the path, so this module
runs first in that process and each child it starts: it arranges that when
`flows.tracking.scenario_tracker` is imported, `ScenarioTracker._commit` (the one place every
scenario writes its commit tag) SIGKILLs the process just before a chosen step's tag.
Everything that step stores has been written by then: the window whose leftovers a resume must
clean up. Which step:

- ``PSRO_TEST_KILL_AT_COMMIT=N``: step N of every run of the process;
- ``PSRO_TEST_FAULTS=DIR``: step N of a run whose MLflow experiment has a file ``DIR/<experiment>``
  holding N, once (the file is removed first), so that one serving process can crash one run
  and then run its retry and others.

``PSRO_TEST_HOLD_AT_COMMIT=N,M,...`` with ``PSRO_TEST_HOLD_DIR=DIR`` holds the run's driver
instead: when step N's commit is handed to the tracker (`ScenarioTracker.log_step`) it writes
``DIR/held-N`` and waits until the test writes ``DIR/release-N``, so that a test can fail a
service under a run at a known point (tests/test_stack.py's faults). The driver, not the
tracking thread, waits: a released run then meets the failed service with all it does next (the
step's commit in MLflow, the next step's subflow and tasks in Prefect), where a run whose tracker
alone was held had finished its steps before the service failed. A held run goes on by itself
after ``PSRO_TEST_HOLD_LIMIT`` seconds (600 unless set), so that a test that failed before its
release leaves no run waiting for ever.

No production module reads these variables or knows this seam exists; without them this module
does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import signal
import sys
import time
from pathlib import Path

KILL_AT = "PSRO_TEST_KILL_AT_COMMIT"
FAULTS = "PSRO_TEST_FAULTS"
HOLD_AT, HOLD_DIR = "PSRO_TEST_HOLD_AT_COMMIT", "PSRO_TEST_HOLD_DIR"
HOLD_LIMIT = "PSRO_TEST_HOLD_LIMIT"
TARGET = "flows.tracking.scenario_tracker"


def _dies_at(tracker, index: int) -> bool:
    if os.environ.get(KILL_AT) == str(index):
        return True
    faults = os.environ.get(FAULTS)
    if not faults:
        return False
    planned = Path(faults) / tracker.experiment
    if planned.is_file() and planned.read_text().strip() == str(index):
        planned.unlink()
        return True
    return False


def _hold(index: int) -> None:
    if str(index) not in os.environ.get(HOLD_AT, "").split(","):
        return
    folder = Path(os.environ[HOLD_DIR])
    (folder / f"held-{index}").touch()
    deadline = time.monotonic() + float(os.environ.get(HOLD_LIMIT, "600"))
    while not (folder / f"release-{index}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def _arm(tracker_class) -> None:
    commit, log_step = tracker_class._commit, tracker_class.log_step

    def commit_or_die(self, index: int) -> None:
        if _dies_at(self, index):
            os.kill(os.getpid(), signal.SIGKILL)
        commit(self, index)

    def held_then_logged(self, index: int, record, state, committed) -> None:
        if committed is not None:
            _hold(index)
        log_step(self, index, record, state, committed)

    tracker_class._commit = commit_or_die
    tracker_class.log_step = held_then_logged


class _ArmOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it lets the usual finder load the target, then arms its class."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def exec_and_arm(module) -> None:
            exec_module(module)
            _arm(module.ScenarioTracker)

        spec.loader.exec_module = exec_and_arm
        return spec


if os.environ.get(KILL_AT) or os.environ.get(FAULTS) or os.environ.get(HOLD_AT):
    sys.meta_path.insert(0, _ArmOnImport())
