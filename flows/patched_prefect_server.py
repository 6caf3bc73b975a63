"""`prefect server start`, with SQLite write transactions begun IMMEDIATE.

Usage: ``python -m flows.patched_prefect_server server start --host 127.0.0.1 --port 4200``
(any arguments of the `prefect` CLI work; this module only patches, then hands over to it).

Why: on SQLite, Prefect's API opens write transactions DEFERRED. One that reads before it writes
(creating a task run reads the flow run's labels first) fails at once with "database is locked"
when the task-run recorder commits in between; the API answers 503 and the client backs off
2 s. Under RayTaskRunner that hit every other PSRO iteration here (Prefect issues #7277,
#18934). Beginning write transactions IMMEDIATE takes SQLite's write lock up front, so writers
queue on the busy timeout instead of failing. Measured on this machine: 8 retries (16 s) per
20 subflows before, 0 after; an empty subflow went from 1.9 s to 0.35 s. PostgreSQL-backed
servers do not need this.

It also stops itself when the process that started it dies: a driver killed with SIGKILL gets
no chance to stop its server, and an orphaned server would hold its port and database forever.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


def _begin_write_transactions_immediate() -> None:
    from prefect.server.database import configurations

    sqlite = configurations.AioSqliteConfiguration
    original = sqlite.begin_transaction
    if getattr(original, "_immediate", False):
        return

    def begin_transaction(self, session, with_for_update: bool = False):
        return original(self, session, with_for_update=True)

    begin_transaction._immediate = True
    sqlite.begin_transaction = begin_transaction


def _exit_with_parent(poll_seconds: float = 1.0) -> None:
    """Stop this server (its whole process group) once the parent that started it is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        os.killpg(os.getpgid(0), signal.SIGTERM)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str]) -> None:
    if os.environ.get("PSRO_SERVER_EXIT_WITH_PARENT") == "1":
        _exit_with_parent()
    _begin_write_transactions_immediate()
    from prefect.cli import app

    sys.argv = ["prefect", *argv]
    app()


if __name__ == "__main__":
    main(sys.argv[1:])
