"""`psro server`: a Prefect server and a local Ray instance that outlive single runs.

A cold `psro run` starts a Prefect server and a Ray instance and stops both when it ends. With
`psro server` running in another terminal, runs find it (through a small file in Prefect's home,
which `flows.services.prefect_server.find_running_server` reads) and reuse both: no server boot, no Ray start.
The server process owns what it started and stops all of it on Ctrl-C or SIGTERM; nothing runs
in the background after it exits.

Ray's workers see the server's Prefect API address from their environment, inherited from this
process, so a run that joins this Ray needs no runtime environment of its own (which would cost
an agent round trip for every worker it starts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
from collections.abc import Callable

from flows.services.prefect_server import STATE_FILE, LocalPrefectServer, RunningServer, prefect_home
from flows.services.ray_session import start_ray


def serve(port: int, num_cpus: int | None, on_ready: Callable[[RunningServer], None]) -> None:
    """Start both services, announce them, and block until Ctrl-C or SIGTERM; then stop both."""
    import ray

    home = prefect_home()
    stop = threading.Event()
    server = LocalPrefectServer(home, port=port)
    state_path = home / STATE_FILE
    try:
        start_ray(None, num_cpus, {"PREFECT_API_URL": server.url}, shared=True)  # runs join it
        for signum in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which installs its own
            signal.signal(signum, lambda *_: stop.set())
        server.wait()
        running = RunningServer(server.url, ray.get_runtime_context().gcs_address, os.getpid())
        temporary = state_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(dataclasses.asdict(running)))
        temporary.replace(state_path)
        on_ready(running)
        while not stop.wait(1.0):
            pass
    finally:
        with contextlib.suppress(FileNotFoundError):
            state_path.unlink()
        ray.shutdown(wait_for_processes=True)
        server.stop()
