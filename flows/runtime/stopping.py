"""A run's command stopped by Ctrl-C or SIGTERM, or by the loss of the Ray head it joined, the
same way for every scenario.

The first signal stops the run as a failure would: the main thread's wait ends (a
KeyboardInterrupt, raised even inside `ray.get`), and every context unwinds: the tracker writes
the commits it has queued and marks the MLflow run failed, Prefect records the flow run Crashed,
Ray stops, then the run's Prefect server. The command then prints one line, which step was
committed last and the exact command that continues the run, and exits 130 (SIGINT) or 143
(SIGTERM), as a shell reports a process ended by either.

From the first signal on, the process's standard output and error go to a file instead of the
terminal: what the libraries say about being stopped (Prefect's "Crash detected!", the failed
steps' tracebacks, Ray's task failures, which Ray prints on standard output) is the stop itself,
and Prefect's UI keeps every log line. The command's own console writes to a copy of standard
output made before, so its progress display still ends cleanly and the line reaches the
terminal. The file is deleted once the run has stopped; if the stop went wrong (an error other
than the interrupt came out of the shutdown) it is kept, and the line names it.

A second signal during that shutdown ends the process at once, with the same line. What the run
started is stopped by the reaper (`flows.services.reaper`) and the Prefect server's own watch of
its parent, and the run resumes from its last commit, as after a crash.

A run that joined a Ray cluster by address (a team's head, from a laptop) has that address
watched while it runs (`watching_ray_head`): once the head has refused connections for
`HEAD_LOST_AFTER_S` (as long as Ray Client waits to reconnect), the host is taken as lost, and
the command stops itself as on SIGTERM, its line saying why, and exits `EXIT_HEAD_LOST` (75,
"try again later"). The head's servers usually went with it, so the shutdown gets
`HEAD_LOST_GRACE_S` to record the stop before the process ends with its line, as on a second
signal: MLflow keeps the last commit either way, and the line's command continues from it
once the head is back.

The runtime hands the command its run's tracker (`follow`), from which the line reads the MLflow
run and its last commit; `flows.cli.scenario_commands` wraps every `run` and `resume` in
`stop_on_signals`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
SIGNALS = (signal.SIGINT, signal.SIGTERM)
HEAD_LOST_AFTER_S = 30.0  # refused this long, a Ray head is lost (Ray Client's reconnect grace)
HEAD_LOST_GRACE_S = 20.0  # the shutdown's time after a lost head before the process ends
EXIT_HEAD_LOST = 75  # EX_TEMPFAIL: the run can go on once the head is back


@dataclasses.dataclass
class CommandStop:
    """What a stopped command says: the step it commits (`step_noun`), the command that
    continues a run (`resume_command`, the run id and flags follow it) and the one that starts it
    again (`restart_command`); the run's tracking URI and id as they become known."""

    step_noun: str
    resume_command: str
    restart_command: str
    tracking_uri: str | None = None
    run_id: str | None = None  # the run being resumed, before its tracker reopens it
    committed: int | None = None  # the last step that run committed
    tracker: object | None = None  # the run's `ScenarioTracker`, once the runtime opened it
    signal: int | None = dataclasses.field(default=None, init=False)  # the first signal received
    lost: str | None = dataclasses.field(default=None, init=False)  # what the command lost, if it stopped itself
    # where standard output and error go once a signal came, and their descriptors before
    _log: str | None = dataclasses.field(default=None, init=False)
    _saved: dict[int, int] = dataclasses.field(default_factory=dict, init=False)
    _console: object | None = dataclasses.field(default=None, init=False)
    _output: object | None = dataclasses.field(default=None, init=False)  # the console's copy of standard output
    _swallowed: bool = dataclasses.field(default=False, init=False)  # the interrupt was ignored (`_unraisable`)
    _cut_short_timer: threading.Timer | None = dataclasses.field(default=None, init=False)  # `stop_itself`'s

    def line(self, kept_log: str | None = None) -> str:
        run_id = getattr(self.tracker, "run_id", None) or self.run_id
        committed = getattr(self.tracker, "committed", None) if self.tracker is not None else self.committed
        if run_id is None:
            said = f"stopped before the run began; start it again with: {self.restart_command}"
        elif committed is None:  # a new run, its MLflow run made
            said = (
                f"stopped before MLflow run {run_id} committed any {self.step_noun}; "
                f"start it again with: {self.restart_command}"
            )
        else:
            where = f"{self.step_noun} {committed} is the last committed to MLflow run {run_id}"
            flags = ""
            if self.tracking_uri is not None and self.tracking_uri != DEFAULT_TRACKING_URI:
                flags = f" --tracking-uri {shlex.quote(self.tracking_uri)}"
            said = f"stopped: {where}; continue with: {self.resume_command} {run_id}{flags}"
        if self.lost is not None:
            said = f"{self.lost}; {said}" + (" once it is back" if committed is not None else "")
        return said + (f" (the shutdown's log: {kept_log})" if kept_log else "")

    # --- the signals ------------------------------------------------------------------------

    def _handle(self, signum: int, frame) -> None:
        if self._swallowed:  # delivered again by `_unraisable`: the same first signal
            self._swallowed = False
            raise KeyboardInterrupt
        if self.signal is not None:  # a second signal: the shutdown is cut short
            self._cut_short(signum)
        self.signal = signum
        self._quiet()
        raise KeyboardInterrupt

    def _unraisable(self, unraisable, hook) -> None:
        """Python ignores an exception raised where nothing can catch it: the handler's
        KeyboardInterrupt raised while the main thread ran a weakref callback or a `__del__` (a
        garbage collection) was printed as "Exception ignored", and the run went on. The signal
        is then sent to the main thread again, a moment later, from outside this hook (where a
        raised exception is ignored too), and the handler raises it in the code running then."""
        if self.signal is None or not isinstance(unraisable.exc_value, KeyboardInterrupt):
            hook(unraisable)
            return
        self._swallowed = True
        again = threading.Timer(0.1, signal.pthread_kill, (threading.main_thread().ident, self.signal))
        again.daemon = True
        again.start()

    def _own_output(self, console) -> None:
        """`console` writes to a copy of standard output, which stays the terminal (`_quiet`)."""
        try:
            descriptor = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # a test's captured output: left as it is
            return
        self._console = console
        self._output = os.fdopen(os.dup(descriptor), "w", encoding=sys.stdout.encoding, errors="replace")
        console.file = self._output

    def _quiet(self) -> None:
        """Standard output and error to a file from here on (see the module docstring)."""
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            sys.stdout.flush()
            sys.stderr.flush()
        descriptor, self._log = tempfile.mkstemp(prefix="psro-stop-", suffix=".log")
        for stream in (1, 2):
            with contextlib.suppress(OSError):
                self._saved[stream] = os.dup(stream)
                os.dup2(descriptor, stream)
        os.close(descriptor)

    def _loud(self) -> None:
        """Standard output and error back where they were."""
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            sys.stdout.flush()
            sys.stderr.flush()
        for stream, saved in self._saved.items():
            os.dup2(saved, stream)
            os.close(saved)
        self._saved.clear()

    def _say(self, line: str) -> None:
        """The line, written whole to the console's output: a signal handler may interrupt a
        print, and the process may end right after."""
        output = self._output or sys.stdout
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            output.flush()
        with contextlib.suppress(OSError, ValueError):
            os.write(output.fileno(), (line + "\n").encode())

    def finish(self, error: BaseException) -> int:
        """After the shutdown: the line said; the exit code."""
        went_wrong = not isinstance(error, KeyboardInterrupt)
        if self._log and not went_wrong:
            with contextlib.suppress(OSError):
                os.unlink(self._log)
        self._say(self.line(kept_log=self._log if went_wrong else None))
        return self._code()

    def _code(self, signum: int | None = None) -> int:
        """The exit status: 75 for a lost head, else 128 + the signal (`signum`, or the first)."""
        return EXIT_HEAD_LOST if self.lost is not None else 128 + (signum or self.signal or signal.SIGTERM)

    def _cut_short(self, signum: int | None = None) -> None:
        """The process ends now, with the line (`signum`: the signal that cut the shutdown short)."""
        self._say(self.line())
        if self._log:
            with contextlib.suppress(OSError):
                os.unlink(self._log)
        os._exit(self._code(signum))

    def stop_itself(self, why: str) -> None:
        """From another thread: stop as on SIGTERM, the line saying `why`; if the shutdown has
        not ended the process within `HEAD_LOST_GRACE_S`, end it with the line."""
        if self.signal is not None:  # already stopping
            return
        self.lost = why
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        self._cut_short_timer = threading.Timer(HEAD_LOST_GRACE_S, self._cut_short)
        self._cut_short_timer.daemon = True
        self._cut_short_timer.start()

    def close(self) -> None:
        if self._cut_short_timer is not None:  # the shutdown ended in time
            self._cut_short_timer.cancel()
        self._loud()
        if self._output is not None:
            self._console.file = None  # the console's default again: standard output
            with contextlib.suppress(OSError):
                self._output.close()
            self._output = None


_active: CommandStop | None = None  # the command this process runs, while its signals are handled


@contextlib.contextmanager
def stop_on_signals(stop: CommandStop, console) -> Iterator[CommandStop]:
    """Around a run's whole command: SIGINT and SIGTERM stop it as the module docstring says,
    ending in SystemExit with 130 or 143; `console` (a rich Console) keeps the terminal. Main
    thread only (signal handlers are set there)."""
    global _active
    previous = {number: signal.getsignal(number) for number in SIGNALS}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(stop._unraisable, hook=previous_hook)
    stop._own_output(console)
    for number in SIGNALS:
        signal.signal(number, stop._handle)
    _active = stop
    try:
        yield stop
    except BaseException as error:
        if stop.signal is None:
            raise
        stop._loud()
        raise SystemExit(stop.finish(error)) from None
    finally:
        _active = None
        sys.unraisablehook = previous_hook
        for number, handler in previous.items():
            signal.signal(number, handler)
        stop.close()


@contextlib.contextmanager
def watching_ray_head(address: str | None) -> Iterator[None]:
    """Around a run on the Ray cluster at `address` (``ray://HOST:PORT`` or ``HOST:PORT``), in
    a command that handles its signals: a thread connects to the head every second, and stops
    the command once it has refused for `HEAD_LOST_AFTER_S` (the module docstring)."""
    stop = _active
    host, _, port = (address or "").removeprefix("ray://").rpartition(":")
    if stop is None or not host or not port.isdigit():  # no command, or no cluster address ("local", "auto")
        yield
        return
    done = threading.Event()

    def watch() -> None:
        answered = time.monotonic()
        while not done.wait(1.0):
            if _accepts(host, int(port)):
                answered = time.monotonic()
            elif time.monotonic() - answered > HEAD_LOST_AFTER_S:
                stop.stop_itself(f"lost the Ray head at {address} (no answer for {HEAD_LOST_AFTER_S:.0f} s)")
                return

    watcher = threading.Thread(target=watch, name="ray-head-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()


def _accepts(host: str, port: int) -> bool:
    """Whether `host:port` accepts a TCP connection within a second."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def follow(tracker) -> None:
    """The runtime's hand-over of a run's tracker to the command running it, if any: the line
    of a stopped command reads the MLflow run and its last commit from it."""
    if _active is not None:
        _active.tracker = tracker
