"""Every scenario lives the life the project promises: deployed, triggered, killed, retried.

One Prefect server and one `psro serve` (its Ray shared by every flow run, as a `psro server`'s
is) serve a deployment of each case: PSRO, Pipeline PSRO, MARL with a collect-then-learn and
with an asynchronous learner, a league, PBT, neural CFR, and a scenario defined only in the tests
(`toy_scenario.py`). Each case's run is triggered through Prefect's API and dies by SIGKILL just
before a chosen commit (`fault_injection/sitecustomize.py`, the suite's one fault-injection
seam); Prefect records it Crashed. It is then retried exactly as the UI's Retry button does it
(the same flow run set to a Scheduled state named "AwaitingRetry") and must continue the same
MLflow run from its last commit and end as an uninterrupted run ends: identical where the run
is deterministic (PSRO with the exact oracle, the league, neural CFR, the toy), else with the same number
of steps committed; in every case with each registry version registered once.

The cases run side by side (all triggered at once, all retried at once), so the file costs about
one run's start-up per case rather than three.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml
from mlflow_reads import assert_each_metric_once, assert_each_version_once
from processes import Prefect, assert_all_exited, mlflow_store, prefect_home, start_psro_server, wait_until
from small_runs import PBT, SMALL_CFR, SMALL_LEAGUE, SPREAD, SYNC_MARL

from flows.tracking import layout

pytestmark = pytest.mark.end_to_end

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    entrypoint: str
    config: dict
    killed_at: int  # the step whose commit the first attempt never writes
    last: int  # the last step a whole run commits


PIPELINE = {
    "game": "kuhn_poker",
    "oracle": "dqn",
    "iterations": 3,
    "seed": 5,
    "best_response": {"episodes": 1200, "episodes_per_round": 200},
    "rollout": {"workers": 2, "envs_per_worker": 8},
    "dqn": {"learning_starts": 100, "epsilon_decay_steps": 800},
    "pipeline": {
        "active_levels": 2,
        "window": 400,
        "plateau": {"threshold": 0.5, "check_from": 800, "min_episodes": 800},
    },
}
LEAGUE = {
    **SMALL_LEAGUE,
    "rollout": {"workers": 2, "envs_per_worker": 8},
    # PBT between the two main agents at every generation: its settings and lineage resume too
    "pbt": {"perturbation_interval": 1, "hyperparam_mutations": {"lr": {"loguniform": [1e-4, 1e-2]}}},
}
ASYNC_MARL = {
    "env": SPREAD,
    "algorithm": "impala",
    "settings": {"impala": {"hidden": [16]}},
    "rounds": 6,
    "steps_per_round": 50,
    "workers": 2,
    "envs_per_worker": 2,
    "eval_every": 2,
    "eval_episodes": 4,
    "checkpoint_every": 2,
}
CASES = [
    Case(
        "psro",
        "flows.deployments.entrypoints.psro",
        {"game": "kuhn_poker", "meta_solver": "nash", "iterations": 4},
        2,
        4,
    ),
    Case("pipeline", "flows.deployments.entrypoints.psro", PIPELINE, 2, 3),
    Case("marl-sync", "flows.deployments.entrypoints.marl", SYNC_MARL, 3, 3),
    Case("marl-async", "flows.deployments.entrypoints.marl", ASYNC_MARL, 3, 5),
    Case("league", "flows.deployments.entrypoints.league", LEAGUE, 2, 3),
    Case("pbt", "flows.deployments.entrypoints.pbt", PBT, 3, 3),
    Case("cfr", "flows.deployments.entrypoints.cfr", SMALL_CFR, 2, 3),
    Case("toy", "toy_scenario.toy", {"rounds": 4, "seed": 7}, 2, 3),
]


def _with_store(case: Case, store: str, experiment: str) -> dict:
    common = {"tracking_uri": store, "experiment": experiment}
    if case.name == "pbt":
        return {**case.config, "marl": {**case.config["marl"], **common}}
    return {**case.config, **common}


@dataclasses.dataclass
class Stack:
    prefect: Prefect
    store: str
    faults: Path
    work: Path
    deployments: dict
    serve_log: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("scenarios")
    home = prefect_home(work / "prefect-home")
    marker = f"PREFECT_HOME={home}"
    store = mlflow_store(work)
    faults = work / "faults"
    faults.mkdir()
    definitions = [
        {
            "name": case.name,
            "entrypoint": case.entrypoint,
            "parameters": {"config": _with_store(case, store, f"declared-{case.name}")},
        }
        for case in CASES
    ]
    prefect_yaml = work / "prefect.yaml"
    prefect_yaml.write_text(yaml.safe_dump({"name": "scenarios", "deployments": definitions}))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_"))}
    # the toy's tasks are imported on the server's Ray workers: its module's folder on their path
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONPATH=str(TESTS))
    # Ray's CPUs as the machine's two: with four, each run's tasks started four worker processes
    # (each importing Prefect and torch) where two do the same work; the file took longer.
    from flows.services.prefect_server import find_running_server

    serve_log = work / "serve.log"
    server = serving = None
    try:
        server = start_psro_server(
            [str(Path(sys.executable).with_name("psro")), "server", "--port", "0", "--num-cpus", "2"],
            work,
            env,
            work / "server.log",
            lambda: find_running_server(home),
            start_new_session=True,
        )
        running = find_running_server(home)
        assert running is not None, (work / "server.log").read_text()[-3000:]
        env.update(
            PREFECT_API_URL=running.prefect_api_url,
            PREFECT_RUNNER_POLL_FREQUENCY="1",  # scheduled runs are picked up within a second, not ten
            PYTHONPATH=os.pathsep.join([str(TESTS), str(TESTS / "fault_injection")]),
            PSRO_TEST_FAULTS=str(faults),
        )
        with open(serve_log, "wb") as log:
            serving = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("psro")),
                    "serve",
                    "--prefect-yaml",
                    str(prefect_yaml),
                    "--limit",
                    "3",
                ],
                cwd=work,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        prefect = Prefect(running.prefect_api_url)

        def registered():
            found = {case.name: prefect.deployment(f"{_flow_name(case)}/{case.name}") for case in CASES}
            return found if all(found.values()) else None

        deployments = wait_until(registered, 180, "psro serve to register every deployment")
        yield Stack(prefect, store, faults, work, deployments, serve_log)
    finally:
        for process in (serving, server):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=10)
        assert_all_exited(marker, timeout=60)


def _flow_name(case: Case) -> str:
    return case.entrypoint.rsplit(".", 1)[1]


@pytest.fixture(scope="module")
def retried(stack):
    """Every case killed at its commit, then retried: case name -> (flow run id, MLflow run id)."""
    from prefect.states import Scheduled

    prefect, client = stack.prefect, _client(stack.store)
    runs = {}
    for case in CASES:
        experiment = f"killed-{case.name}"
        (stack.faults / experiment).write_text(str(case.killed_at))
        parameters = {"config": _with_store(case, stack.store, experiment)}
        runs[case.name] = prefect(
            "create_flow_run_from_deployment", stack.deployments[case.name].id, parameters=parameters
        ).id
    for case in CASES:
        state = prefect.final_state(runs[case.name], 600)
        assert state.is_crashed(), (case.name, state, stack.serve_log.read_text()[-3000:])
        assert not (stack.faults / f"killed-{case.name}").exists(), f"{case.name} never reached its commit"
        (run,) = _runs(client, f"killed-{case.name}")
        assert int(run.data.tags[_commit_tag(case)]) < case.killed_at, case.name
    for case in CASES:
        prefect(
            "set_flow_run_state",
            runs[case.name],
            Scheduled(name="AwaitingRetry", message="Retry from the UI"),
            force=True,
        )
    finished = {}
    for case in CASES:
        state = prefect.final_state(runs[case.name], 600)
        assert state.is_completed(), (case.name, state, stack.serve_log.read_text()[-3000:])
        assert prefect("read_flow_run", runs[case.name]).run_count == 2
        (run,) = _runs(client, f"killed-{case.name}")  # the retry continued the crashed attempt's run
        finished[case.name] = (runs[case.name], run.info.run_id)
    return finished


def _client(store: str):
    return mlflow.MlflowClient(tracking_uri=store, registry_uri=store)


def _runs(client, experiment: str) -> list:
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


def _commit_tag(case: Case) -> str:
    from flows.scenarios import SCENARIOS

    if case.name == "toy":
        from toy_scenario import COMMIT_TAG

        return COMMIT_TAG
    return SCENARIOS[_flow_name(case)].commit_tag


# The first case also sets up `stack` and `retried` (every case deployed, killed and retried): 800 s
# on a quiet machine, and past the suite's 900 s beside test_stopping in one CI run.
@pytest.mark.timeout(2700)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_killed_deployment_run_retried_through_prefects_api_ends_as_an_uninterrupted_run(
    stack, retried, case, tmp_path
):
    client = _client(stack.store)
    flow_run_id, run_id = retried[case.name]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags[_commit_tag(case)] == str(case.last)
    assert run.data.tags[layout.SCENARIO_TAG] == _flow_name(case)
    assert run.data.tags[layout.FLOW_RUN_TAG] == str(flow_run_id)
    assert_each_version_once(client, run_id)
    assert_each_metric_once(client, run)
    CHECKS.get(case.name, lambda *_: None)(Finished(client, run, f"killed-{case.name}", flow_run_id, stack, tmp_path))


@dataclasses.dataclass
class Finished:
    """A retried run, for a case's own checks."""

    client: object
    run: object
    experiment: str
    flow_run_id: object
    stack: Stack
    scratch: Path

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    def versions(self, model: str) -> list:
        return self.client.search_model_versions(f"name='{model}'")

    def download(self, path: str) -> Path:
        return Path(self.client.download_artifacts(self.run_id, path, str(self.scratch)))

    def plots(self) -> set[str]:
        return {a.path for a in self.client.list_artifacts(self.run_id, "plots")}

    def steps(self, metric: str) -> set[int]:
        return {m.step for m in self.client.get_metric_history(self.run_id, metric)}


def _psro(done: Finished) -> None:
    """Exact PSRO is deterministic: the uninterrupted run's payoff table and meta-strategy."""
    from mlflow_reads import final_tables, registered_members, uninterrupted_tables

    from marl_core.psro.config import build_config

    case = _case("psro")
    assert final_tables(done.client, done.run_id, case.last) == uninterrupted_tables(build_config(case.config))
    for role in ("player_0", "player_1"):  # each member exactly once, the redone one included
        assert registered_members(done.client, done.experiment, role) == [(m, m) for m in range(case.last + 1)]


def _pipeline(done: Finished) -> None:
    """The committed freezes are kept as they were (their payoffs are an uninterrupted run's: the
    pipeline is deterministic); the redone iteration's levels start afresh."""
    import io

    import numpy as np
    import pandas as pd
    from mlflow_reads import registered_members

    from marl_core.empirical_game.payoffs import PayoffTable
    from marl_core.psro.config import build_config
    from marl_core.psro.pipeline import iterate_pipeline_local

    case = _case("pipeline")
    for role in ("player_0", "player_1"):
        assert registered_members(done.client, done.experiment, role) == [(m, m) for m in range(case.last + 1)]
    final = PayoffTable.from_frame(pd.read_csv(io.StringIO(done.download(layout.FINAL_PAYOFFS).read_text())))
    *_, (_, uninterrupted) = iterate_pipeline_local(build_config(case.config))
    kept = (slice(None), slice(0, case.killed_at), slice(0, case.killed_at))
    assert final.sizes == (case.last + 1, case.last + 1)
    np.testing.assert_array_equal(final.mean[kept], uninterrupted.payoffs.mean[kept])


def _marl_async(done: Finished) -> None:
    """The workers stream while IMPALA learns; the round killed before its commit is redone and
    its orphaned checkpoint replaced, once; checkpoints hold weights only."""
    import torch

    name = layout.registered_model_name(done.experiment, SPREAD, "agent")
    assert sorted(int(v.tags["round"]) for v in done.versions(name)) == [1, 3, 5]
    assert done.steps("env_steps") == set(range(6))
    played = int(done.run.data.metrics["env_steps"])
    assert played >= 6 * 50 * 4 and played % (50 * 2) == 0  # at least what the learners took, in whole fragments
    for metric in ("samples_in_per_second", "samples_out_per_second", "staleness_mean", "learner_utilisation"):
        assert f"learner/async/{metric}" in done.run.data.metrics, metric
    assert done.steps("eval_return/policy/agent") == {1, 3, 5}
    newest = done.client.get_model_version_by_alias(name, layout.NEWEST_ALIAS)
    weights = torch.load(
        done.download(layout.policy_checkpoint_path("agent", 5)) / layout.POLICY_WEIGHTS, weights_only=True
    )
    assert newest.tags["round"] == "5" and all(isinstance(t, torch.Tensor) for t in weights.values())
    assert done.plots() == {layout.EPISODE_RETURN_PLOT, layout.STALENESS_PLOT}
    # Prefect recorded every round as a subflow of the run with its tasks: rounds 2-5 after the
    # retry, and before the kill rounds 0-2, round 3 (whose commit was being stored) and round 4
    # (begun meanwhile): either may have ended, or been left running by the kill, which the
    # retry then marks Crashed; in every round the workers' stream runs until its learners are
    # done (a learner may begin, even end, before the stream does: fragments the last round's
    # stream played are its to take)
    rounds, tasks = _subflows(done.stack.prefect, done.flow_run_id)
    completed = [round_id for state, round_id in rounds if state == "COMPLETED"]
    assert 7 <= len(completed) <= 9 and {state for state, _ in rounds} <= {"COMPLETED", "CRASHED"}, rounds
    for round_id in completed:
        mine = [t for t in tasks if t.flow_run_id == round_id]
        (stream,) = [t for t in mine if _step(t) == "stream-rollouts"]
        for learner in (t for t in mine if _step(t) == "train-learner"):
            assert learner.start_time < stream.end_time and learner.end_time <= stream.end_time


def _step(task) -> str:
    return task.name.rsplit("-", 1)[0]


def _subflows(prefect: Prefect, flow_run_id) -> tuple[list, list]:
    """(state, id) of the flow run's subflow runs, and their task runs."""
    runs = prefect.subflows(flow_run_id)
    tasks = prefect.task_runs(r.id for r in runs)
    return [(r.state.type.value, r.id) for r in runs], tasks


def _league(done: Finished) -> None:
    """A league is defined by the state each generation starts from: the uninterrupted run's
    match table, ratings and PBT lineage; every snapshot registered once; `psro ratings`."""
    import pandas as pd
    from typer.testing import CliRunner

    from flows.cli.app import app
    from marl_core.league.config import build_league_config
    from marl_core.league.generation import iterate_league_local

    *_, (last, expected) = iterate_league_local(build_league_config(LEAGUE))
    folder = done.download(layout.league_generation_path(3))
    table = pd.read_csv(folder / "match_table.csv")
    pd.testing.assert_frame_equal(table, pd.DataFrame(expected.league.table.rows()), check_exact=False, rtol=1e-12)
    ratings = pd.read_csv(folder / "ratings.csv")
    assert list(ratings["player"]) == [row["player"] for row in expected.ratings.table()]
    assert list(ratings["mu"]) == pytest.approx([row["mu"] for row in expected.ratings.table()])
    metrics = done.run.data.metrics
    assert metrics["main_agent_0/exploitability"] == pytest.approx(last.measured["main_agent_0/exploitability"])
    lineage = json.loads((folder / "lineage.json").read_text())
    assert len(lineage) == 3 and lineage == [dataclasses.asdict(e) for e in expected.lineage]  # one copy a generation
    assert metrics[f"hp/{lineage[-1]['member']}/lr"] == pytest.approx(lineage[-1]["after"]["lr"])
    names = [layout.registered_model_name(done.experiment, "kuhn_poker", role) for role in ("player_0", "player_1")]
    for name in names:  # every snapshot registered once per role
        assert sorted(v.tags["snapshot"] for v in done.versions(name)) == sorted(
            s.id for s in expected.league.snapshots
        )
    assert done.plots() == {layout.RATINGS_PLOT, layout.WIN_RATE_HEATMAP, layout.EXPLOITABILITY_PLOT}
    assert done.steps("rating/main_agent_0/mu") == {1, 2, 3}

    store = done.stack.store
    shown = CliRunner().invoke(app, ["ratings", "--run", done.run_id, "--tracking-uri", store], env={"COLUMNS": "200"})
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
    assert "40 greedy games, 20 per pairing" in flat and "rated as matches of 5" in flat
    assert all(m in played.output for m in members)
    assert re.search(rf"{re.escape(names[1])}/1 │ [^│]+ │ [^│]+ │ [^│]+ │ 8 │", flat), flat  # two pairings of 4 matches


def _pbt(done: Finished) -> None:
    """What was committed before the kill is kept (the same population's in this process up to
    round 1; after it the resumed workers' episodes start afresh), round 3's orphans replaced."""
    from marl_core.pbt.marl import PBTConfig, iterate_pbt_local

    name = layout.registered_model_name(done.experiment, SPREAD, "agent")
    rounds_and_members = sorted((v.tags["round"], v.tags["member"]) for v in done.versions(name))
    assert rounds_and_members == [("1", "0"), ("1", "1"), ("3", "0"), ("3", "1")]
    lineage = json.loads(done.download(f"{layout.PBT_LINEAGE}/lineage.json").read_text())
    assert layout.PBT_PLOT in done.plots()
    local = list(iterate_pbt_local(PBTConfig(**{**PBT, "marl": {**PBT["marl"], "rounds": 2}})))
    first = local[1].lineage[0]
    assert [e["step"] for e in lineage] == [2, 4]  # one copy at each point: the bottom member of two
    assert (lineage[0]["member"], lineage[0]["source"]) == (first.member, first.source)
    assert lineage[0]["after"] == pytest.approx(first.after)
    assert lineage[0]["member_score"] == pytest.approx(first.member_score)
    best = {m.step: m.value for m in done.client.get_metric_history(done.run_id, "best_score")}
    assert sorted(best) == [1, 3] and best[1] == pytest.approx(max(local[1].scores()))
    # round 1's versions: the member that copied holds its source's networks, and says so
    at_round_1 = {v.tags["member"]: v.tags for v in done.versions(name) if v.tags["round"] == "1"}
    copy, source = at_round_1[str(first.member)], at_round_1[str(first.source)]
    assert copy["copied_from"] == str(first.source) and "copied_from" not in source
    assert float(copy["score"]) == float(source["score"]) == pytest.approx(first.source_score)
    committed = json.loads((done.download(layout.pbt_checkpoint_path(3, 2)) / layout.PBT_STATE_FILE).read_text())
    assert committed["round"] == 4 and committed["hyperparameters"][lineage[1]["member"]] == lineage[1]["after"]


def _toy(done: Finished) -> None:
    """The total of an uninterrupted run; the killed round's metric was logged by both attempts."""
    from toy_scenario import ToyConfig, expected_total

    history = done.client.get_metric_history(done.run_id, "total")
    assert {m.step for m in history} == set(range(4))
    newest = max(history, key=lambda m: (m.step, m.timestamp))
    assert newest.value == pytest.approx(expected_total(ToyConfig(**_case("toy").config)), abs=1e-12)


def _cfr(done: Finished) -> None:
    """Deterministic: every round's exploitability that of an uninterrupted run in this process
    (the solver restored whole from round 1's commit: networks, optimizers, memories,
    generators); each round's two members registered once, round 2's orphans replaced."""
    import torch

    from marl_core.neural_cfr.config import NeuralCFRConfig
    from marl_core.neural_cfr.rounds import iterate_cfr_local

    threads = torch.get_num_threads()
    try:
        expected = [record.exploitability for record, _ in iterate_cfr_local(NeuralCFRConfig(**SMALL_CFR))]
    finally:
        torch.set_num_threads(threads)
    history = {m.step: m.value for m in done.client.get_metric_history(done.run_id, "exploitability")}
    assert [history[r] for r in range(4)] == pytest.approx(expected, abs=1e-9)
    for role in ("player_0", "player_1"):
        name = layout.registered_model_name(done.experiment, "kuhn_poker", role)
        assert sorted(int(v.tags["iteration"]) for v in done.versions(name)) == [0, 1, 2, 3]
    assert done.plots() == {layout.EXPLOITABILITY_PLOT, layout.EXPLOITABILITY_TIME_PLOT}
    assert done.steps("exploitability") == {0, 1, 2, 3}


def _case(name: str) -> Case:
    return next(case for case in CASES if case.name == name)


CHECKS = {
    "psro": _psro,
    "pipeline": _pipeline,
    "marl-async": _marl_async,
    "league": _league,
    "pbt": _pbt,
    "cfr": _cfr,
    "toy": _toy,
}


def test_the_prefect_and_mlflow_uis_show_every_scenarios_run(stack, retried, tmp_path):
    """For a person to look at (test-artifacts/screenshots/): each scenario's flow run in
    Prefect's UI with its step subflows, and its MLflow run in MLflow's model-training view
    (MLflow 3 opens its GenAI view unless the link asks for `workflowType=machine_learning`)."""
    from headless_browser import chromium_page, close_mlflow_assistant, shoot, start_mlflow_ui, wait_for_text

    from flows.services.prefect_server import free_port, healthy
    from flows.tracking.layout import mlflow_run_link

    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_"))}
    port = free_port()
    ui = start_mlflow_ui(stack.store, tmp_path, env, port)
    client = _client(stack.store)
    try:
        mlflow_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: healthy(mlflow_url) or ui.poll() is not None, 120, "mlflow ui to answer")
        assert ui.poll() is None, (tmp_path / "mlflow-ui.log").read_text()[-2000:]
        prefect_url = stack.prefect.api_url.removesuffix("/api")
        with chromium_page(tmp_path / "profile") as page:
            for number, case in enumerate(CASES, 1):
                flow_run_id, run_id = retried[case.name]
                flow_run = stack.prefect("read_flow_run", flow_run_id)
                page.goto(f"{prefect_url}/runs/flow-run/{flow_run_id}")
                wait_for_text(page, flow_run.name)
                page.get_by_text("Subflow Runs", exact=True).click()
                step = stack.prefect.subflows(flow_run_id)[0]
                wait_for_text(page, step.name)
                shoot(page, f"20-{number}-prefect-{case.name}")

                run = client.get_run(run_id)
                page.goto(mlflow_run_link(mlflow_url, run.info.experiment_id, run_id))
                wait_for_text(page, run.info.run_name)
                close_mlflow_assistant(page)
                wait_for_text(page, "Model registry")  # the model-training view's side bar (GenAI's has none)
                shoot(page, f"21-{number}-mlflow-{case.name}")
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)
