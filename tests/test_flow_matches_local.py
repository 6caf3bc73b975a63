"""The orchestrated run computes what the in-process loop computes.

`psro run`'s path (a real Prefect server, a real local Ray, MLflow in SQLite, one subflow per
iteration that starts while the previous one works) and `marl_core.psro.steps.iterate_psro_local` run
the same config; their payoff tables and meta-strategies must be identical, iteration by
iteration. The flow's iterations must also be visible in Prefect as they ran: one completed
`psro-iteration` subflow per iteration, and where the run stopped early, the subflow already
started for the next iteration ends Cancelled rather than computing anything. A learned
response shows as one task run, `train-best-response`, which plays its rounds itself.

The same holds for MARL training: `psro marl run`'s rounds (a `marl-round` subflow each, its
steps Prefect tasks driving Ray actors) and `iterate_marl_local` report identical metrics and end
with identical weights.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from processes import mlflow_store, poll, prefect_home

from marl_core.psro.config import PSROConfig
from marl_core.psro.steps import iterate_psro_local

pytestmark = pytest.mark.end_to_end


def _local(config: PSROConfig):
    return [(record, _snapshot(state)) for record, state in iterate_psro_local(config)]


def _snapshot(state):
    return (
        state.payoffs.mean.copy(),
        [m.copy() for m in state.meta_strategy],
        [p.tables.copy() for p in state.populations],
    )


def _iteration_flow_runs(api_url: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def read():
        async with get_client() as client:
            return await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["psro-iteration"])))

    with temporary_settings({PREFECT_API_URL: api_url}):  # the settings this process loaded may predate the server
        return asyncio.run(read())


def _task_runs(api_url: str, flow_run_ids) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(flow_run_ids)))
            )

    with temporary_settings({PREFECT_API_URL: api_url}):
        return asyncio.run(read())


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """One real Prefect server for this module's own home (Prefect's clients in this process keep
    the first server they talk to), and an MLflow store in the module's folder."""
    from flows.services.prefect_server import prefect_api

    work = tmp_path_factory.mktemp("flow-vs-local")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFECT_HOME", str(prefect_home(work / "prefect-home")))
        patch.delenv("PREFECT_API_URL", raising=False)
        with prefect_api() as api:
            api[1]()  # wait until it answers
            yield api, mlflow_store(work)


@pytest.mark.parametrize(
    "settings",
    [
        # stops early: the subflow started for the next iteration must end Cancelled
        dict(game="kuhn_poker", oracle="exact", eval="exact", iterations=12, stop_exploitability=0.05),
        # sampled evaluation fans out over the cores in the flow and runs as one chunk locally
        dict(game="kuhn_poker", oracle="exact", eval="sampled", episodes=200, iterations=3),
        # learned responses: learner and collector as two tasks in the flow, two threads locally
        dict(
            game="kuhn_poker",
            oracle="ppo",
            eval="sampled",
            episodes=50,
            iterations=2,
            best_response={"episodes": 400, "episodes_per_round": 200},
        ),
    ],
    ids=["exact-stops-early", "sampled", "learned"],
)
def test_flow_and_local_loop_agree(services, settings):
    from flows.deployments.entrypoints import run_scenario
    from flows.scenarios.psro import PSRO

    api, tracking_uri = services
    config = PSROConfig(meta_solver="nash", seed=3, tracking_uri=tracking_uri, num_cpus=2, **settings)
    expected = _local(config)
    earlier = {run.id for run in _iteration_flow_runs(api[0])}
    seen = []
    run_scenario(PSRO, config, observer=lambda record, state: seen.append((record, _snapshot(state))))

    assert [r.iteration for r, _ in seen] == [r.iteration for r, _ in expected]
    for (record, (payoffs, meta, populations)), (local_record, (local_payoffs, local_meta, local_populations)) in zip(
        seen, expected
    ):
        np.testing.assert_array_equal(payoffs, local_payoffs, err_msg=f"iteration {record.iteration}")
        for a, b in zip(meta, local_meta):
            np.testing.assert_array_equal(a, b, err_msg=f"iteration {record.iteration}")
        for a, b in zip(populations, local_populations):
            np.testing.assert_array_equal(a, b, err_msg=f"iteration {record.iteration}")
        assert record.report.nash_conv == local_record.report.nash_conv

    runs = [run for run in _iteration_flow_runs(api[0]) if run.id not in earlier]
    states = sorted(run.state.type.value for run in runs)
    iterations = len(seen)
    stopped_early = iterations < config.iterations + 1
    assert states == sorted(["COMPLETED"] * iterations + (["CANCELLED"] if stopped_early else []))
    if settings.get("stop_exploitability") is not None:
        assert stopped_early, "the stop threshold was meant to end this run before its last iteration"

    def recorded(tasks) -> bool:  # task runs reach the server as events, which may lag the run's end
        learned = [t for t in tasks if t.name.startswith("train-best-response")]
        return len(learned) >= 2 * (iterations - 1) and all(t.state.is_final() for t in tasks)

    tasks = poll(lambda: _task_runs(api[0], [run.id for run in runs]), recorded)
    learners = [t for t in tasks if t.name.rsplit("-", 1)[0] == "train-best-response"]
    assert len(learners) == 2 * (iterations - 1) and {t.state.type.value for t in learners} == {"COMPLETED"}
    # a learned response is that one task: it plays its own rounds on the rollout workers
    assert {t.name.rsplit("-", 1)[0] for t in tasks} <= {
        "train-best-response",
        "evaluate-payoffs",
        "solve-meta-game",
        "measure-exploitability",
        "approximate-best-response",
    }


def test_marl_flow_and_local_loop_agree(services, tmp_path):
    import mlflow
    import torch

    from flows.deployments.entrypoints import run_scenario
    from flows.scenarios.marl import MARL
    from flows.tracking import layout
    from marl_core.marl.config import MARLConfig
    from marl_core.marl.rounds import iterate_marl_local

    _, tracking_uri = services
    config = MARLConfig(
        env="pettingzoo:mpe2.simple_spread_v3",
        algorithm="mappo",
        rounds=3,
        steps_per_round=25,
        workers=2,
        envs_per_worker=2,
        eval_every=2,
        eval_episodes=4,
        checkpoint_every=3,
        seed=5,
        num_cpus=2,
        tracking_uri=tracking_uri,
        experiment="marl-flow-vs-local",
    )
    timing = ("seconds/", "env_steps_per_second")
    local, learner = [], None
    for record, learner in iterate_marl_local(config):  # noqa: B007 - the last learner is checked after the loop
        local.append({k: v for k, v in record.metrics.items() if not k.startswith(timing)})
    seen = []
    run_scenario(
        MARL,
        config,
        observer=lambda record, _: seen.append({k: v for k, v in record.metrics.items() if not k.startswith(timing)}),
    )

    assert len(seen) == len(local) == 3 and any("eval_return/policy/agent" in m for m in seen)
    for round, (flow_metrics, local_metrics) in enumerate(zip(seen, local)):
        assert flow_metrics == local_metrics, f"round {round}"
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("marl-flow-vs-local").experiment_id])
    folder = client.download_artifacts(run.info.run_id, layout.policy_checkpoint_path("agent", 2), str(tmp_path))
    weights = torch.load(f"{folder}/{layout.POLICY_WEIGHTS}", weights_only=True)
    expected = learner.policies["agent"].get_weights()
    assert weights.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name


def test_pipeline_flow_and_local_loop_agree(services):
    """Pipeline PSRO's flow (levels as Ray actors, a `train-levels` task per freeze) computes
    what its in-process loop computes, freeze for freeze."""
    from flows.deployments.entrypoints import run_scenario
    from flows.scenarios.psro import PSRO
    from marl_core.psro.pipeline import iterate_pipeline_local

    api, tracking_uri = services
    config = PSROConfig(
        game="kuhn_poker",
        oracle="dqn",
        iterations=3,
        seed=3,
        tracking_uri=tracking_uri,
        num_cpus=2,
        best_response={"episodes": 1200, "episodes_per_round": 200},
        rollout={"workers": 2, "envs_per_worker": 8},
        dqn={"learning_starts": 100, "epsilon_decay_steps": 800},
        pipeline={
            "active_levels": 2,
            "window": 400,
            "plateau": {"threshold": 0.5, "check_from": 800, "min_episodes": 800},
        },
    )
    expected = [(record, _snapshot(state)) for record, state in iterate_pipeline_local(config)]
    earlier = {run.id for run in _iteration_flow_runs(api[0])}
    seen = []
    run_scenario(PSRO, config, observer=lambda record, state: seen.append((record, _snapshot(state))))

    assert [r.iteration for r, _ in seen] == [r.iteration for r, _ in expected] == [0, 1, 2, 3]
    for (record, (payoffs, meta, populations)), (local_record, (local_payoffs, local_meta, local_populations)) in zip(
        seen, expected
    ):
        np.testing.assert_array_equal(payoffs, local_payoffs, err_msg=f"iteration {record.iteration}")
        for a, b in zip(meta, local_meta):
            np.testing.assert_array_equal(a, b, err_msg=f"iteration {record.iteration}")
        for a, b in zip(populations, local_populations):
            np.testing.assert_array_equal(a, b, err_msg=f"iteration {record.iteration}")
        assert record.report.nash_conv == local_record.report.nash_conv
        assert record.oracle_metrics.get("player_0/oracle_episodes") == local_record.oracle_metrics.get(
            "player_0/oracle_episodes"
        )
    assert any(record.oracle_metrics["player_0/oracle_episodes"] < 1200 for record, _ in seen[1:]), (
        "no level froze at its plateau"
    )

    runs = [run for run in _iteration_flow_runs(api[0]) if run.id not in earlier]
    assert sorted(run.state.type.value for run in runs) == ["COMPLETED"] * 4
    tasks = _task_runs(api[0], [run.id for run in runs])
    trained = [t for t in tasks if t.name.rsplit("-", 1)[0] == "train-levels"]
    assert len(trained) == 3 and {t.state.type.value for t in trained} == {"COMPLETED"}
    assert not [t for t in tasks if t.name.rsplit("-", 1)[0] == "train-best-response"]
