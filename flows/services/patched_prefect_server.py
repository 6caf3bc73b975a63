"""`prefect server start`, with this project's patches of the server applied
(`flows.services.patches.apply_server_patches`: SQLite write transactions begun IMMEDIATE, so writers queue
instead of being refused; while the database cannot be reached, requests answered 503, which
clients retry, and task-run events kept until it can).

Usage: ``python -m flows.services.patched_prefect_server server start --host 127.0.0.1 --port 4200``
(any arguments of the `prefect` CLI work; this module only patches, then hands over to it).

It also stops itself when the process that started it dies: a driver killed with SIGKILL gets
no chance to stop its server, and an orphaned server would hold its port and database forever.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from flows.services.patches import apply_server_patches


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
    apply_server_patches()
    from prefect.cli import app

    sys.argv = ["prefect", *argv]
    app()


if __name__ == "__main__":
    main(sys.argv[1:])
