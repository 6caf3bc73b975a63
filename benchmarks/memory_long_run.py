"""Resident memory over a long PSRO run through the real flow, and what the run leaves behind.

One process runs `flows.deployments.entrypoints.run_scenario` (its own Prefect server, local Ray, an MLflow SQLite
store, every member registered) and records, at every iteration, the resident memory of this
driver and of every process the run started, grouped by kind. Started processes are found by an
environment variable the script sets before anything starts (`PSRO_RUN_MARKER`): the Prefect
server, Ray's raylet, GCS and workers all inherit it, so the count is exact even on a machine
where other runs have their own Ray and Prefect processes.

Writes a JSON report (per-iteration samples, the driver's peak RSS from the kernel's VmHWM, wall
time) and prints a summary. With --fail-at N the on_iteration callback raises at iteration N,
to check that a failed run stops everything it started too. With --tracemalloc the largest
Python allocation growths between the first sample at or after iteration 50 and the end are
printed, for finding what a growing run holds on to.

Usage: python benchmarks/memory_long_run.py --work DIR [--iterations 300] [--game kuhn_poker]
       [--fail-at N] [--tracemalloc] [--no-register]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

MARKER = "PSRO_RUN_MARKER"
KINDS = ("ray_worker", "ray_system", "prefect_server", "other")


def rss_kib(pid: int | str = "self", field: str = "VmRSS") -> int:
    """A field of /proc/PID/status in KiB (VmRSS: resident now, VmHWM: peak resident)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0  # a zombie has no memory lines


def marked_processes(value: str) -> dict[int, str]:
    """pid -> command line of every process (but this one) whose environment holds the marker."""
    needle = f"{MARKER}={value}".encode()
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found[int(pid)] = (
                    Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                )
        except OSError:
            continue
    return found


def kind(command: str) -> str:
    if command.startswith("ray::"):
        return "ray_worker"  # Ray renames its workers ray::IDLE, ray::<task name>
    if "flows.services.patched_prefect_server" in command:
        return "prefect_server"
    if "ray" in command:  # raylet, gcs_server, the log monitor, the dashboard agents
        return "ray_system"
    return "other"


def driver_maps() -> dict[str, int]:
    """This process's resident KiB by kind of mapping: where growth lives (malloc heap and
    thread arenas, shared memory such as Ray's object store, mapped files)."""
    totals: dict[str, int] = {}
    name = "?"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            path = head[5] if len(head) > 5 else ""
            name = (
                path
                if path.startswith("[")
                else "anonymous"
                if not path
                else "shared memory"
                if path.startswith("/dev/shm")
                else "files"
            )
        elif head[0] == "Rss:":
            totals[name] = totals.get(name, 0) + int(head[1])
    return totals


def sample(iteration: int, marker: str) -> dict:
    by_kind = dict.fromkeys(KINDS, 0)
    counts = dict.fromkeys(KINDS, 0)
    for pid, command in marked_processes(marker).items():
        try:
            by_kind[kind(command)] += rss_kib(pid)
            counts[kind(command)] += 1
        except OSError:
            continue
    driver = {field: rss_kib(field=field) for field in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}
    return {
        "iteration": iteration,
        "driver_kib": driver["VmRSS"],
        "driver": driver,
        "kib": by_kind,
        "processes": counts,
        "time": time.perf_counter(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="directory for the MLflow store, Prefect home, report")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--game", default="kuhn_poker")
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--fail-at", type=int, default=None, help="raise from on_iteration at this iteration")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--no-register", action="store_true", help="skip the MLflow model registry")
    parser.add_argument("--malloc-trim", action="store_true", help="return freed heap to the system before each sample")
    args = parser.parse_args(argv)
    if args.malloc_trim:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    marker = str(work)
    for name in [n for n in os.environ if n.startswith(("PREFECT_", "RAY_"))]:
        del os.environ[name]
    os.environ.update({MARKER: marker, "PREFECT_HOME": str(work / "prefect-home")})
    os.chdir(work)  # MLflow's default artifact root ./mlruns lands here

    if args.tracemalloc:
        import tracemalloc

        tracemalloc.start(12)
    from flows.deployments.entrypoints import run_scenario
    from flows.scenarios.psro import PSRO  # after the environment is set: Prefect reads it on import
    from marl_core.psro.config import build_config

    config = build_config(
        {
            "game": args.game,
            "iterations": args.iterations,
            "num_cpus": args.num_cpus,
            "tracking_uri": f"sqlite:///{work}/mlflow.db",
            "experiment": "memory",
            "register_models": not args.no_register,
        }
    )
    samples: list[dict] = []
    snapshots = {}

    def on_iteration(record, state) -> None:
        if args.malloc_trim:
            libc.malloc_trim(0)
        samples.append(sample(record.iteration, marker))
        samples[-1].update(seconds=record.iteration_seconds, stages=record.stage_seconds)
        if record.iteration in (50, args.iterations):
            samples[-1]["driver_maps"] = driver_maps()
        if args.tracemalloc and record.iteration >= 50 and "early" not in snapshots:
            snapshots["early"] = tracemalloc.take_snapshot()
        if record.iteration % 25 == 0:
            s = samples[-1]
            print(
                f"iter {record.iteration:4d}  driver {s['driver_kib'] / 1024:7.1f} MiB  "
                + "  ".join(
                    f"{k} {v / 1024:7.1f} MiB ({s['processes'][k]})" for k, v in s["kib"].items() if s["processes"][k]
                ),
                flush=True,
            )
        if args.fail_at is not None and record.iteration == args.fail_at:
            raise RuntimeError(f"deliberate failure at iteration {record.iteration}")

    started = time.perf_counter()
    error = None
    try:
        run_scenario(PSRO, config, observer=on_iteration)
    except Exception as exc:  # the --fail-at case; reported, and the exit code says so
        error = f"{type(exc).__name__}: {exc}"
    wall = time.perf_counter() - started

    report = {
        "iterations": args.iterations,
        "game": args.game,
        "wall_seconds": wall,
        "error": error,
        "driver_peak_kib": rss_kib(field="VmHWM"),
        "samples": samples,
        "left_running": marked_processes(marker),
        # threads the interpreter would wait for at exit (a subflow left calling a stopped server)
        "threads_left": [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()],
    }
    (work / "memory_report.json").write_text(json.dumps(report, indent=1))
    _summarize(report)
    if args.tracemalloc and "early" in snapshots:
        late = tracemalloc.take_snapshot()
        print("largest Python allocation growth since iteration 50:")
        for stat in late.compare_to(snapshots["early"], "traceback")[:8]:
            print(
                f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  "
                f"{stat.traceback.format()[-1].strip()}"
            )
    return 1 if error else 0


def _summarize(report: dict) -> None:
    by_iteration = {s["iteration"]: s for s in report["samples"]}
    print(
        f"{report['iterations']} iterations of {report['game']} in {report['wall_seconds']:.1f} s; "
        f"driver peak RSS {report['driver_peak_kib'] / 1024:.1f} MiB"
    )
    if 50 in by_iteration and report["samples"]:
        early, late = by_iteration[50], report["samples"][-1]
        for name, a, b in [("driver", early["driver_kib"], late["driver_kib"])] + [
            (k, early["kib"][k], late["kib"][k]) for k in KINDS if early["kib"][k] or late["kib"][k]
        ]:
            print(
                f"  {name:15s} iteration 50: {a / 1024:7.1f} MiB  iteration {late['iteration']}: {b / 1024:7.1f} MiB  "
                f"({(b / a - 1) * 100 if a else float('nan'):+.1f}%)"
            )
    if report["error"]:
        print(f"run failed: {report['error']}")
    print(f"processes left running: {len(report['left_running'])}; threads left running: {len(report['threads_left'])}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
