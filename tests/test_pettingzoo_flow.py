"""PSRO on a PettingZoo environment through the real `psro` command: Prefect flows on a local Ray,
MLflow in SQLite, populations by role.

simple_adversary has no game tree, so everything the run reports is sampled: payoffs with standard
errors, and `approx_exploitability` from freshly learned responses, never the exact names. Its
members are networks, registered as weights only, one registered model per role.
"""

from __future__ import annotations

import io
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from processes import run_config

from flows.tracking import layout
from flows.tracking.registry_members import load_member, open_store, parse_member
from marl_core.policies.neural import NeuralPolicy
from marl_core.policies.storage import NETWORK_FILE, WEIGHTS_FILE

pytestmark = pytest.mark.end_to_end

GAME = "pettingzoo:mpe2.simple_adversary_v3"
ITERATIONS = 1


@pytest.fixture(scope="module")
def adversary_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("pettingzoo")
    result = run_config(
        work,
        f"game: {GAME}\n"
        "roles: {adversary_: adversary, agent_: agent}\n"
        "oracle: ppo\n"
        f"iterations: {ITERATIONS}\n"
        "experiment: mpe\n"
        "episodes: 20\n"
        "best_response: {episodes: 100, episodes_per_round: 50}\n"
        "approx_exploitability: {every: 1, episodes: 100, eval_episodes: 20}\n"
        "rollout: {workers: 2, envs_per_worker: 8}\n",
    )
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{work}/mlflow.db")
    run = client.search_runs([client.get_experiment_by_name("mpe").experiment_id])[0]
    return work, result, client, run


def test_the_run_finishes_cleanly_and_reports_only_approximate_exploitability(adversary_run):
    _, result, client, run = adversary_run
    assert run.info.status == "FINISHED"
    assert "Traceback" not in result.stderr and "ERROR" not in result.stderr, result.stderr[-3000:]
    assert run.data.params["eval"] == "sampled" and run.data.params["meta_solver"] == "prd"
    for name in (
        "approx_exploitability",
        "approx_exploitability_stderr",
        "approx_nash_conv",
        "adversary/approx_best_response_gain",
    ):
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted(m.step for m in history) == list(range(ITERATIONS + 1)), name
    stderr = client.get_metric_history(run.info.run_id, "approx_exploitability_stderr")
    assert all(m.value > 0 for m in stderr)
    assert not {"exploitability", "nash_conv"} & set(run.data.metrics)  # no exact names without a tree
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert layout.APPROX_EXPLOITABILITY_PLOT in artifacts


def test_payoffs_are_sampled_with_standard_errors_per_role(adversary_run):
    _, _, client, run = adversary_run
    table = pd.read_csv(io.StringIO(Path(client.download_artifacts(run.info.run_id, layout.FINAL_PAYOFFS)).read_text()))
    sizes = ITERATIONS + 1
    assert len(table) == sizes * sizes
    for role in range(2):
        assert (table[f"stderr_{role}"] > 0).all()
    assert (table["episodes"] == 20).all()


def test_each_role_registers_its_networks_as_weights_only(adversary_run):
    work, _, client, run = adversary_run
    store = open_store(f"sqlite:///{work}/mlflow.db")
    for role in ("adversary", "agent"):
        name = layout.registered_model_name("mpe", GAME, role)
        versions = sorted(client.search_model_versions(f"name='{name}'"), key=lambda v: int(v.version))
        assert len(versions) == ITERATIONS + 1
        for version in versions[1:]:  # the first member is the uniform policy
            files = {
                Path(a.path).name for a in client.list_artifacts(version.run_id, layout.member_path_in(version.source))
            }
            assert files == {NETWORK_FILE, WEIGHTS_FILE}, files
            member = load_member(store, parse_member(f"{name}/{version.version}"))
            assert isinstance(member.policy, NeuralPolicy) and member.role == role
