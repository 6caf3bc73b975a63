"""A long run keeps its memory flat, and no run, finished or failed, leaves a process behind.

Both tests run `benchmarks/memory_long_run.py` as a subprocess: one driver process runs the real
flow (`flows.deployments.entrypoints.run_scenario`: its own Prefect server, local Ray, an MLflow SQLite store with
every member registered) with a temporary PREFECT_HOME and store, and samples resident memory at
every iteration. Every process the run starts inherits an environment marker from the driver, so
"left behind" is checked exactly, even on a machine where other runs have their own Ray and
Prefect processes (a before/after list of all raylets would blame them on this run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from processes import mlflow_store, prefect_home

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from memory_long_run import marked_processes  # noqa: E402

pytestmark = pytest.mark.end_to_end

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_long_run.py"
ITERATIONS = 60
EARLY = 20  # after warm-up: imports done, caches and the MLflow client filled
MAX_GROWTH = 0.20  # resident memory from iteration EARLY to ITERATIONS


def _run(work: Path, *args: str, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    prefect_home(work / "prefect-home")  # where the script keeps its Prefect home and its store
    mlflow_store(work)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_"))}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(work), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    report_file = work / "memory_report.json"
    assert report_file.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads(report_file.read_text())


@pytest.mark.timeout(1500)
def test_60_kuhn_iterations_keep_memory_flat_and_leave_nothing_running(tmp_path):
    result, report = _run(tmp_path, "--iterations", str(ITERATIONS), timeout=1400)
    print("\n".join(line for line in result.stdout.splitlines() if "| INFO" not in line))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    by_iteration = {s["iteration"]: s for s in report["samples"]}
    assert sorted(by_iteration) == list(range(ITERATIONS + 1))
    early, late = by_iteration[EARLY], by_iteration[ITERATIONS]
    growth = late["driver_kib"] / early["driver_kib"] - 1
    print(
        f"driver RSS: iteration {EARLY} {early['driver_kib'] / 1024:.1f} MiB, iteration {ITERATIONS} "
        f"{late['driver_kib'] / 1024:.1f} MiB ({growth:+.1%}), peak {report['driver_peak_kib'] / 1024:.1f} MiB; "
        f"Ray workers {early['kib']['ray_worker'] / 1024:.1f} -> {late['kib']['ray_worker'] / 1024:.1f} MiB; "
        f"{report['wall_seconds']:.0f} s"
    )
    assert growth < MAX_GROWTH
    workers = late["kib"]["ray_worker"] / early["kib"]["ray_worker"] - 1
    assert workers < MAX_GROWTH
    assert early["processes"] == late["processes"]  # no worker or server piles up along the way
    assert report["left_running"] == {}  # when run_scenario returned
    assert marked_processes(str(tmp_path.resolve())) == {}  # after the driver exited


@pytest.mark.timeout(600)
def test_a_failed_run_leaves_nothing_running_and_its_mlflow_run_failed(tmp_path):
    """on_iteration raises at iteration 3: Ray and the Prefect server stop all the same, and the
    MLflow run is marked FAILED rather than left RUNNING. On Leduc the next iteration, started
    ahead, is still working when the run fails; its thread must end with the run."""
    result, report = _run(
        tmp_path, "--iterations", "20", "--fail-at", "3", "--no-register", "--game", "leduc_poker", timeout=500
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert report["error"] == "RuntimeError: deliberate failure at iteration 3"
    assert [s["iteration"] for s in report["samples"]] == [0, 1, 2, 3]
    assert report["left_running"] == {}
    assert report["threads_left"] == []  # none to hold up the interpreter's exit
    assert marked_processes(str(tmp_path.resolve())) == {}
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("memory").experiment_id])
    assert run.info.status == "FAILED"


def test_a_subflow_starting_after_its_run_stopped_ray_starts_no_ray_of_its_own():
    """A thread of a failed run can start an iteration's subflow after the run stopped Ray;
    prefect-ray's runner would then start a default local Ray that outlives the run (one was
    found still starting when a failed run returned). The project's runner refuses instead."""
    import ray

    from flows.runtime.ray_runner import FastRayTaskRunner

    assert not ray.is_initialized()
    with pytest.raises(RuntimeError, match="^Ray is not running"):
        with FastRayTaskRunner():
            pass
    assert not ray.is_initialized()
