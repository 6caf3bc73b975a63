"""A learned best response as two halves: the learner asks the pool's store for each round, the
collector plays the round on the rollout workers and answers. They learn what one loop that
does both in turn learns, in threads or as Ray tasks on two CPUs, and when one half fails the
other ends instead of waiting for it (or waits for its retry, when its task will be retried)."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import Future

import numpy as np
import pytest
import ray
import ray.cloudpickle
import torch
from processes import start_bare_ray

from marl_core.psro.config import build_config
from marl_core.psro.learned_oracle import collect_experience, learn_best_response, mixtures, train_best_response
from marl_core.psro.oracles import OracleCall
from marl_core.psro.steps import initial_populations
from marl_core.rl import ALGORITHMS, Experience
from marl_core.rl.ppo import PPOTrainer
from marl_core.rollout.experience_stream import StreamError, StreamTimeouts
from marl_core.rollout.pool import PoolConfig, WorkerPool
from marl_core.rollout.worker import AlgorithmPolicy, LearnerSpec, RolloutRequest

torch.set_num_threads(1)  # as the learner and the workers act: the one loop below must do the same arithmetic

CONFIG = build_config({"oracle": "ppo", "seed": 3, "best_response": {"episodes": 500, "episodes_per_round": 200}})
ROUNDS = 3  # 200, 200 and the last 100 episodes
QUICK = StreamTimeouts(wait=60, retry=10, poll=0.2)  # a hang fails within a minute, with its message
DEADLINE = 60  # seconds a side may take to end once the other has stopped


def _pool() -> WorkerPool:
    return WorkerPool(PoolConfig("kuhn_poker", workers=2, envs_per_worker=8))


def _call(role: int, pool, collector_step: bool = True) -> OracleCall:
    populations = initial_populations(CONFIG)
    return OracleCall(
        CONFIG, role, populations, [np.ones(1), np.ones(1)], iteration=1, pool=pool, collector_step=collector_step
    )


def _one_loop(call: OracleCall) -> tuple[dict, dict]:
    """The learner loop before the split, written out from its definition: push the weights, play
    the round's episodes split over the workers, each share seeded by (run seed, iteration,
    role, round, worker), learn. Returns the final weights and the episodes and steps played."""
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


def _in_thread(function, *args) -> Future:
    """`function(*args)` on a daemon thread: a side that hangs fails the test at its deadline
    instead of holding up the interpreter's exit."""
    outcome: Future = Future()

    def run():
        try:
            outcome.set_result(function(*args))
        except BaseException as error:
            outcome.set_exception(error)

    threading.Thread(target=run, daemon=True).start()
    return outcome


def _learn_fails_at(monkeypatch, calls: list[int], error: BaseException) -> None:
    """PPO's `learn` raises `error` at the learn calls numbered in `calls` (from 0, over all attempts)."""
    original, seen = PPOTrainer.learn, []

    def learn(self, experience):
        seen.append(len(seen))
        if seen[-1] in calls:
            raise error
        return original(self, experience)

    monkeypatch.setattr(PPOTrainer, "learn", learn)


class FailingPool:
    """A pool whose `collect` raises `error` at its call number `at` (from 0); else the pool's own."""

    def __init__(self, pool, at: int, error: BaseException):
        self.pool, self.at, self.error, self.calls = pool, at, error, 0
        self.store, self.size = pool.store, pool.size

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


# --- in threads, on workers in this process ----------------------------------------------------


@pytest.mark.parametrize("placement", ["task beside", "thread inside"])
def test_the_two_halves_learn_what_one_loop_learns(placement):
    """`task beside`: learner and collector as the two steps of a run (here two threads);
    `thread inside`: the oracle called alone, as `approximate-best-response` calls it."""
    reference = _one_loop(_call(1, _pool()))
    pool = _pool()
    if placement == "task beside":
        collector = _in_thread(collect_experience, _call(1, pool), QUICK)
        response = learn_best_response(_call(1, pool), QUICK)
        assert collector.result(timeout=DEADLINE) == ROUNDS
    else:
        response = train_best_response(_call(1, pool, collector_step=False))
    _assert_learned_the_same(response, reference)
    assert response.metrics["episodes"] == 500


def test_a_learner_that_raises_ends_its_collector(monkeypatch):
    _learn_fails_at(monkeypatch, [1], ValueError("non-finite loss"))
    pool = _pool()
    collector = _in_thread(collect_experience, _call(0, pool), QUICK)
    with pytest.raises(ValueError, match="non-finite loss"):
        learn_best_response(_call(0, pool), QUICK)
    assert collector.result(timeout=DEADLINE) == 2  # rounds 0 and 1 played, then it stopped


def test_a_collector_that_raises_fails_its_learner_with_the_collectors_error():
    pool = _pool()
    failing = FailingPool(pool, at=1, error=ValueError("environment step failed"))
    collector = _in_thread(collect_experience, _call(0, failing), QUICK)
    learner = _in_thread(learn_best_response, _call(0, pool), QUICK)
    with pytest.raises(StreamError) as raised:
        learner.result(timeout=DEADLINE)
    assert (
        str(raised.value) == "iteration/1/player_0: the collector failed: ValueError: environment step failed (ask 2)"
    )
    with pytest.raises(ValueError, match="environment step failed"):
        collector.result(timeout=DEADLINE)


def test_a_retried_learner_is_served_by_the_same_collector(monkeypatch):
    """A failure its task is retried for (Ray's, a dropped connection): the collector waits, and
    plays the rounds of the retry from round 0; the retry learns what an undisturbed loop learns."""
    reference = _one_loop(_call(0, _pool()))
    _learn_fails_at(monkeypatch, [1], ConnectionError("reset by peer"))
    pool = _pool()
    collector = _in_thread(collect_experience, _call(0, pool), QUICK)
    with pytest.raises(ConnectionError):
        learn_best_response(_call(0, pool), QUICK)
    response = learn_best_response(_call(0, pool), QUICK)  # the retry
    assert collector.result(timeout=DEADLINE) == 2 + ROUNDS
    _assert_learned_the_same(response, reference)


def test_a_retried_collector_plays_the_round_its_failed_attempt_left():
    reference = _one_loop(_call(0, _pool()))
    pool = _pool()
    failing = FailingPool(pool, at=1, error=ConnectionError("reset by peer"))
    first = _in_thread(collect_experience, _call(0, failing), QUICK)
    learner = _in_thread(learn_best_response, _call(0, pool), QUICK)
    with pytest.raises(ConnectionError):
        first.result(timeout=DEADLINE)
    retry = _in_thread(collect_experience, _call(0, pool), QUICK)
    _assert_learned_the_same(learner.result(timeout=DEADLINE), reference)
    assert retry.result(timeout=DEADLINE) == ROUNDS - 1  # rounds 1 and 2


def test_a_failure_that_is_not_retried_in_time_fails_the_other_side():
    pool = _pool()
    failing = FailingPool(pool, at=0, error=ConnectionError("reset by peer"))
    collector = _in_thread(collect_experience, _call(0, failing), QUICK)
    impatient = StreamTimeouts(wait=60, retry=1, poll=0.2)
    with pytest.raises(
        StreamError,
        match=r"^iteration/1/player_0: the collector failed: ConnectionError: reset by peer "
        r"\(not retried within 1 s\) \(ask 1\)$",
    ):
        learn_best_response(_call(0, pool), impatient)
    with pytest.raises(ConnectionError):
        collector.result(timeout=DEADLINE)


def test_a_side_whose_partner_never_comes_gives_up_at_its_deadline():
    alone = StreamTimeouts(wait=1, poll=0.2)
    with pytest.raises(
        StreamError, match=r"^iteration/1/player_0: the learner waited 1 s for an answer to ask 1 from the collector$"
    ):
        learn_best_response(_call(0, _pool()), alone)
    with pytest.raises(
        StreamError, match=r"^iteration/1/player_1: the collector waited 1 s for an ask from the learner$"
    ):
        collect_experience(_call(1, _pool()), alone)


def test_inside_one_task_the_collectors_own_error_is_raised():
    """In `approximate-best-response` both halves share one task: its failure must be the
    collector's own exception, so a Ray failure is still retried as one."""
    failing = FailingPool(_pool(), at=1, error=ConnectionError("reset by peer"))
    with pytest.raises(ConnectionError, match="reset by peer"):
        train_best_response(_call(0, failing, collector_step=False))


@pytest.mark.timeout(300)  # without a collector beside it, the learner would wait an hour
def test_the_local_runner_runs_each_collector_beside_its_learner(monkeypatch):
    from marl_core.psro import steps

    threads = []
    collect = steps.STEPS["collect-experience"]

    def recorded(*args):
        threads.append(threading.current_thread())
        return collect(*args)

    monkeypatch.setitem(steps.STEPS, "collect-experience", recorded)
    config = CONFIG.model_copy(update={"iterations": 1, "eval": "sampled", "episodes": 20})
    records = [record for record, _ in steps.iterate_psro_local(config)]
    assert len(threads) == 2 and threading.main_thread() not in threads
    assert (
        records[1].oracle_metrics["player_0/oracle_episodes"]
        == records[1].oracle_metrics["player_1/oracle_episodes"]
        == 500
    )


# --- on a small local Ray: learners and collectors as tasks, workers and store as actors -------


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # FailingPool goes to Ray's workers
    start_bare_ray(tmp_path_factory.mktemp("ray"))
    yield
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


# The flow's placement (flows/task_steps.py): a learner holds a CPU slot, a collector none.
@ray.remote(num_cpus=1)
def _learner_task(call: OracleCall, timeouts: StreamTimeouts):
    return learn_best_response(call, timeouts)


@ray.remote(num_cpus=0)
def _collector_task(call: OracleCall, timeouts: StreamTimeouts):
    return collect_experience(call, timeouts)


@pytest.mark.slow
def test_two_learners_and_their_collectors_run_at_once_on_two_cpus(local_ray):
    """Each side waits inside the store actor for a whole round (no short polls here), so this
    also shows that waits never block the store for the other side or the workers' pulls."""
    pool = WorkerPool(PoolConfig("kuhn_poker", workers=2, envs_per_worker=8), on_ray=True)
    patient = StreamTimeouts(wait=240, poll=240)
    try:
        learners = [_learner_task.remote(_call(role, pool), patient) for role in (0, 1)]
        collectors = [_collector_task.remote(_call(role, pool), patient) for role in (0, 1)]
        done, running = ray.wait(learners + collectors, num_returns=4, timeout=240)
        assert not running, f"{len(running)} of 2 learners and 2 collectors still running after 240 s"
        responses = ray.get(learners)
        assert ray.get(collectors) == [ROUNDS, ROUNDS]
    finally:
        pool.close()
    for role, response in enumerate(responses):
        _assert_learned_the_same(response, _one_loop(_call(role, _pool())))


@pytest.mark.slow
def test_on_ray_a_failing_side_ends_the_other(local_ray, monkeypatch):
    pool = WorkerPool(PoolConfig("kuhn_poker", workers=2, envs_per_worker=8), on_ray=True)
    try:
        collector = _collector_task.remote(
            _call(0, FailingPool(pool, at=1, error=ValueError("environment step failed"))), QUICK
        )
        with pytest.raises(StreamError, match=r"the collector failed: ValueError: environment step failed \(ask 2\)$"):
            learn_best_response(_call(0, pool), QUICK)
        with pytest.raises(ValueError, match="environment step failed"):
            ray.get(collector, timeout=DEADLINE)

        _learn_fails_at(monkeypatch, [1], ValueError("non-finite loss"))  # the learner runs here, in the test
        collector = _collector_task.remote(_call(1, pool), QUICK)
        with pytest.raises(ValueError, match="non-finite loss"):
            learn_best_response(_call(1, pool), QUICK)
        assert ray.get(collector, timeout=DEADLINE) == 2
    finally:
        pool.close()


def test_the_flow_submits_a_collector_with_no_cpu_slot(monkeypatch):
    """Ray lends a task's CPU slot to others only while it blocks in `ray.get`: a collector that
    held one would wait to start until its learner blocked. It holds none, so it starts at once
    beside its learner however busy the cores are; the learner keeps its slot."""
    from prefect_ray.context import RemoteOptionsContext

    import tasks
    from flows.task_steps import RayTaskSteps
    from tasks.psro_tasks import TASKS

    class Recorder:
        def __init__(self):
            self.options = []

        def submit(self, *args):
            self.options.append(dict(RemoteOptionsContext.get().current_remote_options))
            return args

    learner, collector = Recorder(), Recorder()
    monkeypatch.setitem(tasks.TASKS, "train-best-response", learner)
    monkeypatch.setitem(tasks.TASKS, "collect-experience", collector)
    runner = RayTaskSteps(TASKS)
    submitted = runner.submit("train-best-response", CONFIG, 0)
    runner.submit_beside(submitted, "collect-experience", CONFIG, 0)
    assert learner.options == [{}] and collector.options == [{"num_cpus": 0}]
