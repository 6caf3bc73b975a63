"""Experience streams: a learner that asks for rounds of experience and a collector that answers.

A learned response's learner asks for a round of experience through a mailbox, and its
collector, the loop that drives the rollout workers, answers (`marl_core.psro.learned_oracle`).
The mailboxes are kept by the pool's weight store (`marl_core.rollout.weight_store`), the one
actor the learner, the collector and the workers all find by name; the two halves then run as
two tasks, or two threads of one, and every wait of either has a deadline or ends when the other
side reports that it stopped.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

LEARNER, COLLECTOR = "learner", "collector"  # the two sides of an experience stream


@dataclasses.dataclass(frozen=True)
class Ending:
    """Why one side of a stream stopped: done (`error` None), or failed, and whether that failure
    is one its task is retried for (`is_transient`), in which case the other side waits a while
    for the retry instead of giving up."""

    side: str
    error: str | None = None
    retryable: bool = False

    @property
    def final(self) -> bool:
        return self.error is None or not self.retryable


@dataclasses.dataclass
class _Mailbox:
    asks: int = 0  # number of the newest ask
    ask: Any = None  # the newest ask, until it is answered or its learner stops
    answer: tuple[int, Any] | None = None  # (ask number, answer) until the learner takes it
    ended: dict[str, Ending] = dataclasses.field(default_factory=dict)


class StreamMailboxes:
    """One mailbox per experience stream, holding the learner's newest ask and the collector's
    answer to it: the weight store's share of every stream.

    Every method holds the mailboxes' lock, and the waits (`next_ask`, `take`) sleep on a
    condition of it: on Ray the store is one threaded actor (`max_concurrency`), so a learner or
    a collector waiting here occupies one of its threads, never the workers' `pull`s (the
    weights have a lock of their own). Each wait returns
    after `timeout` seconds at most, and callers pass a short one and ask again: a caller that
    died holds no thread for long, and the caller's own deadline is checked between waits.
    """

    def __init__(self):
        self._mailboxes: dict[str, _Mailbox] = {}
        self._changed = threading.Condition()

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

        def answered(box: _Mailbox) -> bool:
            return box.answer is not None and box.answer[0] == number

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

    transient = (
        ray.exceptions.RayActorError,
        ray.exceptions.ObjectLostError,
        ray.exceptions.WorkerCrashedError,
        ConnectionError,
    )
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
    """One side's end of a stream in a pool's weight store. As a context manager it joins the stream
    and, on leaving, tells the other side that it stopped and why, so the other never waits
    for it in vain."""

    def __init__(self, store, stream: str, side: str, timeouts: StreamTimeouts = StreamTimeouts()):
        self.store, self.stream, self.side, self.timeouts = store, stream, side, timeouts
        self.other = COLLECTOR if side == LEARNER else LEARNER

    def __enter__(self) -> ExperienceStream:
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
                raise StreamError(
                    f"{self.stream}: the {self.side} waited {t.wait:g} s for {what} from the {self.other}"
                )
