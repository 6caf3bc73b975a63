"""The weight store: learners' newest acting weights by key and version, which rollout workers
pull once per request, never by a blocking call per step.

Not to be confused with the parameter server of asynchronous learners
(`marl_core.distributed.parameter_server`), which holds one policy's master weights and its
optimizer and applies the gradients learners push: the weight store only keeps what a learner
published, for the workers to act with.

The same actor keeps the progress of the run's long work (`marl_core.rollout.progress`), which
the pool's users share. So a pool on Ray starts one store actor beside its workers, and every
side finds it by name.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from typing import Any

from marl_core.rollout.progress import Progress, ProgressBoard, Work


class WeightStore:
    """The newest weights of each learner, by key, with a version number; beside them the
    progress board, behind a lock of its own, so a worker's `pull` never waits on a progress
    reader."""

    def __init__(self, preload: tuple[str, ...] = (), clock: Callable[[], float] = time.monotonic):
        # A store actor deserializes what learners push: importing torch on the first push would
        # make that learner wait for it, so a pool on Ray has its store import it when it starts.
        for module in preload:
            importlib.import_module(module)
        self._weights: dict[str, tuple[int, Any]] = {}
        self._lock = threading.Lock()
        self._progress = ProgressBoard(clock)

    # --- weights ---------------------------------------------------------------------------

    def push(self, key: str, version: int, weights) -> None:
        with self._lock:
            self._weights[key] = (version, weights)

    def pull(self, key: str, have_version: int) -> tuple[int, Any] | None:
        """The stored weights if newer than the caller's, else None (nothing is copied)."""
        with self._lock:
            stored = self._weights.get(key)
        if stored is None or stored[0] <= have_version:
            return None
        return stored

    def drop(self, key: str) -> None:
        with self._lock:
            self._weights.pop(key, None)

    # --- progress of long work --------------------------------------------------------------

    def begin(self, work: Work) -> None:
        self._progress.begin(work)

    def advance(self, work_id: str, amount: int) -> None:
        self._progress.advance(work_id, amount)

    def end_work(self, work_id: str) -> None:
        self._progress.end(work_id)

    def progress(self) -> list[Progress]:
        return self._progress.read()


class WeightStoreClient:
    """The store actor seen as a `WeightStore`: the same methods, each one call over Ray.

    Workers find the store by name rather than receiving its handle: Ray keeps a handle passed
    to a constructor in the object store, and a restarted worker could lose it.
    """

    def __init__(self, store):
        import ray

        self.handle = ray.get_actor(store) if isinstance(store, str) else store

    def _call(self, method: str, *args):
        import ray

        return ray.get(getattr(self.handle, method).remote(*args))

    def push(self, key: str, version: int, weights) -> None:
        self._call("push", key, version, weights)

    def pull(self, key: str, have_version: int):
        return self._call("pull", key, have_version)

    def begin(self, work: Work) -> None:
        self._call("begin", work)

    def advance(self, work_id: str, amount: int) -> None:
        self._call("advance", work_id, amount)

    def end_work(self, work_id: str) -> None:
        self._call("end_work", work_id)

    def progress(self) -> list[Progress]:
        return self._call("progress")
