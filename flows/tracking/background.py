"""One MLflow tracking thread per run, for every scenario's tracker (`scenario_tracker.py`).

MLflow calls take milliseconds to seconds (SQLite commits, artifact copies, registry versions),
so a tracker queues them on one thread and the training loop goes on. One thread keeps them in
order. A failure surfaces at the next queued call (`_raise_failures`) or when the tracker waits
(`_drain`), never silently; leaving the `with` block queues `_end` with the run's status and
waits for everything.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor


class BackgroundTracker:
    """Subclasses implement `_start()` (queued on enter) and `_end(status)` (queued on exit)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-tracking")
        self._pending: list[Future] = []

    def __enter__(self):
        self._submit(self._start)  # failures surface at the next logging call
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        try:
            self._submit(self._end, "FINISHED" if exc_type is None else "FAILED")
            self._drain()
        finally:
            self._pool.shutdown(wait=True)

    def _start(self) -> None:
        raise NotImplementedError

    def _end(self, status: str) -> None:
        raise NotImplementedError

    def _submit(self, fn, *args) -> None:
        self._pending.append(self._pool.submit(fn, *args))

    def _raise_failures(self) -> None:
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        for future in done:
            future.result()

    def _drain(self) -> None:
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()
