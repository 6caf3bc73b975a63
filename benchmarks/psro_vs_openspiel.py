"""This project's PSRO against OpenSpiel's psro_v2, with the in-process loop as the floor, in one run.

All run PSRO with exact best responses and a Nash meta-solver on the same game (default
leduc_poker). For each, the wall time until exploitability (NashConv / players) first reaches
1.0, 0.5, 0.25, 0.1 and 0.05 is printed, with the ratios OpenSpiel / ours and ours / floor.

- **floor**: `marl_core.psro.steps.iterate_psro_local` in this process: the same computation with no
  orchestration at all, timed from the call (tree building included).
- **cold**: `psro run`'s path in a fresh process, timed from the start of what a run starts:
  the Prefect server, Ray, the MLflow store (SQLite, every member registered), the flow
  imports and each iteration's Prefect subflow are all inside the clock. Prefect's database
  migrations, a one-time step per machine, happen before the clock if `~/.prefect` never
  held a server.
- **warm**: the same, in another fresh process, while a `psro server` runs: its Prefect server
  and Ray are reused, so neither starts inside the clock.
- **psro_v2**: OpenSpiel's own PSRO with the `psro_v2_example.py` defaults (1000 simulations per
  meta-game entry); its clock stops while we measure its NashConv (see openspiel_psro.py). A
  threshold it never reaches within the time cap is shown as "> cap", and the ratio as a bound.

The machine must be quiet: the benchmark refuses to start while the 1-minute load average is at
or above half the CPU count (`--force` times anyway), and prints the load beside the figures.

    python benchmarks/psro_vs_openspiel.py [--game leduc_poker] [--time-cap 600] [--skip-openspiel]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

THRESHOLDS = (1.0, 0.5, 0.25, 0.1, 0.05)
ROOT = Path(__file__).resolve().parents[1]


def first_times(records: list[tuple[float, float]]) -> dict[float, float | None]:
    """Seconds at which exploitability first reached each threshold (None: never)."""
    return {t: next((seconds for seconds, value in records if value <= t), None) for t in THRESHOLDS}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def prepare_prefect_database() -> None:
    """Run Prefect's one-time database migrations outside the clock."""
    from flows.services.prefect_server import prefect_api

    if not (Path.home() / ".prefect" / "prefect.db").exists():
        print("preparing Prefect's database (one-time migrations, not timed)", flush=True)
        with prefect_api() as (_, wait):
            wait()


def run_floor(game: str, stop: float, time_cap: float) -> list[tuple[float, float]]:
    from marl_core.psro.config import PSROConfig
    from marl_core.psro.steps import iterate_psro_local

    config = PSROConfig(game=game, meta_solver="nash", oracle="exact", iterations=400, stop_exploitability=stop)
    records, started = [], time.perf_counter()
    for record, _ in iterate_psro_local(config):
        records.append((time.perf_counter() - started, record.report.exploitability))
        if records[-1][0] > time_cap:
            break
    return records


def run_ours_here(game: str, stop: float, time_cap: float) -> None:
    """Child process: one `psro run`-path run; prints a JSON line per iteration."""
    started = time.perf_counter()  # the same order as `psro run`: server and Ray first, then imports
    from flows.services.run_services import services_starting

    def on_iteration(record, state) -> None:
        seconds = time.perf_counter() - started
        print(
            json.dumps(
                {"iteration": record.iteration, "seconds": seconds, "exploitability": record.report.exploitability}
            ),
            flush=True,
        )
        if seconds > time_cap:
            raise TimeoutError

    with tempfile.TemporaryDirectory() as tracking_dir, services_starting(None, None, game) as services:
        from flows.deployments.entrypoints import run_scenario
        from flows.scenarios.psro import PSRO
        from marl_core.psro.config import PSROConfig

        config = PSROConfig(
            game=game,
            meta_solver="nash",
            oracle="exact",
            iterations=400,
            stop_exploitability=stop,
            tracking_uri=f"sqlite:///{tracking_dir}/mlflow.db",
        )
        try:
            run_scenario(PSRO, config, observer=on_iteration, services=services)
        except TimeoutError:
            pass


def run_ours(label: str, game: str, stop: float, time_cap: float) -> list[tuple[float, float]]:
    command = [sys.executable, __file__, "--child", "--game", game, "--time-cap", str(time_cap)]
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    records = []
    for line in child.stdout:
        if line.startswith("{"):
            entry = json.loads(line)
            records.append((entry["seconds"], entry["exploitability"]))
            print(
                f"  {label:<9} iter {entry['iteration']:4d}  {entry['seconds']:7.1f}s  "
                f"exploitability {entry['exploitability']:.4f}",
                flush=True,
            )
    if child.wait() != 0:
        raise RuntimeError(f"the {label} run failed (exit code {child.returncode})")
    return records


class PsroServer:
    """A `psro server` in a child process, for the warm runs; stopped with SIGTERM."""

    def __enter__(self):
        from flows.services.prefect_server import find_running_server

        if find_running_server():
            raise RuntimeError("a psro server is already running; stop it so the cold run starts its own")
        self.process = subprocess.Popen(
            [str(Path(sys.executable).with_name("psro")), "server", "--port", "0"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while not find_running_server():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("psro server did not come up")
            time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=60)


def run_theirs(game: str, time_cap: float, stop: float) -> list[tuple[float, float]]:
    from openspiel_psro import run_openspiel_psro

    def show(entry):
        print(
            f"  {'psro_v2':<9} iter {entry['iteration']:4d}  {entry['elapsed_seconds']:7.1f}s  "
            f"exploitability {entry['exploitability']:.4f}",
            flush=True,
        )

    entries = run_openspiel_psro(game, time_cap_seconds=time_cap, stop_exploitability=stop, on_record=show)
    return [(entry["elapsed_seconds"], entry["exploitability"]) for entry in entries]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default="leduc_poker")
    parser.add_argument("--time-cap", type=float, default=600.0, help="seconds per implementation")
    parser.add_argument("--skip-openspiel", action="store_true", help="time this project only")
    parser.add_argument("--force", action="store_true", help="time even on a busy machine")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    stop = min(THRESHOLDS)
    if args.child:
        run_ours_here(args.game, stop, args.time_cap)
        return

    busy = os.getloadavg()[0] >= (os.cpu_count() or 1) / 2
    if busy and not args.force:
        sys.exit(f"load average {load()} on {os.cpu_count()} CPUs: another job is running; wait, or pass --force")
    print(f"load average before: {load()} on {os.cpu_count()} CPUs", flush=True)
    prepare_prefect_database()
    results = {}
    print(f"in-process loop (floor) on {args.game}", flush=True)
    results["floor"] = first_times(run_floor(args.game, stop, args.time_cap))
    print(f"this project, cold (starts its Prefect server and Ray) on {args.game}", flush=True)
    results["cold"] = first_times(run_ours("cold", args.game, stop, args.time_cap))
    with PsroServer():
        print(f"this project, warm (a running psro server's Prefect and Ray) on {args.game}", flush=True)
        results["warm"] = first_times(run_ours("warm", args.game, stop, args.time_cap))
    if not args.skip_openspiel:
        print(f"OpenSpiel psro_v2 on {args.game}", flush=True)
        results["psro_v2"] = first_times(run_theirs(args.game, args.time_cap, stop))

    def show(seconds):
        return f"{seconds:8.1f}s" if seconds is not None else f"  >{args.time_cap:.0f}s"

    def ratio(a, b, bound_when_missing=False):
        if a is not None and b is not None:
            return f"{a / b:6.2f}x"
        if a is None and b is not None and bound_when_missing:
            return f">{args.time_cap / b:5.1f}x"
        return "    n/a"

    columns = [name for name in ("floor", "cold", "warm", "psro_v2") if name in results]
    print(f"\nwall seconds to reach exploitability (NashConv / players) on {args.game}; load average now {load()}")
    header = f"{'threshold':>10} " + " ".join(f"{c:>10}" for c in columns) + f" {'cold/floor':>11} {'warm/floor':>11}"
    if "psro_v2" in results:
        header += f" {'psro_v2/cold':>13} {'psro_v2/warm':>13}"
    print(header)
    for t in THRESHOLDS:
        floor, cold, warm = results["floor"][t], results["cold"][t], results["warm"][t]
        line = f"{t:>10} " + " ".join(f"{show(results[c][t]):>10}" for c in columns)
        line += f" {ratio(cold, floor):>11} {ratio(warm, floor):>11}"
        if "psro_v2" in results:
            theirs = results["psro_v2"][t]
            line += f" {ratio(theirs, cold, True):>13} {ratio(theirs, warm, True):>13}"
        print(line)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
