"""Rollout workers that die mid-request are restarted by Ray and their requests replayed: the
learner still gets exactly the episodes it asked for, and the same ones it would have got."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import ray

from marl_core.game_tree import build_tree
from marl_core.rl import ALGORITHMS
from marl_core.rollout import LearnerSpec, RolloutRequest, TabularPopulation
from marl_core.worker_pool import PoolConfig, RayWorkerPool

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=128 * 2**20,
             _temp_dir=str(tmp_path_factory.mktemp("ray")), log_to_driver=False)
    yield
    ray.shutdown()


def _requests(episodes: int) -> list[RolloutRequest]:
    tree = build_tree("leduc_poker")
    uniform = TabularPopulation("leduc_poker", 1, tree.players[1].uniform_policy()[None], np.array([1.0]))
    learner = LearnerSpec("learner", "dqn", ALGORITHMS["dqn"].config())
    return [
        RolloutRequest(learner, ("player_0",), {"player_1": uniform}, episodes, seed=(worker,), weights_version=1)
        for worker in range(2)
    ]


def test_a_worker_killed_during_rollout_is_replaced_and_no_episode_is_lost_or_doubled(local_ray):
    pool = RayWorkerPool(PoolConfig("leduc_poker", workers=2, envs_per_worker=8))
    policy = ALGORITHMS["dqn"].policy(30, 3, ALGORITHMS["dqn"].config())
    pool.push("learner", 1, policy.get_weights())
    expected = pool.collect(_requests(300))  # undisturbed: the reference
    first_pid = ray.get(pool.workers[0].pid.remote())

    requests = _requests(20_000)  # long enough to be killed in the middle
    killer = threading.Timer(3.0, lambda: ray.kill(pool.workers[0], no_restart=False))
    killer.start()
    started = time.perf_counter()
    results = pool.collect(requests)
    killer.join()
    assert time.perf_counter() - started > 3.0, "the request finished before the kill: nothing was tested"
    assert ray.get(pool.workers[0].pid.remote()) != first_pid  # a new process took the request
    for request, result in zip(requests, results):
        assert len(result.episode_returns) == request.episodes
        assert result.experience.done.sum() == request.episodes
    # The replayed request is the same request: same episodes as a worker that never died.
    again = pool.collect(_requests(300))
    for before, after in zip(expected, again):
        np.testing.assert_array_equal(before.episode_returns, after.episode_returns)
    pool.close()


def test_a_deterministic_error_fails_fast_with_its_message(local_ray):
    pool = RayWorkerPool(PoolConfig("leduc_poker", workers=1, envs_per_worker=2))
    bad = RolloutRequest(LearnerSpec("missing", "no_such_algorithm", None), ("player_0",), {}, 5, seed=(0,))
    started = time.perf_counter()
    with pytest.raises(Exception, match="no_such_algorithm"):
        pool.collect([bad])
    assert time.perf_counter() - started < 10
    pool.close()


def test_prefect_retries_only_transient_failures():
    import ray.exceptions
    from prefect.states import Failed

    from tasks.psro_tasks import _transient

    assert _transient(None, None, Failed(data=ray.exceptions.RayActorError()))
    assert _transient(None, None, Failed(data=ConnectionError("reset by peer")))
    assert not _transient(None, None, Failed(data=ValueError("non-finite reward nan")))
