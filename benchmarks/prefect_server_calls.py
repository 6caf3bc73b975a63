"""How fast the Prefect server answers the calls every iteration's subflow makes, with nothing else running.

    .venv/bin/python benchmarks/prefect_server_calls.py --calls 60

Each PSRO iteration is a Prefect flow run, so the server's answers bound how fast iterations can
follow each other however well the driver overlaps them (docs/performance.md, "Where an
iteration's time goes"). This starts the server `psro run` starts (`flows.services.prefect_server.LocalPrefectServer`,
one-run services off) in a temporary Prefect home and times, one after another, the calls of a
flow run's life: create it, read it back, propose Running, propose Completed. It prints the
median and mean of each (the first 10 rounds, the server's warm-up, left out) and the load
average before and after: with another job running the figures mean little.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

WARM_UP = 10


async def time_calls(rounds: int) -> dict[str, list[float]]:
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running

    @flow
    def iteration() -> None:
        pass

    seconds: dict[str, list[float]] = {
        "create flow run": [],
        "read flow run": [],
        "propose Running": [],
        "propose Completed": [],
    }
    async with get_client() as client:
        await client.create_flow(iteration)
        for _ in range(WARM_UP + rounds):
            started = time.perf_counter()
            run = await client.create_flow_run(iteration, parameters={})
            seconds["create flow run"].append(time.perf_counter() - started)
            for name, call in [
                ("read flow run", lambda run=run: client.read_flow_run(run.id)),
                ("propose Running", lambda run=run: client.set_flow_run_state(run.id, Running())),
                ("propose Completed", lambda run=run: client.set_flow_run_state(run.id, Completed())),
            ]:
                started = time.perf_counter()
                await call()
                seconds[name].append(time.perf_counter() - started)
    return {name: values[WARM_UP:] for name, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=60, help="flow runs to time (each makes one call of every kind)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from flows.services.prefect_server import LocalPrefectServer

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as home:
        server = LocalPrefectServer(Path(home) / "prefect", one_run=True)
        os.environ["PREFECT_API_URL"] = server.url
        try:
            started = time.perf_counter()
            server.wait()
            print(
                f"server answering after {time.perf_counter() - started:.1f} s "
                "(a new Prefect home: its database is created)"
            )
            seconds = asyncio.run(time_calls(args.calls))
        finally:
            server.stop()
    print(f"{'call':<20}{'median ms':>10}{'mean ms':>10}")
    for name, values in seconds.items():
        print(f"{name:<20}{1000 * statistics.median(values):>10.1f}{1000 * statistics.fmean(values):>10.1f}")
    total = sum(statistics.median(values) for values in seconds.values())
    print(f"one flow run's four calls: {1000 * total:.0f} ms (medians)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
