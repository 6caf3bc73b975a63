"""Rollout workers that die mid-request are restarted by Ray and their requests replayed: the
learner still gets exactly the episodes it asked for, and the same ones it would have got. An
actor that holds a run's state and is lost (its node gone, its process killed) costs the run
the steps since its last commit, which it redoes in the same flow run and MLflow run.

The death is not timed from outside: the workers play an environment that kills its own process
at a fixed step of the first request played while an `armed` file exists, and records the pid
it killed. So the kill always lands in the middle of a request, on whichever worker gets there
first, and the test knows which request was replayed.
"""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import ray
from processes import bare_ray_shipping

from marl_core.envs import OpenSpielEnv, one_population_per_agent
from marl_core.games.tree import build_tree
from marl_core.policies.tabular import TabularPolicy
from marl_core.rl import ALGORITHMS
from marl_core.rollout.pool import PoolConfig, WorkerPool
from marl_core.rollout.worker import AlgorithmPolicy, LearnerSpec, PolicyMixture, RolloutRequest

pytestmark = pytest.mark.end_to_end

EPISODES = 800  # per request: 100 per environment copy, some 400 steps each
KILL_AT_STEP = 150  # of one copy, counted from the arming: well inside the request


class DiesOnce(OpenSpielEnv):
    """Leduc poker that, while `armed` exists, kills its worker process at its `at`-th step;
    only the first copy to get there (of any worker) does, and writes the pid to `fired`."""

    def __init__(self, armed: Path, fired: Path, at: int):
        super().__init__("leduc_poker")
        self.armed, self.fired, self.at = armed, fired, at
        self.armed_steps = 0

    def step(self, actions):
        if self.armed.exists():
            self.armed_steps += 1
            if self.armed_steps == self.at:
                try:
                    fired = os.open(self.fired, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    pass  # a worker died already; this one plays on
                else:
                    os.write(fired, str(os.getpid()).encode())
                    os.close(fired)
                    os.kill(os.getpid(), signal.SIGKILL)
        return super().step(actions)


class FailsEveryStep(OpenSpielEnv):
    """Leduc poker whose first step of a request raises; each attempt appends a line to `attempts`."""

    def __init__(self, attempts: Path):
        super().__init__("leduc_poker")
        self.attempts = attempts

    def step(self, actions):
        with self.attempts.open("a") as log:
            log.write(f"{os.getpid()}\n")
        raise ValueError("deterministic failure in the environment")


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    with bare_ray_shipping(__name__, tmp_path_factory.mktemp("ray")):  # the environments above go by value
        yield


def _requests(episodes: int) -> list[RolloutRequest]:
    tree = build_tree("leduc_poker")
    uniform = PolicyMixture((TabularPolicy("leduc_poker", 1, tree.players[1].uniform_policy()),), np.array([1.0]))
    learner = LearnerSpec("learner", AlgorithmPolicy("dqn", ALGORITHMS["dqn"].config()))
    return [
        RolloutRequest(
            one_population_per_agent,
            {"player_1": uniform},
            episodes,
            seed=(worker,),
            learners={"player_0": learner},
            weights_version=1,
        )
        for worker in range(2)
    ]


def _pids(pool: WorkerPool) -> list[int]:
    return ray.get([worker.pid.remote() for worker in pool.workers])


def test_a_worker_killed_during_rollout_is_replaced_and_its_request_replayed_exactly(local_ray, tmp_path):
    armed, fired = tmp_path / "armed", tmp_path / "fired"
    pool = WorkerPool(
        PoolConfig(functools.partial(DiesOnce, armed, fired, KILL_AT_STEP), workers=2, envs_per_worker=8), on_ray=True
    )
    policy = ALGORITHMS["dqn"].policy(30, 3, ALGORITHMS["dqn"].config())
    pool.push("learner", 1, policy.get_weights())
    pids = _pids(pool)
    uninterrupted = pool.collect(_requests(EPISODES))
    assert not fired.exists() and _pids(pool) == pids

    armed.touch()
    requests = _requests(EPISODES)
    results = pool.collect(requests)

    assert fired.exists(), "no worker was killed: nothing was tested"
    killed = pids.index(int(fired.read_text()))
    after = _pids(pool)
    assert after[killed] != pids[killed] and after[1 - killed] == pids[1 - killed]  # only the killed one was replaced
    for request, result in zip(requests, results):
        assert len(result.episode_returns) == request.episodes
        assert result.experience["player_0"].done.sum() == request.episodes
    # The replayed request gives the episodes the same request gave without a kill.
    replayed, reference = results[killed], uninterrupted[killed]
    np.testing.assert_array_equal(replayed.episode_returns, reference.episode_returns)
    np.testing.assert_array_equal(replayed.experience["player_0"].action, reference.experience["player_0"].action)
    np.testing.assert_array_equal(replayed.draws, reference.draws)
    pool.close()


def test_a_deterministic_error_fails_at_once_with_its_message(local_ray, tmp_path):
    """Ray replays a request after a worker dies, never after the request itself raised: the
    error comes back from the first attempt and the worker process stays."""
    attempts = tmp_path / "attempts"
    pool = WorkerPool(
        PoolConfig(functools.partial(FailsEveryStep, attempts), workers=1, envs_per_worker=1), on_ray=True
    )
    pool.push("learner", 1, ALGORITHMS["dqn"].policy(30, 3, ALGORITHMS["dqn"].config()).get_weights())
    pid = _pids(pool)[0]
    with pytest.raises(Exception, match="deterministic failure in the environment"):
        pool.collect(_requests(5)[:1])
    assert attempts.read_text().splitlines() == [str(pid)]  # one attempt, in the original process
    assert _pids(pool) == [pid]
    pool.close()


def test_prefect_retries_only_transient_failures():
    import ray.exceptions
    from prefect.states import Failed

    from tasks.psro_tasks import _transient

    assert _transient(None, None, Failed(data=ray.exceptions.RayActorError()))
    assert _transient(None, None, Failed(data=ConnectionError("reset by peer")))
    assert not _transient(None, None, Failed(data=ValueError("non-finite reward nan")))


def test_only_a_lost_ray_worker_or_node_makes_a_run_go_on_from_its_commit():
    import ray.exceptions

    from flows.runtime.run import lost_ray_worker

    died = ray.exceptions.ActorDiedError()
    assert lost_ray_worker(died) is died
    try:  # as a step's subflow raises it: wrapped, the Ray error its cause
        raise RuntimeError("the step failed") from ray.exceptions.NodeDiedError("node 1 died")
    except RuntimeError as wrapped:
        assert isinstance(lost_ray_worker(wrapped), ray.exceptions.NodeDiedError)
    assert lost_ray_worker(ConnectionError("Ray's head went away")) is None  # stops, says how to resume
    assert lost_ray_worker(ValueError("non-finite reward nan")) is None
    constructor_raised = ray.exceptions.RayActorError(actor_init_failed=True)  # a bug another try repeats
    assert lost_ray_worker(constructor_raised) is None


def test_a_run_whose_weight_store_is_killed_goes_on_from_its_last_commit(local_ray, tmp_path):
    """A league run on this Ray, held as it hands its generation 1 to its tracker, loses its
    weight store (the actor every rollout worker reads weights from, which Ray does not restart);
    released, it says so in one line, goes on from generation 1's commit, and ends FINISHED at
    generation 3 with each metric and each registry version once, in one MLflow run."""
    import subprocess
    import sys

    import mlflow
    import yaml
    from mlflow_reads import assert_each_metric_once, assert_each_version_once
    from processes import FAULT_INJECTION, mlflow_store, prefect_home, wait_until
    from small_runs import SMALL_LEAGUE

    holds = tmp_path / "holds"
    holds.mkdir()
    (tmp_path / "league.yaml").write_text(yaml.safe_dump({"scenario": "league", **SMALL_LEAGUE}))
    store = mlflow_store(tmp_path)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_"))}
    env |= {
        "PREFECT_HOME": str(prefect_home(tmp_path / "prefect-home")),
        "PYTHONPATH": str(FAULT_INJECTION),
        "PSRO_TEST_HOLD_AT_COMMIT": "1",
        "PSRO_TEST_HOLD_DIR": str(holds),
        # as this Ray was started: `ray.init` turns token authentication on, its token in ~/.ray
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
    }
    address = ray.get_runtime_context().gcs_address
    command = [str(Path(sys.executable).with_name("psro")), "run", "--config", "league.yaml"]
    with (tmp_path / "run.log").open("w") as log:
        run = subprocess.Popen(
            [*command, "--tracking-uri", store, "--ray-address", address],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: (holds / "held-1").exists() or run.poll() is not None, 600, "generation 1's commit")
        assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        (store_name, namespace), *others = [
            (actor["name"], actor["namespace"])
            for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["name"].startswith("weight-store-")
        ]
        assert others == []
        ray.kill(ray.get_actor(store_name, namespace=namespace))
        (holds / "release-1").touch()
        assert run.wait(timeout=600) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
    output = (tmp_path / "run.log").read_text()
    assert "lost a Ray worker or node (ActorDiedError); going on from generation 1's commit to MLflow run" in output
    client = mlflow.MlflowClient(tracking_uri=store)
    (found,) = client.search_runs([client.get_experiment_by_name("league").experiment_id])
    assert found.info.status == "FINISHED"
    assert found.data.tags["league.committed_generation"] == "3"
    assert_each_metric_once(client, found)
    assert_each_version_once(client, found.info.run_id)
