"""A learned best response: the learner pushes its weights, the pool's rollout workers play the
round, the learner learns, round after round. It learns exactly what one loop written out from
that definition learns, in this process and as Ray tasks on two CPUs, and a failure of a round
fails the response with the round's own error (so Ray's failures stay retryable). The weights
cross the store actor as arrays and come back as the tensors pushed."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import ray
import torch
from processes import bare_ray_shipping

from marl_core.psro.config import build_config
from marl_core.psro.learned_oracle import mixtures, train_best_response
from marl_core.psro.oracles import OracleCall
from marl_core.psro.steps import initial_populations
from marl_core.rl import ALGORITHMS, Experience
from marl_core.rollout.pool import PoolConfig, WorkerPool, is_transient
from marl_core.rollout.weight_store import WeightStore, WeightStoreClient
from marl_core.rollout.worker import AlgorithmPolicy, LearnerSpec, RolloutRequest

torch.set_num_threads(1)  # as the learner and the workers act: the one loop below must do the same arithmetic

CONFIG = build_config({"oracle": "ppo", "seed": 3, "best_response": {"episodes": 500, "episodes_per_round": 200}})


def _pool() -> WorkerPool:
    return WorkerPool(PoolConfig("kuhn_poker", workers=2, envs_per_worker=8))


def _call(role: int, pool) -> OracleCall:
    return OracleCall(CONFIG, role, initial_populations(CONFIG), [np.ones(1), np.ones(1)], iteration=1, pool=pool)


def _one_loop(call: OracleCall) -> tuple[dict, dict]:
    """The learner's loop written out from its definition: push the weights, play the round's
    episodes (200, 200, then the last 100) split over the workers, each share seeded by (run
    seed, iteration, role, round, worker), learn. Returns the final weights and the episodes
    and steps played."""
    game, pool = CONFIG.psro_game, call.pool
    role = game.roles[call.role]
    seed = int(np.random.SeedSequence([CONFIG.seed, call.iteration, call.role]).generate_state(1)[0])
    settings = CONFIG.ppo.model_copy(update={"seed": seed})
    trainer = ALGORITHMS["ppo"].trainer(game.obs_size[role], game.num_actions[role], settings)
    learner = LearnerSpec("one-loop", AlgorithmPolicy("ppo", settings))
    opponents = mixtures(call.populations, call.meta_strategy, game, skip=call.role)
    played = {"episodes": 0.0, "env_steps": 0.0}
    for round_index, episodes in enumerate([200, 200, 100]):
        pool.push("one-loop", round_index, trainer.policy.get_weights())
        shares = np.array_split(np.arange(episodes), pool.size)
        requests = [
            RolloutRequest(
                game.mapping,
                opponents,
                len(share),
                (CONFIG.seed, 1, call.role, round_index, worker),
                learners={role: learner},
                weights_version=round_index,
            )
            for worker, share in enumerate(shares)
        ]
        results = pool.collect(requests)
        trainer.learn(Experience.concat([r.experience[role] for r in results]))
        played["episodes"] += sum(len(r.episode_returns) for r in results)
        played["env_steps"] += sum(r.env_steps for r in results)
    return trainer.policy.get_weights(), played


def _assert_learned_the_same(response, reference) -> None:
    weights, played = reference
    learned = response.policy.weights()
    assert set(learned) == set(weights)
    for name in weights:
        assert torch.equal(learned[name], weights[name]), name
    assert {k: response.metrics[k] for k in played} == played


class FailingPool:
    """A pool whose `collect` raises `error` at its call number `at` (from 0); else the pool's own."""

    def __init__(self, pool, at: int, error: BaseException):
        self.pool, self.at, self.error, self.calls = pool, at, error, 0
        self.size = pool.size

    def push(self, key: str, version: int, weights) -> None:
        self.pool.push(key, version, weights)

    def drop(self, key: str) -> None:
        self.pool.drop(key)

    def tracking(self, work):
        return self.pool.tracking(work)

    def collect(self, requests, progress=None):
        self.calls += 1
        if self.calls - 1 == self.at:
            raise self.error
        return self.pool.collect(requests, progress)


def test_the_learner_learns_what_one_loop_learns():
    reference = _one_loop(_call(1, _pool()))
    response = train_best_response(_call(1, _pool()))
    _assert_learned_the_same(response, reference)
    assert response.metrics["episodes"] == 500


@pytest.mark.parametrize(
    "error, retried", [(ConnectionError("reset by peer"), True), (ValueError("environment step failed"), False)]
)
def test_a_failed_round_fails_the_response_with_its_own_error(error, retried):
    """Prefect retries the response's task for Ray's failures only (`tasks.psro_tasks._transient`):
    the round's error must reach it as it was raised."""
    failing = FailingPool(_pool(), at=1, error=error)
    with pytest.raises(type(error), match=str(error)):
        train_best_response(_call(0, failing))
    assert failing.calls == 2 and is_transient(error) is retried


# --- on a small local Ray: responses as tasks, workers and store as actors ----------------------


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    with bare_ray_shipping(__name__, tmp_path_factory.mktemp("ray")):
        yield


@ray.remote(num_cpus=1)  # the flow's placement (flows/runtime/task_steps.py): a response holds a CPU slot
def _response_task(call: OracleCall):
    return train_best_response(call)


@pytest.mark.end_to_end
def test_two_responses_run_at_once_on_two_cpus_and_each_learns_what_one_loop_learns(local_ray):
    """Both learners share one pool's workers and store: each gets its own rounds, and the
    workers' pulls keep each learner's weights apart."""
    pool = WorkerPool(PoolConfig("kuhn_poker", workers=2, envs_per_worker=8), on_ray=True)
    try:
        tasks = [_response_task.remote(_call(role, pool)) for role in (0, 1)]
        done, running = ray.wait(tasks, num_returns=2, timeout=240)
        assert not running, f"{len(running)} of 2 responses still running after 240 s"
        responses = ray.get(tasks)
    finally:
        pool.close()
    for role, response in enumerate(responses):
        _assert_learned_the_same(response, _one_loop(_call(role, _pool())))


class _StoreProbe(WeightStore):
    def imported(self, module: str) -> bool:
        return module in sys.modules


def _assert_same(pulled, pushed) -> None:
    assert type(pulled) is type(pushed)
    if isinstance(pushed, torch.Tensor):
        assert pulled.dtype == pushed.dtype and torch.equal(pulled, pushed)
    elif isinstance(pushed, dict):
        assert list(pulled) == list(pushed)
        for key in pushed:
            _assert_same(pulled[key], pushed[key])
    elif isinstance(pushed, (list, tuple)):
        assert len(pulled) == len(pushed)
        for a, b in zip(pulled, pushed):
            _assert_same(a, b)
    else:
        assert pulled == pushed


@pytest.mark.end_to_end
def test_weights_cross_the_store_actor_as_arrays_and_come_back_as_the_tensors_pushed(local_ray):
    """What a worker pulls is what was pushed, nesting and dtypes too (a network's and an
    optimizer's state dicts, as the asynchronous learners push theirs), while the store's own
    process never imports torch."""
    network = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(network.parameters())
    network(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    pushed = {"network": network.state_dict(), "optimizer": optimizer.state_dict(), "rounds": [torch.arange(3), 7]}
    handle = ray.remote(num_cpus=0)(_StoreProbe).remote()
    store = WeightStoreClient(handle)
    store.push("learner", 3, pushed)
    version, pulled = store.pull("learner", 2)
    assert version == 3 and store.pull("learner", 3) is None
    _assert_same(pulled, pushed)
    assert not ray.get(handle.imported.remote("torch"))
    half = torch.ones(2, dtype=torch.bfloat16)  # a dtype numpy lacks travels as a tensor
    store.push("half", 0, {"weight": half})
    _assert_same(store.pull("half", -1)[1], {"weight": half})
