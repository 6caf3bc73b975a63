"""`psro pbt run` end to end: members' rounds as Prefect flow runs on Ray, exploit/explore
between them, lineage and checkpoints in MLflow; a run killed by SIGKILL between registering a
checkpoint and committing it resumes with what it committed (lineage, scores, settings) and
finishes, with no registry version twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml
from processes import assert_all_exited, mlflow_store, prefect_home

from flows.tracking import layout
from flows.tracking.pbt_tracker import KILL_BEFORE_COMMIT

pytestmark = pytest.mark.slow

PSRO = str(Path(sys.executable).with_name("psro"))
ENV = "pettingzoo:mpe2.simple_spread_v3"
CONFIG = {
    "marl": {
        "env": ENV,
        "algorithm": "mappo",
        "rounds": 4,
        "steps_per_round": 25,
        "envs_per_worker": 2,
        "eval_episodes": 4,
        "checkpoint_every": 2,
        "num_cpus": 2,
        "settings": {"lr": 3e-4, "epochs": 2, "minibatch_size": 50},
    },
    "population": 2,
    "members": [{"lr": 1e-7}],
    "pbt": {"perturbation_interval": 2, "hyperparam_mutations": {"lr": {"loguniform": [1e-5, 3e-3]}}},
}


def _env(home: Path, **extra: str) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_", "PBT_"))}
    return {**env, "PREFECT_HOME": str(home), **extra}


def test_a_killed_pbt_run_resumes_from_its_commit_without_duplicate_versions(tmp_path):
    from marl_core.pbt.marl import PBTConfig, iterate_pbt_local

    store = mlflow_store(tmp_path)
    config = {**CONFIG, "marl": {**CONFIG["marl"], "tracking_uri": store}}
    (tmp_path / "pbt.yaml").write_text(yaml.safe_dump(config))
    home = prefect_home(tmp_path / "prefect-home")
    killed = subprocess.run(
        [PSRO, "pbt", "run", "--config", "pbt.yaml"],
        cwd=tmp_path,
        env=_env(home, **{KILL_BEFORE_COMMIT: "3"}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stdout[-3000:] + killed.stderr[-3000:]
    assert_all_exited(f"PREFECT_HOME={home}")
    assert "member 1 (" in killed.stdout and "copies member 0" in killed.stdout, killed.stdout  # at round 1

    client = mlflow.MlflowClient(tracking_uri=store, registry_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("pbt").experiment_id])
    assert run.data.tags[layout.PBT_COMMITTED_TAG] == "1"
    name = layout.registered_model_name("pbt", ENV, "agent")
    versions = lambda: client.search_model_versions(f"name='{name}'")  # noqa: E731
    assert sorted((v.tags["round"], v.tags["member"]) for v in versions()) == [
        ("1", "0"),
        ("1", "1"),
        ("3", "0"),
        ("3", "1"),
    ]

    resumed = subprocess.run(
        [PSRO, "pbt", "resume", run.info.run_id, "--tracking-uri", store],
        cwd=tmp_path,
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert_all_exited(f"PREFECT_HOME={home}")
    assert "resuming run" in resumed.stdout and "round    2" in resumed.stdout and "round    1 " not in resumed.stdout

    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[layout.PBT_COMMITTED_TAG] == "3"
    rounds_and_members = sorted((v.tags["round"], v.tags["member"]) for v in versions())
    assert rounds_and_members == [("1", "0"), ("1", "1"), ("3", "0"), ("3", "1")]  # round 3's orphans replaced, once
    lineage = json.loads(
        Path(
            client.download_artifacts(run.info.run_id, f"{layout.PBT_LINEAGE}/lineage.json", str(tmp_path))
        ).read_text()
    )
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert layout.PBT_PLOT in artifacts

    # what was committed before the kill is kept: the same as the same population's in this
    # process up to round 1 (after it, the resumed workers' episodes start afresh)
    local = list(iterate_pbt_local(PBTConfig(**{**CONFIG, "marl": {**CONFIG["marl"], "rounds": 2}})))
    first = local[1].lineage[0]
    assert [e["step"] for e in lineage] == [2, 4]  # one copy at each point: the bottom member of two
    assert (lineage[0]["member"], lineage[0]["source"]) == (first.member, first.source)
    assert lineage[0]["after"] == pytest.approx(first.after) and lineage[0]["member_score"] == pytest.approx(
        first.member_score
    )
    best = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "best_score")}
    assert sorted(best) == [1, 3] and best[1] == pytest.approx(max(local[1].scores()))
    # round 1's versions: the member that copied holds its source's networks, and says so
    at_round_1 = {v.tags["member"]: v.tags for v in versions() if v.tags["round"] == "1"}
    copy, source = at_round_1[str(first.member)], at_round_1[str(first.source)]
    assert copy["copied_from"] == str(first.source) and "copied_from" not in source
    assert float(copy["score"]) == float(source["score"]) == pytest.approx(first.source_score)
    committed = json.loads(
        Path(
            client.download_artifacts(
                run.info.run_id, f"{layout.pbt_checkpoint_path(3, 2)}/{layout.PBT_STATE_FILE}", str(tmp_path / "slot")
            )
        ).read_text()
    )
    assert committed["round"] == 4 and committed["hyperparameters"][lineage[1]["member"]] == lineage[1]["after"]
