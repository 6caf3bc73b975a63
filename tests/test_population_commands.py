"""`psro evaluate` and `psro export --run` read populations back from MLflow.

The store is written by the same PSROTracker that `psro run` uses, driven by the one-process PSRO
loop (no Prefect or Ray needed to produce artifacts). Then the commands run through the CLI:
evaluate must reproduce the payoff entries the run stored for the same registry members (exact:
to the last bit; sampled: within standard errors), and an exported run must pass OpenSpiel's
check in scripts/verify_export.py with the exploitability the run logged.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from flows.tracking import layout

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 4


def _track_local_run(**settings) -> str:
    from flows.tracking.psro_tracker import PSROTracker
    from marl_core.psro.config import PSROConfig
    from marl_core.psro.steps import iterate_psro_local

    config = PSROConfig(game="kuhn_poker", iterations=ITERATIONS, **settings)
    with PSROTracker(config) as tracker:
        for record, state in iterate_psro_local(config):
            tracker.log_iteration(record, state)
        tracker.finish(state)
    return tracker.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store, two runs: exact evaluation (experiment `exact`) and sampled (`sampled`)."""
    work = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{work}/mlflow.db"
    previous = os.getcwd()
    os.chdir(work)  # MLflow's default artifact root (./mlruns) lands in the temp dir
    try:
        exact = _track_local_run(tracking_uri=uri, experiment="exact")
        sampled = _track_local_run(tracking_uri=uri, experiment="sampled", eval="sampled", episodes=400)
    finally:
        os.chdir(previous)
    return work, uri, {"exact": exact, "sampled": sampled}


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _stored_payoffs(uri: str, run_id: str) -> pd.DataFrame:
    path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=layout.FINAL_PAYOFFS, tracking_uri=uri)
    return pd.read_csv(path)


def _evaluation(uri: str, stdout: str):
    """The payoff table and members the evaluate command logged, with each position's member index."""
    run_id = stdout.split("logged to MLflow run ")[1].split()[0]
    table = pd.read_csv(
        mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=layout.EVALUATION_PAYOFFS, tracking_uri=uri)
    )
    members = json.loads(
        Path(
            mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=layout.EVALUATION_MEMBERS, tracking_uri=uri
            )
        ).read_text()
    )
    client = mlflow.MlflowClient(tracking_uri=uri)
    index = {
        p: [layout.VersionTags.of(client.get_model_version(m["name"], m["version"]).tags).member for m in group]
        for p, group in members.items()
    }
    return table, index


def _matching_rows(stored: pd.DataFrame, table: pd.DataFrame, index) -> pd.DataFrame:
    """The stored rows for the evaluated profiles, in the evaluation's row order."""
    keys = pd.DataFrame({f"member_{p}": [index[str(p)][k] for k in table[f"member_{p}"]] for p in (0, 1)})
    return keys.merge(stored, on=["member_0", "member_1"], how="left")


def test_exact_evaluation_reproduces_the_stored_payoffs(store):
    work, uri, runs = store
    result = _cli(
        "evaluate",
        "--tracking-uri",
        uri,
        "--member",
        "exact-kuhn_poker-player_0@newest",
        "--member",
        "exact-kuhn_poker-player_0/2",
        "--member",
        "models:/exact-kuhn_poker-player_1/1",
        "--member",
        "exact-kuhn_poker-player_1/4",
    )
    assert result.exit_code == 0, result.output
    assert "payoffs by exact evaluation" in result.output and "exact-kuhn_poker-player_0/5" in result.output
    table, index = _evaluation(uri, result.output)
    assert index == {"0": [ITERATIONS, 1], "1": [0, 3]}  # @newest is the last member; version v is member v-1
    expected = _matching_rows(_stored_payoffs(uri, runs["exact"]), table, index)
    assert len(table) == 4
    np.testing.assert_array_equal(
        table[["payoff_0", "payoff_1"]].to_numpy(), expected[["payoff_0", "payoff_1"]].to_numpy()
    )


def test_sampled_evaluation_agrees_within_standard_errors(store):
    work, uri, runs = store
    members = [f"sampled-kuhn_poker-player_{p}/{v}" for p in (0, 1) for v in (1, 3, 5)]
    result = _cli(
        "evaluate",
        "--tracking-uri",
        uri,
        "--eval",
        "sampled",
        "--episodes",
        "400",
        "--seed",
        "7",
        *[arg for m in members for arg in ("--member", m)],
    )
    assert result.exit_code == 0, result.output
    assert "stderr 0" in result.output
    table, index = _evaluation(uri, result.output)
    expected = _matching_rows(_stored_payoffs(uri, runs["sampled"]), table, index)
    assert len(table) == 9 and (table["episodes"] == 400).all()
    for p in (0, 1):
        combined = np.hypot(table[f"stderr_{p}"], expected[f"stderr_{p}"])
        assert (combined > 0).all()
        z = (table[f"payoff_{p}"] - expected[f"payoff_{p}"]).abs() / combined
        assert z.max() < 4, z.tolist()


def test_export_of_a_run_passes_openspiels_check(store, tmp_path):
    work, uri, runs = store
    result = _cli("export", "--run", runs["exact"], "--tracking-uri", uri, tmp_path / "export")
    assert result.exit_code == 0, result.output
    sys.path.insert(0, str(ROOT / "scripts"))
    from verify_export import verify

    summary = verify(tmp_path / "export", tolerance=1e-6)
    assert summary["passed"], summary
    assert summary["population_sizes"] == [ITERATIONS + 1] * 2
    logged = mlflow.MlflowClient(tracking_uri=uri).get_run(runs["exact"]).data.metrics["exploitability"]
    assert summary["reported_exploitability"] == logged
    assert summary["openspiel_exploitability"] == pytest.approx(logged, abs=1e-9)


BAD_INPUTS = [
    (
        ["evaluate", "--member", "exact-kuhn_poker-player_0"],
        "member 'exact-kuhn_poker-player_0' is not NAME@ALIAS or NAME/VERSION",
    ),
    (
        ["evaluate", "--member", "exact-kuhn_poker-player_0/zero"],
        "member 'exact-kuhn_poker-player_0/zero' is not NAME@ALIAS or NAME/VERSION",
    ),
    (["evaluate", "--member", "no-such-model@newest"], "no registered model 'no-such-model' in sqlite:///"),
    (
        ["evaluate", "--member", "exact-kuhn_poker-player_0@latest"],
        "model 'exact-kuhn_poker-player_0' has no alias 'latest'; its aliases: newest",
    ),
    (
        ["evaluate", "--member", "exact-kuhn_poker-player_0/99"],
        "model 'exact-kuhn_poker-player_0' has no version 99; its versions: 1-5",
    ),
    (["evaluate", "--member", "exact-kuhn_poker-player_0/1"], "no member for role 'player_1' of kuhn_poker"),
    (
        ["evaluate", "--member", "exact-kuhn_poker-player_0/1", "--eval", "approximate"],
        "unknown evaluator 'approximate'; choose one of: exact, sampled",
    ),
    (
        ["export", "--run", "0123456789abcdef0123456789abcdef", "out"],
        "no MLflow run '0123456789abcdef0123456789abcdef' in sqlite:///",
    ),
    (["export", "--run", "not-a-run", "out"], "no MLflow run 'not-a-run' in sqlite:///"),
    (
        ["export", "--run", "0123456789abcdef0123456789abcdef", "/etc"],
        "export='/etc': directory '/etc' exists and is not empty",
    ),
]


@pytest.mark.parametrize("args,message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_fails_with_one_line(store, args, message):
    work, uri, _ = store
    result = _cli(*args, "--tracking-uri", uri)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert message in lines[0]


def test_a_missing_store_is_named_and_not_created(tmp_path):
    uri = f"sqlite:///{tmp_path}/nowhere.db"
    result = _cli("evaluate", "--member", "psro-kuhn_poker-player_0@newest", "--tracking-uri", uri)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "no MLflow store at" in result.output and "nowhere.db" in result.output
    assert not (tmp_path / "nowhere.db").exists()
