"""`psro resume` refuses a run whose stored settings point at something unusable, before any
work, and changes nothing stored.

A killed run resuming to the uninterrupted result is checked for every scenario by
`test_scenarios.py` (killed at a commit, retried through Prefect) and through the command line by
`test_scenario_commands.py` (`run`, SIGKILL, the reaper, `--resume`'s lookup, `resume`).
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
from typer.testing import CliRunner

from flows.cli import app as cli
from flows.cli import scenario_commands as scenario_cli
from flows.tracking.layout import COMMITTED_TAG, CONFIG_ARTIFACT
from marl_core.psro.config import build_config


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
