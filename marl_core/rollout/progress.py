"""How far long work has come: a learned response's training episodes, a MARL run's joint steps.

Every episode and step of a run goes through its pool's `collect`, so that is where progress is
counted (`WorkerPool.collect(requests, progress=...)`), into the pool's parameter store, which
whatever runs the pool reads once in a while to show it (`flows.progress`). The caller that knows
the budget opens the work (`WorkerPool.tracking`) and closes it when done; a learner and its
collector in two tasks thus report into one entry.

Times are read from the store's own clock only, so a reader on another machine of the cluster
still gets consistent rates.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Optional


@dataclasses.dataclass(frozen=True)
class Work:
    """A piece of long work: `total` `unit` (episodes, steps) to do, shown under `label`."""

    id: str
    label: str
    total: int
    unit: str


@dataclasses.dataclass(frozen=True)
class Progress:
    """One piece of work as it stood when read: `elapsed` seconds since it began."""

    label: str
    done: int
    total: int
    unit: str
    elapsed: float

    @property
    def rate(self) -> Optional[float]:
        """Units per second since the work began; None until some are done."""
        return self.done / self.elapsed if self.done and self.elapsed > 0 else None

    @property
    def seconds_left(self) -> Optional[float]:
        """At the rate so far; None until there is a rate."""
        rate = self.rate
        return max(0, self.total - self.done) / rate if rate else None


@dataclasses.dataclass
class _Entry:
    work: Work
    began: float
    done: int = 0


class ProgressBoard:
    """The work in progress, in the order it began. Work that ended drops out; counts for work
    that is not open (it ended, or a retried learner reopened it) are ignored rather than
    failing the rollouts they came with. A retried evaluation counts its episodes again, so what
    is done is read as at most the total."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def begin(self, work: Work) -> None:
        """Open `work` at 0 done. Work that is open already (its caller opened it when it asked
        for it, or a retried attempt starts over) restarts from 0 done but keeps its start: the
        time it took before is part of what the work costs."""
        with self._lock:
            entry = self._entries.get(work.id)
            self._entries[work.id] = _Entry(work, entry.began if entry else self._clock())

    def advance(self, work_id: str, amount: int) -> None:
        with self._lock:
            entry = self._entries.get(work_id)
            if entry is not None:
                entry.done += amount

    def end(self, work_id: str) -> None:
        with self._lock:
            self._entries.pop(work_id, None)

    def read(self) -> list[Progress]:
        with self._lock:
            now = self._clock()
            return [
                Progress(e.work.label, min(e.done, e.work.total), e.work.total, e.work.unit, now - e.began)
                for e in self._entries.values()
            ]
