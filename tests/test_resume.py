"""`psro resume`: a run killed after an iteration's members are registered and before that
iteration is committed resumes from its last committed iteration and ends exactly where an
uninterrupted run ends, with every member registered exactly once; a run whose stored settings
point at something unusable is refused before any work.

The kill point is fixed by the suite's fault-injection seam (`processes.killed_at_commit`):
the driver dies by SIGKILL in the one window whose leftovers (registry versions of the
uncommitted iteration) resume has to remove.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow_reads import final_tables, registered_members, uninterrupted_tables
from processes import assert_all_exited, killed_at_commit, mlflow_store, prefect_home
from typer.testing import CliRunner

from flows import cli, scenario_cli
from flows.scenarios.psro import PSRO as PSRO_SCENARIO
from flows.tracking.layout import COMMITTED_TAG, CONFIG_ARTIFACT
from flows.tracking.resume import find_resumable
from marl_core.psro.config import build_config

ITERATIONS = 6
ROLES = ("player_0", "player_1")  # kuhn_poker's populations
KILLED_AT = 3  # its members are registered, its commit never written
PSRO = str(Path(sys.executable).with_name("psro"))


def _env(home: Path, **extra: str) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_"))}
    return {**env, "PREFECT_HOME": str(home), **extra}


def _settings(store: str, experiment: str) -> list[str]:
    return [
        "--game",
        "kuhn_poker",
        "--iterations",
        str(ITERATIONS),
        "--tracking-uri",
        store,
        "--experiment",
        experiment,
        "--num-cpus",
        "2",
    ]


def _only_run(client, experiment: str):
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run


@pytest.mark.slow  # two `psro` runs, each with its own Prefect server and local Ray
def test_a_run_killed_before_its_commit_resumes_to_the_uninterrupted_result(tmp_path):
    store = mlflow_store(tmp_path)
    client = mlflow.MlflowClient(tracking_uri=store, registry_uri=store)
    home = prefect_home(tmp_path / "prefect-home")

    crashed = subprocess.run(
        [PSRO, "run", *_settings(store, "crash")],
        cwd=tmp_path,
        env=killed_at_commit(_env(home), KILLED_AT),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    run_id = _only_run(client, "crash").info.run_id
    assert client.get_run(run_id).data.tags[COMMITTED_TAG] == str(KILLED_AT - 1)
    for role in ROLES:  # the uncommitted iteration's member is in the registry
        assert registered_members(client, "crash", role) == [(member, member) for member in range(KILLED_AT + 1)]
    # The server stops itself once its driver is gone, and Ray's reaper stops Ray.
    assert_all_exited(f"PREFECT_HOME={home}", timeout=60)

    config = build_config(
        {"game": "kuhn_poker", "iterations": ITERATIONS, "tracking_uri": store, "experiment": "crash"}
    )
    assert find_resumable(PSRO_SCENARIO, config) == run_id  # what `psro run ... --resume` continues
    resumed = subprocess.run(
        [PSRO, "resume", run_id, "--tracking-uri", store],
        cwd=tmp_path,
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"resuming run {run_id}" in resumed.stdout
    first_line = next(line for line in resumed.stdout.splitlines() if line.startswith("iter "))
    assert int(first_line.split()[1]) == KILLED_AT  # the uncommitted iteration is redone, nothing committed is

    assert final_tables(client, run_id, ITERATIONS) == uninterrupted_tables(config)
    assert client.get_run(run_id).info.status == "FINISHED"
    for role in ROLES:  # each member exactly once, the redone one included
        assert registered_members(client, "crash", role) == [(member, member) for member in range(ITERATIONS + 1)]
    assert_all_exited(f"PREFECT_HOME={home}")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, str]:
    """One MLflow store for the refused runs (a new SQLite store takes seconds to create)."""
    directory = tmp_path_factory.mktemp("stored")
    (directory / "previous").mkdir()
    (directory / "previous" / "summary.json").write_text("{}")
    uri = f"sqlite:///{directory}/mlflow.db"
    mlflow.MlflowClient(tracking_uri=uri).create_experiment("stored", artifact_location=str(directory / "mlruns"))
    return directory, uri


@pytest.mark.parametrize(
    "stored, named",
    [
        ({"ray_address": "127.0.0.1:1"}, "ray_address='127.0.0.1:1': nothing answers"),
        ({"export": "previous"}, "export='previous': directory 'previous' exists and is not empty"),
        ({"meta_solver": "retired"}, "'retired'"),
    ],
    ids=["unreachable-ray", "used-export-dir", "unknown-meta-solver"],
)
def test_resume_refuses_a_stored_setting_that_no_longer_works(store, monkeypatch, stored, named):
    """The settings come from the run's logged config, so they get the checks `psro run` makes."""
    directory, uri = store
    monkeypatch.chdir(directory)
    client = mlflow.MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.get_experiment_by_name("stored").experiment_id).info.run_id
    settings = build_config({"game": "kuhn_poker", "tracking_uri": uri, "experiment": "stored"}).model_dump(mode="json")
    client.log_dict(run_id, {**settings, **stored}, CONFIG_ARTIFACT)
    client.set_tag(run_id, COMMITTED_TAG, "0")
    files, run = sorted(directory.rglob("*")), client.get_run(run_id)
    started = []
    monkeypatch.setattr(scenario_cli, "start", lambda *args: started.append(args))  # the work: server, Ray, the flow

    result = CliRunner().invoke(cli.app, ["resume", run_id, "--tracking-uri", uri])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("error: ") and named in result.output, result.output
    assert not started
    assert sorted(directory.rglob("*")) == files
    after = client.get_run(run_id)
    assert (after.info.status, after.data.tags) == (run.info.status, run.data.tags)
