"""A Prefect flow whose tasks run while a test holds its server's database down:
`python tests/outage_flow.py DIR TASKS`. It runs one task, writes its flow run's id to
DIR/ready, waits for DIR/go, runs TASKS tasks more (their events reach the server, which cannot
write them yet), writes DIR/ran and ends; its own end waits for the server, as a run's would."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from prefect import flow, task
from prefect.runtime import flow_run


@task
def step(index: int) -> int:
    return index


@flow
def outage(folder: Path, tasks: int) -> None:
    step(0)
    (folder / "ready").write_text(str(flow_run.id))
    deadline = time.monotonic() + 120
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no go: the test did not stop the database")
        time.sleep(0.1)
    for index in range(1, tasks + 1):
        step(index)
    (folder / "ran").touch()


if __name__ == "__main__":
    outage(Path(sys.argv[1]), int(sys.argv[2]))
