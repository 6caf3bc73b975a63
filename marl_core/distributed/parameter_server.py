"""The parameter server of one policy's learners: the master weights, their optimizer, and the
distributed strategy by which learners' gradients reach them (MALib's BSP, ASP and BAP).

Each learner loops: pull the newest weights, take a batch, compute a step's gradient
(`marl_core.rl.gradient_steps`), push it, pull again. The server holds a whole trainer as its
master copy and steps that trainer's optimizer(s), so learners only ever compute gradients; the
weights version counts the optimizer steps taken. What a push does depends on the strategy
(`StrategyConfig`):

- BSP: the push waits until every learner has pushed for the current version, then the server
  steps once along their sample-weighted mean: exactly the step one learner would take on the
  union of their batches. A learner that has not pushed within `iteration_timeout` of the
  step's first push is left out of it (its late gradient is then stale and dropped).
- ASP: applied at once.
- BAP: applied at once, unless the learner has completed more than `staleness` iterations
  beyond the slowest learner: then its push waits (0 is lockstep). An iteration (pull to push) that outlives
  `iteration_timeout` is interrupted so the others need not wait for it: its clock moves on
  and its gradient, when it comes, is dropped.

A push answers whether it was applied and the version now; a learner replaced after a crash
starts with a fresh clock at the slowest learner's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from marl_core.distributed.settings import StrategyConfig
from marl_core.rl.gradient_steps import Gradients, apply_gradients, mean_gradient


@dataclasses.dataclass(frozen=True)
class PushResult:
    applied: bool
    version: int  # the server's version after the push
    why: str = ""  # why not applied: "stale", "interrupted"


@dataclasses.dataclass
class ServerStats:
    version: int
    applied: int  # gradients applied (BSP: each learner's share of a step counts once)
    dropped: int  # stale or interrupted gradients
    push_seconds: float  # learners' total time inside push: applying, and waiting (BSP's barrier, BAP's bound)
    clocks: list[int]  # iterations each learner completed
    max_lead: int  # the most iterations a learner had completed beyond the slowest when its push was applied


class ParameterServer:
    def __init__(self, learner, networks: dict, config: StrategyConfig, clock: Callable[[], float] = time.monotonic):
        """`learner`: the master copy, offering `optimized_groups()`; `networks`: its acting
        networks by name, whose weights learners pull (a MARL learner's `policies`)."""
        self.learner = learner
        self.networks = networks
        self.groups = learner.optimized_groups()
        self.config = config
        self.version = 0
        self._clock = clock
        self._changed = threading.Condition()
        n = config.learners
        self._clocks = [0] * n
        self._iteration_started = [clock()] * n
        self._interrupted = [False] * n
        self._pending: dict[int, tuple[Gradients, int]] = {}  # BSP: this step's pushes so far
        self._step_opened: float | None = None
        self._applied = self._dropped = self._max_lead = 0
        self._waited = 0.0

    # --- the learners' two calls -------------------------------------------------------------

    def pull(self, learner: int, have_version: int):
        """(version, weights) if newer than `have_version`, else None; either way the
        learner's next iteration starts now."""
        with self._changed:
            self._iteration_started[learner] = self._clock()
            if self.version <= have_version:
                return None
            return self.version, {name: network.get_weights() for name, network in self.networks.items()}

    def weights(self) -> tuple[int, dict]:
        """(version, acting weights by name) as they stand, for the workers."""
        with self._changed:
            return self.version, {name: network.get_weights() for name, network in self.networks.items()}

    def checkpoint(self) -> tuple[dict, dict]:
        """(the master's whole training state, acting weights by name), never mid-step."""
        with self._changed:
            return self.learner.state_dict(), {name: network.get_weights() for name, network in self.networks.items()}

    def push(self, learner: int, base_version: int, grads: Gradients, samples: int) -> PushResult:
        started = self._clock()
        with self._changed:
            try:
                if self.config.strategy == "bsp":
                    return self._push_bsp(learner, base_version, grads, samples)
                if self.config.strategy == "bap":
                    return self._push_bap(learner, grads)
                return self._apply(learner, grads)
            finally:
                self._waited += self._clock() - started

    def join(self, learner: int) -> None:
        """A (re)started learner: its clock starts at the slowest other learner's, so BAP neither
        waits for its lost iterations nor lets it run ahead."""
        with self._changed:
            others = [c for i, c in enumerate(self._clocks) if i != learner]
            self._clocks[learner] = min(others) if others else self._clocks[learner]
            self._interrupted[learner] = False
            self._iteration_started[learner] = self._clock()
            self._pending.pop(learner, None)
            self._changed.notify_all()

    def stats(self) -> ServerStats:
        with self._changed:
            return ServerStats(
                self.version, self._applied, self._dropped, self._waited, list(self._clocks), self._max_lead
            )

    # --- strategies (the lock held) ------------------------------------------------------------

    def _apply(self, learner: int, grads: Gradients) -> PushResult:
        self._max_lead = max(self._max_lead, self._clocks[learner] - min(self._clocks))
        apply_gradients(self.groups, grads)
        self._clocks[learner] += 1
        self._applied += 1
        return self._stepped()

    def _stepped(self) -> PushResult:
        self.version += 1
        self._changed.notify_all()
        return PushResult(True, self.version)

    def _push_bsp(self, learner: int, base_version: int, grads: Gradients, samples: int) -> PushResult:
        if base_version != self.version:  # left out of the step its weights were for
            self._dropped += 1
            return PushResult(False, self.version, "stale")
        if not self._pending:
            self._step_opened = self._clock()
        self._pending[learner] = (grads, samples)
        if len(self._pending) < self.config.learners:
            deadline = self._step_opened + self.config.iteration_timeout
            self._changed.wait_for(lambda: self.version != base_version, max(0.0, deadline - self._clock()))
            if self.version != base_version:
                return PushResult(True, self.version)
        # every learner pushed, or the step's time ran out: step along what came
        apply_gradients(self.groups, mean_gradient(list(self._pending.values())))
        for pushed in self._pending:
            self._clocks[pushed] += 1
        self._applied += len(self._pending)
        self._pending.clear()
        return self._stepped()

    def _push_bap(self, learner: int, grads: Gradients) -> PushResult:
        if self._interrupted[learner]:
            self._interrupted[learner] = False
            self._dropped += 1
            return PushResult(False, self.version, "interrupted")
        while self._clocks[learner] - min(self._clocks) > self.config.staleness:
            slowest = min(range(len(self._clocks)), key=self._clocks.__getitem__)
            overdue = self._iteration_started[slowest] + self.config.iteration_timeout - self._clock()
            if overdue <= 0:  # the slowest's iteration is interrupted: its clock moves on
                self._clocks[slowest] += 1
                self._interrupted[slowest] = True
                self._iteration_started[slowest] = self._clock()
                continue
            self._changed.wait(overdue)
        return self._apply(learner, grads)
