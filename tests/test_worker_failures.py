"""Rollout workers that die mid-request are restarted by Ray and their requests replayed: the
learner still gets exactly the episodes it asked for, and the same ones it would have got.

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
