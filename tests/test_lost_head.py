"""A command whose run joined a Ray cluster stops itself when the cluster's head stops answering
(`flows.runtime.stopping.watching_ray_head`): one line, exit 75, as tests/test_hosts.py sees
on a real head's loss; here the head is a port nothing listens on, so the watch is quick."""

from __future__ import annotations

import socket
import subprocess
import sys

SCRIPT = """
import sys, time
from rich.console import Console
from flows.runtime import stopping

stopping.HEAD_LOST_AFTER_S, stopping.HEAD_LOST_GRACE_S = 2.0, float(sys.argv[2])
stop = stopping.CommandStop("iteration", "psro resume", "psro run")
stop.tracking_uri, stop.run_id, stop.committed = "http://127.0.0.2:5000", "abc", 3
with stopping.stop_on_signals(stop, Console()):
    with stopping.watching_ray_head(sys.argv[1]):
        if sys.argv[3] == "stuck":  # a shutdown that never ends: the process is ended for it
            try:
                time.sleep(120)
            finally:
                time.sleep(120)
        time.sleep(120)
print("not stopped")
"""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_command_whose_ray_head_stops_answering_stops_itself_in_one_line():
    address = f"ray://127.0.0.1:{_closed_port()}"
    expected = (
        f"lost the Ray head at {address} (no answer for 2 s); stopped: iteration 3 is the last committed to "
        "MLflow run abc; continue with: psro resume abc --tracking-uri http://127.0.0.2:5000 once it is back"
    )
    for shutdown, grace in (("ends", "60"), ("stuck", "3")):
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, address, grace, shutdown], capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 75, (shutdown, done.stdout, done.stderr[-2000:])
        assert done.stdout.strip().splitlines() == [expected], (shutdown, done.stdout)
