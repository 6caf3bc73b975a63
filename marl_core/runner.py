"""The one way a scenario's step is run: its named steps submitted to a `Runner`.

Every scenario wires its step once, as calls on a runner (`marl_core.psro.steps.run_iteration`,
`marl_core.marl.rounds.run_round`, `marl_core.league.generation.run_generation`). `LocalRunner`
runs them in this process, the reference for what a flow computes; the flows' runner
(`flows.runtime.task_steps.RayTaskSteps`) submits each as the Prefect task of the same name on Ray. So
a flow run and a local run compute the same thing by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol


class Runner(Protocol):
    """`submit` starts a step (by its name) and returns a handle that later steps may take as
    an argument; `submit_beside` starts a step that must run at the same time as the step
    `partner` (it serves or feeds it and only drives actors, so it must not wait for a CPU of
    its own); `result` waits for a step; `share` places a value where every step can read it;
    `parallelism` is how many CPUs the steps may spread over."""

    def share(self, value: Any) -> Any: ...

    def submit(self, step: str, *args) -> Any: ...

    def submit_beside(self, partner: Any, step: str, *args) -> Any: ...

    def result(self, handle: Any) -> Any: ...

    def parallelism(self) -> int: ...


class LocalRunner:
    """Runs each step in this process when its result is first asked for, so a step's time is
    its own work (a stage clock around `result` measures it). A step with others submitted
    beside it starts with them, each on a thread of its own, when the first of them is asked
    for; each is waited for by its own `result`. `steps`: the step functions by name."""

    def __init__(self, steps: dict[str, Callable]):
        self.steps = steps

    def share(self, value):
        return value

    def submit(self, step: str, *args):
        return _Deferred(self.steps[step], args)

    def submit_beside(self, partner: _Deferred, step: str, *args):
        companion = _Deferred(self.steps[step], args, partner=partner)
        partner.companions.append(companion)
        return companion

    def result(self, handle):
        return handle.value() if isinstance(handle, _Deferred) else handle

    def parallelism(self) -> int:
        return 1


class _Deferred:
    def __init__(self, function: Callable, args: tuple, partner: _Deferred | None = None):
        self.function, self.args, self.partner = function, args, partner
        self.companions: list[_Deferred] = []
        self.running: Future | None = None  # a companion, once its partner started it
        self.started, self._value, self._error = False, None, None

    def value(self):
        if self.partner is not None:
            self.partner.start()
        else:
            self.start()
        if self.running is not None:
            return self.running.result()
        if self._error is not None:
            raise self._error
        return self._value

    def start(self) -> None:
        """Run this step (once): here, or, with companions, on a thread beside theirs. Nothing
        is waited for here: a step and its companions may only end once something after them
        tells them to (an asynchronous round's stream ends when its learners are done)."""
        if self.started:
            return
        self.started = True
        try:
            args = [_resolved(a) for a in self.args]
            if not self.companions:
                self._value = self.function(*args)
                return
            threads = ThreadPoolExecutor(max_workers=len(self.companions) + 1, thread_name_prefix="beside")
            self.running = threads.submit(self.function, *args)
            for companion in self.companions:
                companion.running = threads.submit(companion.function, *map(_resolved, companion.args))
            threads.shutdown(wait=False)
        except BaseException as error:
            self._error = error


def _resolved(arg):
    """A step's argument with its deferred steps run: one, or a list of them (the responses, the
    evaluations). Other lists are data (profile chunks) and are passed as they are."""
    if isinstance(arg, _Deferred):
        return arg.value()
    if isinstance(arg, list) and any(isinstance(a, _Deferred) for a in arg):
        return [_resolved(a) for a in arg]
    return arg
