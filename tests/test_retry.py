"""Retrying a crashed deployment run from Prefect's UI continues its MLflow run.

`psro serve` serves the kuhn-smoke deployment with the tracker's fault-injection hook set, so
the triggered run's process dies by SIGKILL after iteration KILLED_AT's members are registered
and before that iteration is committed (Prefect marks the run Crashed). The serving process is
restarted without the hook, as after a crashed node, and the run is retried exactly as the UI's
Retry button does it: the same flow run is set to a Scheduled state named "AwaitingRetry", and
the serving process runs it again with the same parameters. The retry must continue the same
MLflow run from its last committed iteration and end with an uninterrupted run's payoff table
and meta-strategy (played through in this process), each member registered once.
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
from processes import assert_all_exited, mlflow_store, prefect_home, wait_until

from flows.tracking.layout import COMMITTED_TAG
from flows.tracking.run_tracker import KILL_BEFORE_COMMIT
from marl_core.psro.config import build_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 4
ROLES = ("player_0", "player_1")  # kuhn_poker's populations
KILLED_AT = 2
DEPLOYMENT = "psro/kuhn-smoke"


class Served:
    """`psro serve` of the kuhn-smoke deployment against the test's Prefect server."""

    def __init__(self, work: Path, env: dict, name: str):
        self.log_path = work / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("psro")),
                "serve",
                "--deployment",
                "kuhn-smoke",
                "--prefect-yaml",
                str(ROOT / "prefect.yaml"),
            ],
            cwd=work,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self._log.close()


def _prefect(api_url: str, method: str, *args, **kwargs):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        with get_client(sync_client=True) as client:
            return getattr(client, method)(*args, **kwargs)


def test_a_crashed_deployment_run_retried_as_the_ui_does_continues_its_mlflow_run(tmp_path):
    from prefect.states import Scheduled

    from flows.runtime import LocalPrefectServer

    home = tmp_path / "prefect-home"
    marker = f"PREFECT_HOME={home}"
    store = mlflow_store(tmp_path)
    client = mlflow.MlflowClient(tracking_uri=store, registry_uri=store)
    server = LocalPrefectServer(prefect_home(home))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_"))}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_API_URL=server.url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_RUNNER_POLL_FREQUENCY="1",
    )  # the serving process looks for scheduled runs every second, not every 10
    serving = Served(tmp_path, {**env, KILL_BEFORE_COMMIT: str(KILLED_AT)}, "serve-crashing")
    try:
        server.wait()
        deployment = wait_until(lambda: _deployment(server.url), 120, "psro serve to register kuhn-smoke")

        def config_of(experiment: str) -> dict:
            return {
                "game": "kuhn_poker",
                "meta_solver": "nash",
                "iterations": ITERATIONS,
                "num_cpus": 2,
                "tracking_uri": store,
                "experiment": experiment,
            }

        def trigger(experiment: str):
            return _prefect(
                server.url,
                "create_flow_run_from_deployment",
                deployment.id,
                parameters={"config": config_of(experiment)},
            ).id

        def final_state(flow_run_id, timeout: float = 300):
            return wait_until(
                lambda: (s := _prefect(server.url, "read_flow_run", flow_run_id).state).is_final() and s,
                timeout,
                f"flow run {flow_run_id} to end",
            )

        crashed = trigger("retried")
        state = final_state(crashed)
        assert state.is_crashed(), (state, serving.log_path.read_text()[-3000:])
        (run,) = client.search_runs([client.get_experiment_by_name("retried").experiment_id])
        assert run.data.tags[COMMITTED_TAG] == str(KILLED_AT - 1)
        for role in ROLES:  # the uncommitted iteration's member is in the registry
            assert registered_members(client, "retried", role) == [(m, m) for m in range(KILLED_AT + 1)]

        serving.stop()  # the crashed node comes back: served again, without the fault
        serving = Served(tmp_path, env, "serve")
        _prefect(
            server.url,
            "set_flow_run_state",
            crashed,
            Scheduled(name="AwaitingRetry", message="Retry from the UI"),
            force=True,
        )
        state = final_state(crashed)
        assert state.is_completed(), (state, serving.log_path.read_text()[-3000:])
        assert _prefect(server.url, "read_flow_run", crashed).run_count == 2

        runs = client.search_runs([client.get_experiment_by_name("retried").experiment_id])
        assert [r.info.run_id for r in runs] == [run.info.run_id], (
            "the retry did not continue the crashed attempt's MLflow run"
        )
        retried = client.get_run(run.info.run_id)
        assert retried.info.status == "FINISHED"
        assert final_tables(client, retried.info.run_id, ITERATIONS) == uninterrupted_tables(
            build_config(config_of("retried"))
        )
        for role in ROLES:  # each member exactly once, the redone one included
            assert registered_members(client, "retried", role) == [(m, m) for m in range(ITERATIONS + 1)]
    finally:
        serving.stop()
        server.stop()
        assert_all_exited(marker, timeout=60)


def _deployment(api_url: str):
    from prefect.exceptions import ObjectNotFound

    try:
        return _prefect(api_url, "read_deployment_by_name", DEPLOYMENT)
    except ObjectNotFound:
        return None
