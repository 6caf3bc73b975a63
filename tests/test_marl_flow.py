"""`psro marl run` end to end, with an asynchronous learner: rounds as Prefect flow runs on Ray
whose workers stream while an IMPALA learner trains,
MLflow metrics (throughput, staleness, utilisation), checkpoints registered as weights, and a run
killed by SIGKILL between registering a checkpoint and committing it resumes to the same round
count with no registry version twice. Collect-then-learn runs resume through the same tracker
(`test_pbt_flow.py` kills and resumes one; `test_flow_matches_local.py` runs one)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
from processes import assert_all_exited, mlflow_store, prefect_home

from flows.tracking import layout
from flows.tracking.marl_tracker import KILL_BEFORE_COMMIT

pytestmark = pytest.mark.slow

PSRO = str(Path(sys.executable).with_name("psro"))
CONFIG = """\
env: pettingzoo:mpe2.simple_spread_v3
algorithm: impala
settings: {{impala: {{hidden: [16]}}}}
rounds: 6
steps_per_round: 50
workers: 2
envs_per_worker: 2
eval_every: 2
eval_episodes: 4
checkpoint_every: 2
num_cpus: 2
tracking_uri: {store}
"""


def _env(home: Path, **extra: str) -> dict:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_", "MARL_"))
    }
    return {**env, "PREFECT_HOME": str(home), **extra}


def test_a_killed_marl_run_resumes_to_the_same_rounds_without_duplicate_versions(tmp_path):
    store = mlflow_store(tmp_path)
    (tmp_path / "run.yaml").write_text(CONFIG.format(store=store))
    home = prefect_home(tmp_path / "prefect-home")
    killed = subprocess.run(
        [PSRO, "marl", "run", "--config", "run.yaml"],
        cwd=tmp_path,
        env=_env(home, **{KILL_BEFORE_COMMIT: "3"}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert_all_exited(f"PREFECT_HOME={home}")
    # its output is no terminal: a plain progress line as training starts, before round 0 ends
    lines = killed.stdout.splitlines()
    shown = [i for i, line in enumerate(lines) if re.fullmatch(r"impala training: \d+/1200 steps.*", line)]
    assert shown and shown[0] < min(i for i, line in enumerate(lines) if line.startswith("round    0")), killed.stdout

    client = mlflow.MlflowClient(tracking_uri=store, registry_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("marl").experiment_id])
    assert run.data.tags[layout.MARL_COMMITTED_TAG] == "1"
    name = layout.registered_model_name("marl", "pettingzoo:mpe2.simple_spread_v3", "agent")
    assert sorted(int(v.tags["round"]) for v in client.search_model_versions(f"name='{name}'")) == [
        1,
        3,
    ]  # 3: uncommitted

    resumed = subprocess.run(
        [PSRO, "marl", "resume", run.info.run_id, "--tracking-uri", store],
        cwd=tmp_path,
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming run" in resumed.stdout and "round    2" in resumed.stdout and "round    1 " not in resumed.stdout
    assert_all_exited(f"PREFECT_HOME={home}")

    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[layout.MARL_COMMITTED_TAG] == "5"
    versions = client.search_model_versions(f"name='{name}'")
    assert sorted(int(v.tags["round"]) for v in versions) == [1, 3, 5]  # the orphan of round 3 replaced, once
    assert {m.step for m in client.get_metric_history(run.info.run_id, "env_steps")} == set(range(6))
    played = int(run.data.metrics["env_steps"])
    assert played >= 6 * 50 * 4 and played % (50 * 2) == 0  # at least what the learners took, in whole fragments
    versions_by_round = {
        m.step: m.value for m in client.get_metric_history(run.info.run_id, "learner/async/weights_version")
    }
    assert (
        versions_by_round[0] == 2 and versions_by_round[1] == 4
    )  # one IMPALA step per fragment, a fragment per worker
    for metric in ("samples_in_per_second", "samples_out_per_second", "staleness_mean", "learner_utilisation"):
        assert f"learner/async/{metric}" in run.data.metrics, metric
    assert {m.step for m in client.get_metric_history(run.info.run_id, "eval_return/policy/agent")} == {1, 3, 5}
    # checkpoints hold weights only
    newest = client.get_model_version_by_alias(name, layout.NEWEST_ALIAS)
    folder = client.download_artifacts(run.info.run_id, layout.policy_checkpoint_path("agent", 5), str(tmp_path))
    weights = torch.load(Path(folder) / layout.POLICY_WEIGHTS, weights_only=True)
    assert newest.tags["round"] == "5" and all(isinstance(t, torch.Tensor) for t in weights.values())
    assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == {
        layout.EPISODE_RETURN_PLOT,
        layout.STALENESS_PLOT,
    }

    # Prefect recorded every round as a flow run with its tasks (rounds 0-3 before the kill, 2-5
    # after), the workers' stream running beside the learner
    rounds, tasks = _prefect_records(home)
    assert sorted(state for state, _ in rounds) == ["COMPLETED"] * 8
    assert sorted(_step(t) for t in tasks) == sorted(
        ["stream-rollouts", "train-learner"] * 8 + ["evaluate-policies"] * 4
    )
    for _, round_id in rounds:
        mine = [t for t in tasks if t.flow_run_id == round_id]
        (stream,) = [t for t in mine if _step(t) == "stream-rollouts"]
        for learner in (t for t in mine if _step(t) == "train-learner"):
            assert learner.start_time < stream.end_time and stream.start_time < learner.end_time


def _step(task) -> str:
    return task.name.rsplit("-", 1)[0]


def _prefect_records(home: Path) -> tuple[list[tuple[str, object]], list]:
    """(state, id) of the `marl-round` flow runs and their task runs, from the runs' Prefect home."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.runtime import LocalPrefectServer

    server = LocalPrefectServer(home)
    try:
        server.wait()

        async def read():
            async with get_client() as client:
                runs = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["marl-round"])))
                tasks = await client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[r.id for r in runs]))
                )
                return [(r.state.type.value, r.id) for r in runs], tasks

        with temporary_settings({PREFECT_API_URL: server.url}):
            return asyncio.run(read())
    finally:
        server.stop()
