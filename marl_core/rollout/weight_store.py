"""The weight store: learners' newest acting weights by key and version, which rollout workers
pull once per request, never by a blocking call per step.

Not to be confused with the parameter server of asynchronous learners
(`marl_core.distributed.parameter_server`), which holds one policy's master weights and its
optimizer and applies the gradients learners push: the weight store only keeps what a learner
published, for the workers to act with.

The same actor keeps the progress of the run's long work (`marl_core.rollout.progress`), which
the pool's users share. So a pool on Ray starts one store actor beside its workers, and every
side finds it by name.

Over Ray, weights travel through the actor as numpy arrays (`WeightStoreClient`): the store only
keeps and hands back what it is given, and holding no tensor it never imports torch, which cost
every run's store process more than everything else it did.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from marl_core.rollout.progress import Progress, ProgressBoard, Work


class WeightStore:
    """The newest weights of each learner, by key, with a version number; beside them the
    progress board, behind a lock of its own, so a worker's `pull` never waits on a progress
    reader."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
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
        self._call("push", key, version, _tensors_as_arrays(weights))

    def pull(self, key: str, have_version: int):
        pulled = self._call("pull", key, have_version)
        return None if pulled is None else (pulled[0], _arrays_as_tensors(pulled[1]))

    def begin(self, work: Work) -> None:
        self._call("begin", work)

    def advance(self, work_id: str, amount: int) -> None:
        self._call("advance", work_id, amount)

    def end_work(self, work_id: str) -> None:
        self._call("end_work", work_id)

    def progress(self) -> list[Progress]:
        return self._call("progress")


# --- weights over Ray, as arrays ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TensorValues:
    """A tensor's values on their way through the store actor."""

    values: np.ndarray


def _tensors_as_arrays(value):
    """`value` with every tensor in it (in dicts, lists and tuples, as state dicts nest them)
    replaced by its values; one of a dtype numpy lacks (bfloat16) travels as it is."""
    torch = sys.modules.get("torch")
    if torch is None:  # nothing in this process made a tensor
        return value

    def convert(item):
        if isinstance(item, torch.Tensor):
            try:
                return _TensorValues(item.detach().cpu().numpy())
            except TypeError:
                return item
        return _map_containers(item, convert)

    return convert(value)


def _arrays_as_tensors(value):
    """The inverse of `_tensors_as_arrays`; each tensor gets its own copy of the values (those
    from Ray's object store are read-only)."""

    def convert(item):
        if isinstance(item, _TensorValues):
            import torch

            return torch.from_numpy(item.values.copy())
        return _map_containers(item, convert)

    return convert(value)


def _map_containers(item, convert):
    if type(item) in (dict, collections.OrderedDict):
        return type(item)((key, convert(value)) for key, value in item.items())
    if type(item) in (list, tuple):
        return type(item)(convert(value) for value in item)
    return item
