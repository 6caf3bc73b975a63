"""How far long work has come: a learned response's training episodes, a MARL run's joint steps.

Every episode and step of a run goes through its pool's `collect`, so that is where progress is
counted (`WorkerPool.collect(requests, progress=...)`), into the pool's weight store, which
whatever runs the pool reads once in a while to show it (`flows.runtime.progress`). The caller that knows
the budget opens the work (`WorkerPool.tracking`) and closes it when done; a learner and its
collector in two tasks thus report into one entry.

Times are read from the store's own clock only, so a reader on another machine of the cluster
still gets consistent rates.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable


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
    def rate(self) -> float | None:
        """Units per second since the work began; None until some are done."""
        return self.done / self.elapsed if self.done and self.elapsed > 0 else None

    @property
    def seconds_left(self) -> float | None:
        """At the rate so far; None until there is a rate."""
        rate = self.rate
        return max(0, self.total - self.done) / rate if rate else None


@dataclasses.dataclass
class _Entry:
    work: Work
    began: float
    done: int = 0
    read: bool = False  # shown to a reader at least once
    ended: float | None = None  # when it ended, by the board's clock


class ProgressBoard:
    """The work in progress, in the order it began. Work that ended drops out once a reader has
    seen it: work shorter than the reader's poll is still shown, once, as it stood when it ended
    (at most `KEPT_UNREAD` such, the oldest dropped first, so a board nobody reads stays small).
    Counts for work that is not open (it ended, or a retried learner reopened it) are ignored
    rather than failing the rollouts they came with. A retried evaluation counts its episodes
    again, so what is done is read as at most the total."""

    KEPT_UNREAD = 64

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def begin(self, work: Work) -> None:
        """Open `work` at 0 done. Work that is open already (its caller opened it when it asked
        for it, or a retried attempt starts over) restarts from 0 done but keeps its start: the
        time it took before is part of what the work costs, and a reader that has seen it has
        seen it."""
        with self._lock:
            entry = self._entries.get(work.id)
            self._entries[work.id] = (
                _Entry(work, entry.began, read=entry.read) if entry else _Entry(work, self._clock())
            )

    def advance(self, work_id: str, amount: int) -> None:
        with self._lock:
            entry = self._entries.get(work_id)
            if entry is not None and entry.ended is None:
                entry.done += amount

    def end(self, work_id: str) -> None:
        with self._lock:
            entry = self._entries.get(work_id)
            if entry is None or entry.read:
                self._entries.pop(work_id, None)
                return
            entry.ended = self._clock()
            unread = [key for key, e in self._entries.items() if e.ended is not None]
            for key in unread[: max(0, len(unread) - self.KEPT_UNREAD)]:
                del self._entries[key]

    def read(self) -> list[Progress]:
        with self._lock:
            now = self._clock()
            shown = []
            for key, e in list(self._entries.items()):
                shown.append(
                    Progress(
                        e.work.label,
                        min(e.done, e.work.total),
                        e.work.total,
                        e.work.unit,
                        (now if e.ended is None else e.ended) - e.began,
                    )
                )
                e.read = True
                if e.ended is not None:  # seen now: gone
                    del self._entries[key]
            return shown
