r"""Pipeline PSRO against sequential PSRO with the same learned oracle, in one run.

Both run `psro run`'s path (a Prefect server, a local Ray, an MLflow store, one subflow per
iteration) on the same game and config file, one after the other, each in a fresh process and
timed from its start; they differ only in the config's `pipeline` section (sequential: none).
For each, the wall time until exploitability (exact, NashConv / players) first reaches each
threshold is printed, with the ratio sequential / pipeline. A run stops at the lowest
threshold or at the time cap; a run that reached it exports its population, and OpenSpiel's own
`exploitability.nash_conv` (`scripts/verify_export.py`) measures the export again.

The machine must be quiet: the benchmark refuses to start while the 1-minute load average is at
or above half the CPU count (`--force` times anyway), and prints the load beside the figures.

    python benchmarks/pipeline_vs_sequential.py --config leduc-dqn.yaml [--levels 2] [--thresholds 1.0 0.5] \
        [--time-cap 3600]
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

import yaml
from psro_vs_openspiel import load  # the load average as both benchmarks print it

ROOT = Path(__file__).resolve().parents[1]


def first_times(records: list[tuple[float, float]], thresholds) -> dict[float, float | None]:
    """Seconds at which exploitability first reached each threshold (None: never)."""
    return {t: next((seconds for seconds, value in records if value <= t), None) for t in thresholds}


def run_here(settings: dict, time_cap: float) -> None:
    """Child process: one run; prints a JSON line per iteration."""
    started = time.perf_counter()
    from flows.services.run_services import services_starting

    def on_iteration(record, state) -> None:
        seconds = time.perf_counter() - started
        episodes = [value for key, value in record.oracle_metrics.items() if key.endswith("/oracle_episodes")]
        print(
            json.dumps(
                {
                    "iteration": record.iteration,
                    "seconds": seconds,
                    "exploitability": record.exploitability,
                    "episodes": min(episodes) if episodes else 0,
                }
            ),
            flush=True,
        )
        if seconds > time_cap:
            raise TimeoutError

    with tempfile.TemporaryDirectory() as tracking_dir, services_starting(None, None, settings["game"]) as services:
        from flows.deployments.entrypoints import run_scenario
        from flows.scenarios.psro import PSRO
        from marl_core.psro.config import build_config

        export = Path(tracking_dir) / "export"
        config = build_config(
            {**settings, "tracking_uri": f"sqlite:///{tracking_dir}/mlflow.db", "export": str(export)}
        )
        try:
            run_scenario(PSRO, config, observer=on_iteration, services=services)
        except TimeoutError:
            return
        sys.path.insert(0, str(ROOT / "scripts"))
        from verify_export import verify

        checked = verify(export)
        print(
            json.dumps({"openspiel_exploitability": checked["openspiel_exploitability"], "passed": checked["passed"]}),
            flush=True,
        )


def run(label: str, settings: dict, time_cap: float) -> tuple[list[tuple[float, float]], dict | None]:
    """The run's (seconds, exploitability) per iteration, and OpenSpiel's check of its export (None: time-capped)."""
    command = [sys.executable, __file__, "--child", json.dumps(settings), "--time-cap", str(time_cap)]
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    records, checked = [], None
    for line in child.stdout:
        if line.startswith("{"):
            entry = json.loads(line)
            if "openspiel_exploitability" in entry:
                checked = entry
                print(
                    f"  {label:<10} export checked by OpenSpiel: exploitability {entry['openspiel_exploitability']:.4f}"
                    f" ({'agrees' if entry['passed'] else 'DISAGREES'})",
                    flush=True,
                )
                continue
            records.append((entry["seconds"], entry["exploitability"]))
            print(
                f"  {label:<10} iter {entry['iteration']:4d}  {entry['seconds']:7.1f}s  "
                f"exploitability {entry['exploitability']:.4f}"
                f"  response episodes {entry['episodes']:,.0f}  load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    if child.wait() != 0:
        raise RuntimeError(f"the {label} run failed (exit code {child.returncode})")
    return records, checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", type=Path, help="a learned-oracle PSRO config (its pipeline section, if any, is replaced)"
    )
    parser.add_argument("--levels", type=int, default=2, help="the pipeline's active levels")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[1.0, 0.5])
    parser.add_argument("--time-cap", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--force", action="store_true", help="time even on a busy machine")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_here(json.loads(args.child), args.time_cap)
        return
    if args.config is None:
        parser.error("--config is required")

    busy = os.getloadavg()[0] >= (os.cpu_count() or 1) / 2
    if busy and not args.force:
        sys.exit(f"load average {load()} on {os.cpu_count()} CPUs: another job is running; wait, or pass --force")
    settings = {key.replace("-", "_"): value for key, value in yaml.safe_load(args.config.read_text()).items()}
    settings.pop("pipeline", None)
    stop = min(args.thresholds)
    sequential = {**settings, "stop_exploitability": stop}
    pipeline = {**sequential, "pipeline": {"active_levels": args.levels}}
    print(f"load average before: {load()} on {os.cpu_count()} CPUs; config {args.config}, stop at {stop}", flush=True)
    runs = {
        label: run(label, values, args.time_cap)
        for label, values in (("sequential", sequential), ("pipeline", pipeline))
    }
    results = {label: first_times(records, args.thresholds) for label, (records, _) in runs.items()}

    def show(seconds):
        return f"{seconds:8.1f}s" if seconds is not None else f"  >{args.time_cap:.0f}s"

    print(f"\nwall seconds to reach exploitability on {settings['game']}; load average now {load()}")
    print(f"{'threshold':>10} {'sequential':>11} {'pipeline':>11} {'sequential/pipeline':>20}")
    for t in args.thresholds:
        a, b = results["sequential"][t], results["pipeline"][t]
        ratio = f"{a / b:.2f}x" if a is not None and b is not None else "n/a"
        print(f"{t:>10} {show(a):>11} {show(b):>11} {ratio:>20}")
    for label, (_, checked) in runs.items():
        if checked is not None:
            print(
                f"{label}: the export at its stop, by OpenSpiel's nash_conv: "
                f"exploitability {checked['openspiel_exploitability']:.4f}"
            )


if __name__ == "__main__":
    main()
