"""`psro league run` end to end: generations as Prefect flow runs on Ray, the match table,
ratings and snapshots in MLflow, snapshots registered as weights; and a run killed by SIGKILL
while its next generation trains (its tracker between registering generation 2's snapshots and
committing them) resumes to exactly the league an uninterrupted run computes (PBT's lineage
between its main agents included), with no registry version twice."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import yaml
from processes import assert_all_exited, mlflow_store, prefect_home

from flows.tracking import layout
from flows.tracking.league_tracker import KILL_BEFORE_COMMIT

pytestmark = pytest.mark.slow

PSRO = str(Path(sys.executable).with_name("psro"))
SETTINGS = dict(
    game="kuhn_poker",
    generations=3,
    episodes=100,
    episodes_per_round=50,
    eval_episodes=40,
    num_cpus=2,
    rollout={"workers": 2, "envs_per_worker": 8},
    league={"main_agents": 2, "main_exploiters": 0, "league_exploiters": 0, "snapshot": {"max_steps": 200}},
    # PBT between the two main agents at every generation: its settings and lineage resume too
    pbt={"perturbation_interval": 1, "hyperparam_mutations": {"lr": {"loguniform": [1e-4, 1e-2]}}},
)


def _env(home: Path, **extra: str) -> dict:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_", "LEAGUE_"))
    }
    return {**env, "PREFECT_HOME": str(home), **extra}


def test_a_killed_league_resumes_to_the_league_an_uninterrupted_run_has(tmp_path):
    store = mlflow_store(tmp_path)
    (tmp_path / "league.yaml").write_text(yaml.safe_dump({**SETTINGS, "tracking_uri": store}))
    home = prefect_home(tmp_path / "prefect-home")
    killed = subprocess.run(
        [PSRO, "league", "run", "--config", "league.yaml"],
        cwd=tmp_path,
        env=_env(home, **{KILL_BEFORE_COMMIT: "2"}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert_all_exited(f"PREFECT_HOME={home}")
    assert "gen   1" in killed.stdout and "gen   3" not in killed.stdout, killed.stdout

    client = mlflow.MlflowClient(tracking_uri=store, registry_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("league").experiment_id])
    assert run.data.tags[layout.LEAGUE_COMMITTED_TAG] == "1"
    names = [layout.registered_model_name("league", "kuhn_poker", role) for role in ("player_0", "player_1")]
    orphans = [v for v in client.search_model_versions(f"name='{names[0]}'") if v.tags["iteration"] == "2"]
    assert orphans  # generation 2's snapshots were registered, never committed

    resumed = subprocess.run(
        [PSRO, "league", "resume", run.info.run_id, "--tracking-uri", store],
        cwd=tmp_path,
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "after generation 1" in resumed.stdout and "gen   2" in resumed.stdout and "gen   3" in resumed.stdout
    assert_all_exited(f"PREFECT_HOME={home}")

    # The league an uninterrupted run computes, in this process.
    from marl_core.league.config import build_league_config
    from marl_core.league.generation import iterate_league_local

    *_, (last, expected) = iterate_league_local(build_league_config(SETTINGS))
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[layout.LEAGUE_COMMITTED_TAG] == "3"
    folder = Path(client.download_artifacts(run.info.run_id, layout.league_generation_path(3), str(tmp_path)))
    table = pd.read_csv(folder / "match_table.csv")
    pd.testing.assert_frame_equal(table, pd.DataFrame(expected.league.table.rows()), check_exact=False, rtol=1e-12)
    ratings = pd.read_csv(folder / "ratings.csv")
    assert list(ratings["player"]) == [row["player"] for row in expected.ratings.table()]
    assert list(ratings["mu"]) == pytest.approx([row["mu"] for row in expected.ratings.table()])
    assert run.data.metrics["main_agent_0/exploitability"] == pytest.approx(
        last.measured["main_agent_0/exploitability"]
    )
    lineage = json.loads((folder / "lineage.json").read_text())
    assert len(lineage) == 3 and lineage == [dataclasses.asdict(e) for e in expected.lineage]  # one copy per generation
    assert run.data.metrics[f"hp/{lineage[-1]['member']}/lr"] == pytest.approx(lineage[-1]["after"]["lr"])

    # every snapshot registered once per role, as weights
    snapshots = [s.id for s in expected.league.snapshots]
    for name in names:
        registered = sorted(v.tags["snapshot"] for v in client.search_model_versions(f"name='{name}'"))
        assert registered == sorted(snapshots)
    assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == {
        layout.RATINGS_PLOT,
        layout.WIN_RATE_HEATMAP,
        layout.EXPLOITABILITY_PLOT,
    }
    assert {m.step for m in client.get_metric_history(run.info.run_id, "rating/main_agent_0/mu")} == {1, 2, 3}

    # `psro ratings`: the run's ratings as committed, and registry members rated after playing
    from typer.testing import CliRunner

    from flows.cli import app

    shown = CliRunner().invoke(
        app, ["ratings", "--run", run.info.run_id, "--tracking-uri", store], env={"COLUMNS": "200"}
    )
    assert shown.exit_code == 0, shown.output
    assert "ratings after generation 3" in " ".join(shown.output.split())  # the title may wrap
    for row in expected.ratings.table():
        assert f"{row['player']} " in shown.output and f"{row['mu']:.2f} ± {row['sigma']:.2f}" in shown.output
    members = [f"{names[0]}/1", f"{names[0]}/2", f"{names[1]}/1"]
    played = CliRunner().invoke(
        app,
        [
            "ratings",
            *[f"--member={m}" for m in members],
            "--episodes",
            "20",
            "--games-per-match",
            "5",
            "--tracking-uri",
            store,
        ],
        env={"COLUMNS": "200"},
    )
    assert played.exit_code == 0, played.output
    flat = " ".join(played.output.split())
    assert (
        "40 greedy games, 20 per pairing" in flat
        and "rated as matches of 5" in flat
        and all(m in played.output for m in members)
    )
    assert re.search(rf"{re.escape(names[1])}/1 │ [^│]+ │ [^│]+ │ [^│]+ │ 8 │", flat), (
        flat
    )  # rated: two pairings of 4 matches
