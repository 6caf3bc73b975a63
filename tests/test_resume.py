"""A run killed with SIGKILL mid-iteration resumes from its last committed iteration and ends
exactly where an uninterrupted run ends, with every member registered exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest

from marl_core.config import build_config
from marl_core.resume import COMMITTED_TAG, find_resumable
from marl_core.tracking import registered_model_name
from processes import assert_all_exited

pytestmark = pytest.mark.slow

ITERATIONS = 16
PSRO = str(Path(sys.executable).with_name("psro"))


def _env(home: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_"))}
    env["PREFECT_HOME"] = str(home)
    return env


def _settings(store: str, experiment: str) -> list[str]:
    return ["--game", "kuhn_poker", "--iterations", str(ITERATIONS), "--tracking-uri", store,
            "--experiment", experiment, "--num-cpus", "2"]


def _only_run(client, experiment: str):
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run


def _final(client, run_id: str) -> tuple[str, dict]:
    payoffs = Path(client.download_artifacts(run_id, "payoffs/final.csv")).read_text()
    meta = json.loads(Path(client.download_artifacts(run_id, f"meta_strategy/iteration_{ITERATIONS:04d}.json")).read_text())
    return payoffs, meta


def _wait_for_commit(client, experiment: str, at_least: int, process, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended before it could be killed"
        found = client.get_experiment_by_name(experiment)
        runs = client.search_runs([found.experiment_id]) if found else []
        if runs and int(runs[0].data.tags.get(COMMITTED_TAG, -1)) >= at_least:
            return runs[0].info.run_id
        time.sleep(0.1)
    raise AssertionError(f"no iteration {at_least} committed within {timeout} s")


def test_a_run_killed_mid_iteration_resumes_to_the_uninterrupted_result(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=store, registry_uri=store)
    home = tmp_path / "prefect-home"

    reference = subprocess.run([PSRO, "run", *_settings(store, "reference")], cwd=tmp_path, env=_env(home),
                               capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr[-3000:]

    crashing = subprocess.Popen([PSRO, "run", *_settings(store, "crash")], cwd=tmp_path, env=_env(home),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_id = _wait_for_commit(client, "crash", at_least=5, process=crashing)
    os.kill(crashing.pid, signal.SIGKILL)  # the driver only: no clean-up code runs
    crashing.wait()
    killed_at = int(client.get_run(run_id).data.tags[COMMITTED_TAG])
    assert killed_at < ITERATIONS, "the run finished before the kill"
    # The server stops itself once its driver is gone, and Ray's reaper stops Ray.
    assert_all_exited(f"PREFECT_HOME={home}", timeout=60)

    config = build_config({"game": "kuhn_poker", "iterations": ITERATIONS, "tracking_uri": store, "experiment": "crash"})
    assert find_resumable(config) == run_id  # what `psro run ... --resume` continues
    resumed = subprocess.run([PSRO, "resume", run_id, "--tracking-uri", store], cwd=tmp_path, env=_env(home),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"resuming run {run_id}" in resumed.stdout
    first_line = next(line for line in resumed.stdout.splitlines() if line.startswith("iter "))
    assert int(first_line.split()[1]) == killed_at + 1  # nothing committed was recomputed

    assert _final(client, run_id) == _final(client, _only_run(client, "reference").info.run_id)
    assert client.get_run(run_id).info.status == "FINISHED"
    for player in range(2):
        name = registered_model_name("crash", "kuhn_poker", player)
        members = [int(v.tags["member"]) for v in client.search_model_versions(f"name='{name}'")]
        assert sorted(members) == list(range(ITERATIONS + 1))  # each member exactly once
    assert_all_exited(f"PREFECT_HOME={home}")
