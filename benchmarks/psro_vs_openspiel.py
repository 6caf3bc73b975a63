"""This project's PSRO against OpenSpiel's psro_v2, side by side in one run.

Both run PSRO with exact best responses and a Nash meta-solver on the same game (default
leduc_poker). For each, the wall time until exploitability (NashConv / players) first reaches
1.0, 0.5 and 0.25 is printed, with the ratio OpenSpiel / ours.

- Ours is timed from the call that starts it: the Prefect server, Ray, MLflow (SQLite, with
  every member registered) and each iteration's Prefect flow are all inside the clock.
  Prefect's database migrations, a one-time step per machine, are done before the clock
  starts if `~/.prefect` has never held a server.
- OpenSpiel's psro_v2 runs with the `psro_v2_example.py` defaults (1000 simulations per
  meta-game entry); its clock stops while we measure its NashConv (see openspiel_psro.py).

Usage: python benchmarks/psro_vs_openspiel.py [--game leduc_poker] [--time-cap 900]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from openspiel_psro import run_openspiel_psro

THRESHOLDS = (1.0, 0.5, 0.25)


def first_times(records: list[tuple[float, float]], thresholds) -> dict[float, float | None]:
    """Seconds at which exploitability first reached each threshold (None: never)."""
    return {
        threshold: next((seconds for seconds, value in records if value <= threshold), None)
        for threshold in thresholds
    }


def prepare_prefect_database() -> None:
    """Run Prefect's one-time database migrations outside the clock."""
    from flows.runtime import prefect_api

    if not (Path.home() / ".prefect" / "prefect.db").exists():
        print("preparing Prefect's database (one-time migrations, not timed)", flush=True)
        with prefect_api() as (_, wait):
            wait()


def run_ours(game: str, time_cap: float, stop: float) -> list[tuple[float, float]]:
    from flows.runtime import prefect_api

    records: list[tuple[float, float]] = []

    def on_iteration(record, state) -> None:
        seconds = time.perf_counter() - started
        records.append((seconds, record.report.exploitability))
        print(f"  ours      iter {record.iteration:4d}  {seconds:7.1f}s  exploitability {record.report.exploitability:.4f}", flush=True)
        if seconds > time_cap:
            raise TimeoutError

    with tempfile.TemporaryDirectory() as tracking_dir:
        started = time.perf_counter()  # the same order as `psro run`: server first, then imports
        with prefect_api() as api:
            from flows.psro_flow import run_psro
            from marl_core.config import PSROConfig

            config = PSROConfig(
                game=game, meta_solver="nash", oracle="exact", iterations=400,
                stop_exploitability=stop, tracking_uri=f"sqlite:///{tracking_dir}/mlflow.db",
            )
            try:
                run_psro(config, on_iteration, api=api)
            except TimeoutError:
                print("  ours: time cap reached")
    return records


def run_theirs(game: str, time_cap: float, stop: float) -> list[tuple[float, float]]:
    def show(entry):
        print(f"  openspiel iter {entry['iteration']:4d}  {entry['elapsed_seconds']:7.1f}s  exploitability {entry['exploitability']:.4f}", flush=True)

    entries = run_openspiel_psro(game, time_cap_seconds=time_cap, stop_exploitability=stop, on_record=show)
    return [(entry["elapsed_seconds"], entry["exploitability"]) for entry in entries]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default="leduc_poker")
    parser.add_argument("--time-cap", type=float, default=900.0, help="seconds per implementation")
    args = parser.parse_args()
    stop = min(THRESHOLDS)

    prepare_prefect_database()
    print(f"this project on {args.game}", flush=True)
    ours = first_times(run_ours(args.game, args.time_cap, stop), THRESHOLDS)
    print(f"OpenSpiel psro_v2 on {args.game}", flush=True)
    theirs = first_times(run_theirs(args.game, args.time_cap, stop), THRESHOLDS)

    def show(seconds):
        return f"{seconds:8.1f}s" if seconds is not None else f"  >{args.time_cap:.0f}s"

    print(f"\nwall seconds to reach exploitability (NashConv / players) on {args.game}")
    print(f"{'threshold':>10} {'this project':>13} {'psro_v2':>10} {'ratio':>8}")
    for threshold in THRESHOLDS:
        a, b = ours[threshold], theirs[threshold]
        if a is not None and b is not None:
            ratio = f"{b / a:7.1f}x"
        elif a is not None:
            ratio = f">{args.time_cap / a:6.1f}x"
        else:
            ratio = "    n/a"
        print(f"{threshold:>10} {show(a):>13} {show(b):>10} {ratio:>8}")


if __name__ == "__main__":
    main()
