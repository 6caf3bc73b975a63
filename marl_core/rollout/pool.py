"""Where rollout workers live: in this process, or as Ray actors beside a parameter-store actor.

Two calls reach the workers: `push` a learner's newest weights to the parameter store, and
`collect` a list of requests, dealt round-robin to the workers, which run them in parallel (a
learned response sends one per worker; a sampled evaluation one per profile). No worker ever
waits on the learner per step. A request is answered the same by any worker, so results never
depend on the pool's size.

The store is also MALib's dataset server: a mailbox per learned response (an `ExperienceStream`)
through which its learner asks for a round of experience and its collector, the loop that
drives the workers, answers (`marl_core.psro.learned_oracle`). The two halves then run as two
tasks, or two threads of one, and every wait of either has a deadline or ends when the other
side reports that it stopped.

On Ray the workers reserve no CPU slot (``num_cpus=0`` by default). The learner runs in a task
that holds a slot; on a 2-core machine, workers that each reserved a core would leave no slot
for that task and the run would hang (MALib's PSRO example does). The collector's task holds
none either, so it starts beside its learner at once.
A worker that dies is restarted by Ray and its request replayed: requests are deterministic
and return whole episodes, so nothing is lost or counted twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Optional

from marl_core.rollout.worker import EnvSource, RolloutRequest, RolloutResult, RolloutWorker


LEARNER, COLLECTOR = "learner", "collector"  # the two sides of an experience stream


@dataclasses.dataclass(frozen=True)
class Ending:
    """Why one side of a stream stopped: done (`error` None), or failed, and whether that failure
    is one its task is retried for (`is_transient`), in which case the other side waits a while
    for the retry instead of giving up."""

    side: str
    error: Optional[str] = None
    retryable: bool = False

    @property
    def final(self) -> bool:
        return self.error is None or not self.retryable


@dataclasses.dataclass
class _Mailbox:
    asks: int = 0  # number of the newest ask
    ask: Any = None  # the newest ask, until it is answered or its learner stops
    answer: Optional[tuple[int, Any]] = None  # (ask number, answer) until the learner takes it
    ended: dict[str, Ending] = dataclasses.field(default_factory=dict)


class ParameterStore:
    """The newest weights of each learner, by key, with a version number; and one mailbox per
    experience stream, holding the learner's newest ask and the collector's answer to it.

    Every method holds one lock, and the waits (`next_ask`, `take`) sleep on a condition of it:
    on Ray the store is one threaded actor (`max_concurrency`), so a learner or a collector
    waiting here occupies one of its threads, never the workers' `pull`s. Each wait returns
    after `timeout` seconds at most, and callers pass a short one and ask again: a caller that
    died holds no thread for long, and the caller's own deadline is checked between waits.
    """

    def __init__(self):
        self._weights: dict[str, tuple[int, Any]] = {}
        self._mailboxes: dict[str, _Mailbox] = {}
        self._changed = threading.Condition()

    # --- parameter server ----------------------------------------------------------------

    def push(self, key: str, version: int, weights) -> None:
        with self._changed:
            self._weights[key] = (version, weights)

    def pull(self, key: str, have_version: int) -> tuple[int, Any] | None:
        """The stored weights if newer than the caller's, else None (nothing is copied)."""
        with self._changed:
            stored = self._weights.get(key)
        if stored is None or stored[0] <= have_version:
            return None
        return stored

    def drop(self, key: str) -> None:
        with self._changed:
            self._weights.pop(key, None)

    # --- experience streams: one learner asks, one collector answers ---------------------

    def open(self, stream: str, side: str) -> None:
        """`side` (re)joins the stream: a retried task clears the ending its failed attempt left."""
        with self._changed:
            self._mailbox(stream).ended.pop(side, None)
            self._changed.notify_all()

    def ask(self, stream: str, ask) -> int:
        """The learner's ask replaces any earlier one; returns its number."""
        with self._changed:
            box = self._mailbox(stream)
            box.asks, box.ask, box.answer = box.asks + 1, ask, None
            self._changed.notify_all()
            return box.asks

    def next_ask(self, stream: str, timeout: float) -> tuple[int, Any] | Ending | None:
        """The pending ask and its number; else, once the learner stopped for good, its ending;
        else (after `timeout` seconds) its retryable ending or None."""
        with self._changed:
            box = self._wait(stream, lambda box: box.ask is not None or _final(box, LEARNER), timeout)
            return (box.asks, box.ask) if box.ask is not None else box.ended.get(LEARNER)

    def answer(self, stream: str, number: int, answer) -> None:
        """The collector's answer to ask `number`; dropped if the learner has asked again since."""
        with self._changed:
            box = self._mailbox(stream)
            if number == box.asks:
                box.ask, box.answer = None, (number, answer)
                self._changed.notify_all()

    def take(self, stream: str, number: int, timeout: float) -> Any | Ending | None:
        """The answer to ask `number`, handed over once; else, once the collector stopped for
        good, its ending; else (after `timeout` seconds) its retryable ending or None."""
        answered = lambda box: box.answer is not None and box.answer[0] == number
        with self._changed:
            box = self._wait(stream, lambda box: answered(box) or _final(box, COLLECTOR), timeout)
            if answered(box):
                answer, box.answer = box.answer[1], None
                return answer
            return box.ended.get(COLLECTOR)

    def end(self, stream: str, ending: Ending) -> None:
        """A side stopped; a stopping learner withdraws its ask. The mailbox goes once both
        sides have stopped for good."""
        with self._changed:
            box = self._mailbox(stream)
            box.ended[ending.side] = ending
            if ending.side == LEARNER:
                box.ask = None
            if all(_final(box, side) for side in (LEARNER, COLLECTOR)):
                del self._mailboxes[stream]
            self._changed.notify_all()

    def _mailbox(self, stream: str) -> _Mailbox:
        return self._mailboxes.setdefault(stream, _Mailbox())

    def _wait(self, stream: str, ready: Callable[[_Mailbox], bool], timeout: float) -> _Mailbox:
        """The stream's mailbox once `ready` or after `timeout` seconds (the lock held)."""
        self._changed.wait_for(lambda: ready(self._mailbox(stream)), timeout)
        return self._mailbox(stream)


def _final(box: _Mailbox, side: str) -> bool:
    return side in box.ended and box.ended[side].final


def is_transient(error: BaseException) -> bool:
    """A failure Ray could not hide (a rollout actor out of restarts, a lost object, a dropped
    connection): a retry may succeed. The tasks are retried for exactly these
    (`tasks/psro_tasks.py`), so the other side of a stream waits for the retry."""
    import ray.exceptions

    transient = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.WorkerCrashedError, ConnectionError)
    return isinstance(error, transient)


class StreamError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class StreamTimeouts:
    """How long one side of a stream waits. `wait`: for the other's next message (a round's
    rollouts or learning, or the other's task waiting for a CPU slot). `retry`: for the other
    to come back after a failure its task is retried for (the tasks retry after 5 s); 0 where
    both sides run in one task, which is retried as a whole, so no side comes back alone.
    `poll`: the longest single wait inside the store."""

    wait: float = 3600.0
    retry: float = 60.0
    poll: float = 1.0


class ExperienceStream:
    """One side's end of a stream in a pool's store. As a context manager it joins the stream
    and, on leaving, tells the other side that it stopped and why, so the other never waits
    for it in vain."""

    def __init__(self, store, stream: str, side: str, timeouts: StreamTimeouts = StreamTimeouts()):
        self.store, self.stream, self.side, self.timeouts = store, stream, side, timeouts
        self.other = COLLECTOR if side == LEARNER else LEARNER

    def __enter__(self) -> "ExperienceStream":
        self.store.open(self.stream, self.side)
        return self

    def __exit__(self, kind, error, traceback) -> None:
        ending = Ending(self.side)
        if error is not None:
            # Worth waiting for only where this side's task may be retried on its own: a stale
            # retryable ending must not outlive a task that ran both sides.
            retryable = self.timeouts.retry > 0 and is_transient(error)
            ending = Ending(self.side, f"{type(error).__name__}: {error}", retryable)
        self.store.end(self.stream, ending)

    # --- the learner's side -----------------------------------------------------------------

    def request(self, ask):
        """Ask, and wait for the collector's answer."""
        number = self.store.ask(self.stream, ask)
        answer = self._wait(lambda timeout: self.store.take(self.stream, number, timeout), f"an answer to ask {number}")
        if isinstance(answer, Ending):
            why = f"failed: {answer.error}" if answer.error else "stopped before answering"
            raise StreamError(f"{self.stream}: the collector {why} (ask {number})")
        return answer

    # --- the collector's side ---------------------------------------------------------------

    def next_ask(self) -> tuple[int, Any] | None:
        """The learner's next ask and its number, or None once the learner has stopped."""
        asked = self._wait(lambda timeout: self.store.next_ask(self.stream, timeout), "an ask")
        return None if isinstance(asked, Ending) else asked

    def answer(self, number: int, answer) -> None:
        self.store.answer(self.stream, number, answer)

    def _wait(self, poll: Callable[[float], Any], what: str):
        """`poll` the store until the other side sends a message, or stops for good (then its
        `Ending`). A failure the other side's task is retried for is given `timeouts.retry`
        seconds to come back before it counts as final."""
        t = self.timeouts
        deadline, failed_at = time.monotonic() + t.wait, None
        while True:
            got = poll(max(0.0, min(t.poll, deadline - time.monotonic())))
            now = time.monotonic()
            if isinstance(got, Ending) and not got.final:
                failed_at = failed_at or now
                if now - failed_at >= t.retry:
                    return Ending(got.side, f"{got.error} (not retried within {t.retry:g} s)")
            elif got is not None:
                return got
            else:
                failed_at = None  # back from a retry, or never gone
            if now >= deadline:
                raise StreamError(f"{self.stream}: the {self.side} waited {t.wait:g} s for {what} from the {self.other}")


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    env: EnvSource
    workers: int
    envs_per_worker: int
    worker_cpus: float = 0.0


class LocalWorkerPool:
    """Workers in this process, run one after another: for tests and the local loop. A learner
    and its collector may use the pool from two threads; one `collect` runs at a time."""

    def __init__(self, config: PoolConfig):
        self.store = ParameterStore()
        self.workers = [RolloutWorker(config.env, config.envs_per_worker, self.store) for _ in range(config.workers)]
        self._collecting = threading.Lock()

    @property
    def size(self) -> int:
        return len(self.workers)

    def push(self, key: str, version: int, weights) -> None:
        self.store.push(key, version, weights)

    def drop(self, key: str) -> None:
        self.store.drop(key)

    def collect(self, requests: list[RolloutRequest]) -> list[RolloutResult]:
        with self._collecting:
            return [self.workers[i % self.size].collect(r) for i, r in enumerate(requests)]

    def close(self) -> None:
        pass


class _StoreClient:
    """The store actor seen as a `ParameterStore`: the same methods, each one call over Ray.

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

    def open(self, stream: str, side: str) -> None:
        self._call("open", stream, side)

    def ask(self, stream: str, ask) -> int:
        return self._call("ask", stream, ask)

    def next_ask(self, stream: str, timeout: float):
        return self._call("next_ask", stream, timeout)

    def answer(self, stream: str, number: int, answer) -> None:
        self._call("answer", stream, number, answer)

    def take(self, stream: str, number: int, timeout: float):
        return self._call("take", stream, number, timeout)

    def end(self, stream: str, ending: Ending) -> None:
        self._call("end", stream, ending)


class _RayRolloutWorker(RolloutWorker):
    def __init__(self, env: EnvSource, envs_per_worker: int, store_name: str):
        import torch

        torch.set_num_threads(1)  # many small forward passes: threads only contend
        super().__init__(env, envs_per_worker, _StoreClient(store_name))

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        import os

        return os.getpid()


class RayWorkerPool:
    """Rollout workers as Ray actors; handles pickle, so learner tasks can drive the pool.

    Workers are dealt round-robin over the cluster's nodes that have CPUs, each pinned softly to
    its node (a restarted worker may go elsewhere if its node is gone). Ray's own placement
    does not spread them: their `num_cpus` is 0 by default, so nothing pushes them off the
    driver's node, and its SPREAD strategy put both workers of a two-node test cluster on one
    node in about one run of three. Ray also ignores a soft node affinity for an actor that
    requests no resources at all (honoured in 5 of 10 placements here), so each worker
    requests a token 1 MiB of Ray's `memory` resource (10 of 10). On one machine every worker
    lands on that machine.
    """

    def __init__(self, config: PoolConfig, max_restarts: int = 3):
        import uuid

        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        store_name = f"parameter-store-{uuid.uuid4().hex}"
        # Threads for the waits of every stream at once (two per learned response), with room
        # left for the workers' pulls; each wait holds a thread for one `StreamTimeouts.poll`.
        self.store_handle = ray.remote(num_cpus=0, max_concurrency=64)(ParameterStore).options(name=store_name).remote()
        self.store = _StoreClient(self.store_handle)
        actor = ray.remote(
            num_cpus=config.worker_cpus, memory=1024**2, max_restarts=max_restarts, max_task_retries=max_restarts
        )
        nodes = _nodes_with_cpus()
        self.workers = [
            actor(_RayRolloutWorker)
            .options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=True))
            .remote(config.env, config.envs_per_worker, store_name)
            for i in range(config.workers)
        ]

    @property
    def size(self) -> int:
        return len(self.workers)

    def push(self, key: str, version: int, weights) -> None:
        self.store.push(key, version, weights)

    def drop(self, key: str) -> None:
        self.store_handle.drop.remote(key)

    def collect(self, requests: list[RolloutRequest]) -> list[RolloutResult]:
        import ray

        return ray.get([self.workers[i % self.size].collect.remote(r) for i, r in enumerate(requests)])

    def node_ids(self) -> list[str]:
        import ray

        return ray.get([w.node_id.remote() for w in self.workers])

    def close(self) -> None:
        import ray

        for handle in [*self.workers, self.store_handle]:
            ray.kill(handle)


def _nodes_with_cpus() -> list[str]:
    import ray

    nodes = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) > 0)
    return nodes or [ray.get_runtime_context().get_node_id()]


@contextlib.contextmanager
def pool_or_local(pool, env: EnvSource, envs_per_worker: int = 32):
    """`pool` (the run's rollout workers) where there is one, else one worker in this process
    for the duration of the block."""
    if pool is not None:
        yield pool
        return
    local = LocalWorkerPool(PoolConfig(env, 1, envs_per_worker))
    try:
        yield local
    finally:
        local.close()
