"""The dataset server: a bounded buffer between rollout workers that keep playing and learners
that keep learning (MALib's offline dataset server).

Workers `put` fragments, each tagged with the version of the weights that played it; learners
`take` them. Every fragment taken is counted by its staleness, the learner's version minus the
fragment's, so a run can show how far behind its data was (V-trace corrects for exactly that
gap).

- `fifo` (on-policy): each fragment is taken once, oldest first (RLlib's learner queue does the
  same: stale batches destabilised learning, ray#48702). A worker `reserve`s room for a fragment
  before it plays it, and a full buffer makes it wait: the workers slow to the learners' pace,
  the fragments held and being played never pass the capacity, and a fragment played is always
  stored (even once the server has closed), so no play is thrown away.
- `uniform` / `prioritized` (replay): fragments stay and are sampled with replacement; at
  capacity the oldest is replaced, so the buffer stays bounded while workers never wait.
  Prioritized sampling is proportional to priority ** alpha, new fragments getting the highest
  priority seen so far (Schaul et al. 2016); learners send back new priorities by key.

Every wait has a timeout, and `close` wakes every waiter: a worker or learner that stops never
leaves another blocked. On Ray the server is one threaded actor, so a waiting `put` holds only
one of its threads.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from marl_core.distributed.settings import DatasetConfig

STORED, FULL, CLOSED, RESERVED = "stored", "full", "closed", "reserved"  # what a put or reserve did


@dataclasses.dataclass(frozen=True)
class Fragment:
    key: int  # insertion number, for priority updates
    item: Any
    version: int  # weights version that played it


@dataclasses.dataclass(frozen=True)
class DatasetStats:
    inserted: int
    taken: int  # fragments handed to learners (a replayed one counts each time)
    size: int
    capacity: int
    put_wait_seconds: float  # producers' total wait on a full buffer
    take_wait_seconds: float  # learners' total wait on an empty one
    staleness: dict[int, int]  # learner version - fragment version -> fragments taken


class DatasetServer:
    def __init__(
        self, config: DatasetConfig = DatasetConfig(), seed: int = 0, clock: Callable[[], float] = time.monotonic
    ):
        self.config = config
        self._fragments: collections.deque[Fragment] = collections.deque()
        self._priorities: dict[int, float] = {}
        self._max_priority = 1.0
        self._changed = threading.Condition()
        self._closed = False
        self._producing = True  # a producer has had room since the last `open` (see `open`)
        self._rng = np.random.default_rng(seed)
        self._clock = clock
        self._inserted = self._taken = 0
        self._put_wait = self._take_wait = 0.0
        self._staleness: collections.Counter[int] = collections.Counter()
        self._stored_index: dict[str, int] = {}  # stream -> index of its newest fragment stored
        self._reserved: dict[str, int] = {}  # stream -> index of the fragment it has room for, being played

    def put(self, item: Any, version: int, timeout: float, origin: tuple[str, int] | None = None) -> str:
        """Store `item`, played by weights `version`: STORED; FULL if (FIFO) the buffer stayed full
        for `timeout` seconds, and the caller tries again; CLOSED if producers should stop.
        `origin` (stream, index): a fragment of a stream at or before the last one stored is
        already here (a restarted worker replays its stream) and is not stored twice; one that
        `reserve`d its room is stored at once."""
        with self._changed:
            reserved = origin is not None and self._reserved.get(origin[0]) == origin[1]
            if reserved:  # its room was kept: stored, open or closed
                del self._reserved[origin[0]]
                self._changed.notify_all()
            if origin is not None and origin[1] <= self._stored_index.get(origin[0], -1):
                return STORED
            if not reserved:
                refused = self._wait_for_room(timeout)
                if refused is not None:
                    return refused
            self._store(item, version, origin)
            return STORED

    def reserve(self, stream: str, index: int, timeout: float) -> str:
        """Room for fragment `index` of `stream`, asked before it is played: RESERVED, and its `put`
        will store it; FULL if (FIFO) the fragments held and reserved stayed at capacity for
        `timeout` seconds, and the caller tries again; CLOSED if producers should stop. A stream
        has one fragment in play at a time, so a new reservation replaces its stream's last
        (a restarted worker's replaces the one its predecessor left)."""
        with self._changed:
            self._reserved.pop(stream, None)
            refused = self._wait_for_room(timeout)
            if refused is not None:
                return refused
            self._reserved[stream] = index
            return RESERVED

    def _wait_for_room(self, timeout: float) -> str | None:
        """None once a fragment may go in (replay: at once); else CLOSED, or FULL after `timeout`
        seconds of a full FIFO buffer. Called holding the lock."""
        if self.config.kind == "fifo":
            started = self._clock()
            self._changed.wait_for(lambda: self._closed or self._room(), timeout)
            self._put_wait += self._clock() - started
        if self._closed:
            return CLOSED
        if self.config.kind == "fifo" and not self._room():
            return FULL
        if not self._producing:
            self._producing = True
            self._changed.notify_all()
        return None

    def _room(self) -> bool:
        return len(self._fragments) + len(self._reserved) < self.config.capacity

    def _store(self, item: Any, version: int, origin: tuple[str, int] | None) -> None:
        if len(self._fragments) >= self.config.capacity:  # replay: the oldest makes room
            self._priorities.pop(self._fragments.popleft().key, None)
        fragment = Fragment(self._inserted, item, version)
        self._fragments.append(fragment)
        if self.config.kind == "prioritized":
            self._priorities[fragment.key] = self._max_priority
        self._inserted += 1
        if origin is not None:
            self._stored_index[origin[0]] = origin[1]
        self._changed.notify_all()

    def take(self, count: int, learner_version: int, timeout: float) -> list[Fragment] | None:
        """`count` fragments for a learner whose weights are `learner_version`: the oldest (FIFO,
        removed) or a sample (replay, kept), once `_serving`; None if fewer
        were there within `timeout` seconds, or are there once the server closed."""
        if count > self.config.capacity:
            raise ValueError(f"take({count}) can never be served: the buffer holds {self.config.capacity} at most")
        with self._changed:
            started = self._clock()
            self._changed.wait_for(lambda: self._closed or (self._serving() and len(self._fragments) >= count), timeout)
            self._take_wait += self._clock() - started
            if len(self._fragments) < count:
                return None
            if self.config.kind == "fifo":
                taken = [self._fragments.popleft() for _ in range(count)]
                self._changed.notify_all()
            else:
                taken = [self._fragments[i] for i in self._sample(count)]
            self._taken += count
            self._staleness.update(learner_version - fragment.version for fragment in taken)
            return taken

    def _serving(self) -> bool:
        """Whether learners may take: a producer has begun since `open`, or none can until a
        learner takes (the buffer is full)."""
        return self._producing or not self._room()

    def _sample(self, count: int) -> np.ndarray:
        if self.config.kind == "uniform":
            return self._rng.integers(len(self._fragments), size=count)
        weights = np.array([self._priorities[f.key] for f in self._fragments]) ** self.config.priority_exponent
        return self._rng.choice(len(self._fragments), size=count, p=weights / weights.sum())

    def next_index(self, stream: str) -> int:
        """The index after the newest fragment of `stream` stored: where a restarted worker goes on."""
        with self._changed:
            return self._stored_index.get(stream, -1) + 1

    def update_priorities(self, keys: list[int], priorities: list[float]) -> None:
        """Prioritized replay: new priorities (e.g. absolute TD errors) of fragments still held."""
        with self._changed:
            for key, priority in zip(keys, priorities, strict=True):
                if key in self._priorities:
                    self._priorities[key] = float(priority)
                    self._max_priority = max(self._max_priority, float(priority))

    def close(self) -> None:
        """Producers stop: every waiter wakes, `put` answers CLOSED, and `take` serves what is held
        without waiting for more. `open` lets producers in again (the next round)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def open(self) -> None:
        """Producers are let in again, and `take` waits until one of them has had room: the
        fragments the last round's workers left would otherwise let its learners finish before
        any worker of this round began, and the round would play nothing."""
        with self._changed:
            self._closed = False
            self._producing = False

    def stats(self) -> DatasetStats:
        with self._changed:
            return DatasetStats(
                self._inserted,
                self._taken,
                len(self._fragments),
                self.config.capacity,
                self._put_wait,
                self._take_wait,
                dict(self._staleness),
            )


class DatasetClient:
    """The server actor seen as a `DatasetServer`, each method one call over Ray. Workers find it
    by name, as they find the weight store (`marl_core.rollout.weight_store.WeightStoreClient`)."""

    def __init__(self, server):
        import ray

        self.handle = ray.get_actor(server) if isinstance(server, str) else server

    def _call(self, method: str, *args):
        import ray

        return ray.get(getattr(self.handle, method).remote(*args))

    def put(self, item: Any, version: int, timeout: float, origin: tuple[str, int] | None = None) -> str:
        return self._call("put", item, version, timeout, origin)

    def reserve(self, stream: str, index: int, timeout: float) -> str:
        return self._call("reserve", stream, index, timeout)

    def take(self, count: int, learner_version: int, timeout: float) -> list[Fragment] | None:
        return self._call("take", count, learner_version, timeout)

    def next_index(self, stream: str) -> int:
        return self._call("next_index", stream)

    def update_priorities(self, keys: list[int], priorities: list[float]) -> None:
        self._call("update_priorities", keys, priorities)

    def close(self) -> None:
        self._call("close")

    def open(self) -> None:
        self._call("open")

    def stats(self) -> DatasetStats:
        return self._call("stats")
