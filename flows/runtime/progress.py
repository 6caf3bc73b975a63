"""The progress of a run's long work on the screen or in its log, while the run works.

A learned best response or a MARL run may play for minutes before it has a result to report.
Their episodes and steps are counted where the rollout pool collects them, into the pool's
weight store (`marl_core.rollout.progress`); here a thread reads the store once per second
(one call to the store actor, which the workers never wait for) and shows what it read:

- on an interactive terminal, one live row per piece of work (`ProgressRows`): label, bar,
  done/total, rate and time left;
- anywhere else (a log file, CI, a deployment's flow-run log), plain lines (`PlainLines`): one
  when a piece of work starts and then at most one every `PSRO_PROGRESS_EVERY` seconds (10 by
  default), so a log shows a run moving without filling up with redraws.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from marl_core.rollout.progress import Progress

PROGRESS_EVERY = "PSRO_PROGRESS_EVERY"  # seconds between plain progress lines of one piece of work
DEFAULT_EVERY = 10.0


@runtime_checkable  # a flow's parameter: Prefect builds a schema of its parameters, which checks by isinstance
class ProgressView(Protocol):
    def show(self, progress: list[Progress]) -> None: ...


def plain_interval() -> float:
    """The plain-line interval from the environment; a one-line error for a value that is not one."""
    text = os.environ.get(PROGRESS_EVERY)
    if text is None:
        return DEFAULT_EVERY
    try:
        every = float(text)
    except ValueError:
        every = float("nan")
    if not every > 0:
        raise ValueError(f"{PROGRESS_EVERY}={text!r}: seconds between progress lines, a number above 0")
    return every


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def pace(progress: Progress) -> str:
    """Rate and time left, once there is a rate: '410/s, ~4 s left'."""
    if progress.rate is None:
        return ""
    return f"{progress.rate:.0f}/s, ~{duration(progress.seconds_left)} left"


def describe(progress: Progress) -> str:
    """'best response player_0 (iteration 3): 1200/3000 episodes, 410/s, ~4 s left'."""
    line = f"{progress.label}: {progress.done}/{progress.total} {progress.unit}"
    return f"{line}, {pace(progress)}" if progress.rate is not None else line


class PlainLines:
    """A line per piece of work when it first shows, then at most one every `every` seconds."""

    def __init__(self, write: Callable[[str], None], every: float, clock: Callable[[], float] = time.monotonic):
        self.write, self.every, self.clock = write, every, clock
        self._written: dict[str, float] = {}  # label -> when its last line was written

    def show(self, progress: list[Progress]) -> None:
        now = self.clock()
        self._written = {p.label: self._written[p.label] for p in progress if p.label in self._written}
        for p in progress:
            if p.label not in self._written or now - self._written[p.label] >= self.every:
                self.write(describe(p))
                self._written[p.label] = now


class ProgressRows:
    """One row per piece of work in a rich `Progress` display (beside the run's own rows, such
    as `psro run`'s iterations: a terminal has one live display at a time)."""

    def __init__(self, bars):
        self.bars = bars
        self._rows: dict[str, int] = {}  # label -> task id

    def show(self, progress: list[Progress]) -> None:
        shown = {p.label for p in progress}
        for label in [label for label in self._rows if label not in shown]:
            self.bars.remove_task(self._rows.pop(label))
        for p in progress:
            if p.label not in self._rows:
                self._rows[p.label] = self.bars.add_task(p.label, total=p.total, info="")
            self.bars.update(self._rows[p.label], completed=p.done, total=p.total, info=f"{p.unit}  {pace(p)}")


def progress_bars(console):
    """A rich live display for rows of work: description, bar, done/total, `info`, elapsed."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bars

    return Bars(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def view_for(console, bars) -> ProgressView:
    """Live rows in `bars` on an interactive terminal, else plain lines printed to `console`."""
    if console.is_terminal:
        return ProgressRows(bars)
    return PlainLines(lambda line: console.print(line, highlight=False, soft_wrap=True), plain_interval())


@contextlib.contextmanager
def watching(read: Callable[[], list[Progress]], view: ProgressView | None, poll: float = 1.0) -> Iterator[None]:
    """Show `read()` in `view` every `poll` seconds while the block runs (nothing without a view)."""
    if view is None:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(poll):
            try:
                shown = read()
            except Exception:  # the actors that count it were lost; the step that uses them says why
                return
            view.show(shown)

    # In the caller's context: Prefect's run logger sends each line to the API of the settings in
    # context, and a bare thread would get the settings of Prefect's import, which may predate
    # the run's server (Prefect then starts a temporary server of its own, or drops the lines).
    thread = threading.Thread(target=contextvars.copy_context().run, args=(watch,), name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
