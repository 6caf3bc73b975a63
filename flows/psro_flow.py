"""PSRO as Prefect flows: a `psro` flow that runs one `psro-iteration` subflow per iteration.

Each iteration's tasks run on Ray through prefect-ray's RayTaskRunner; the best responses of all
players run in parallel, and sampled evaluation fans out over the cores. The driver keeps the
state (populations, payoff table, meta-strategies) and hands MLflow logging to a background
thread so tracking never holds up the next iteration.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import ray
from prefect import flow, get_run_logger
from prefect.exceptions import CancelledRun
from prefect.runtime import flow_run
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.states import Cancelled
from prefect.utilities.annotations import opaque

import tasks
from flows.patches import fresh_every_call
from flows.progress import PlainLines, ProgressView, plain_interval, watching
from flows.ray_runner import FastRayTaskRunner
from flows.runtime import (
    StartingServices,
    finish_before_prefect_stops,
    ray_session,
    ray_to_use,
    reap_on_crash,
    run_services,
)
from flows.tracking.layout import FLOW_RUN_TAG
from marl_core.psro import steps as psro
from marl_core.psro.config import PSROConfig
from marl_core.psro.steps import IterationRecord, PSROState

IterationCallback = Callable[[IterationRecord, PSROState], None]


class Handoff:
    """Passes the state from one iteration's subflow to the next, inside this process.

    `inbox` resolves to the state the iteration starts from, or to None when the run stopped
    before it; `outbox` resolves to the iteration's (record, state) as soon as its work is done,
    before Prefect has finished recording the subflow. The subflow gets the handoff's key, not
    the handoff: Prefect copies a flow's parameters into every task's context, and futures do
    not pickle.
    """

    _open: dict[str, Handoff] = {}

    def __init__(self):
        self.inbox: Future = Future()
        self.outbox: Future = Future()
        self.key = uuid.uuid4().hex
        Handoff._open[self.key] = self

    @classmethod
    def take(cls, key: str) -> Handoff:
        return cls._open.pop(key)


@fresh_every_call
@flow(name="psro-iteration", task_runner=FastRayTaskRunner(), validate_parameters=False, persist_result=False)
def psro_iteration(config: PSROConfig, iteration: int, run_started: float, pool, handoff: str):
    """Best responses, then the new payoff entries, then the meta-game; iteration 0 only evaluates.

    The subflow starts before the previous iteration has finished (see `_run_iterations`) and
    waits for its state here. A run that stops first ends this subflow Cancelled.
    """
    handoff = Handoff.take(handoff)
    previous = handoff.inbox.result()
    if previous is None:
        return Cancelled(message="the run stopped before this iteration")
    try:
        handoff.outbox.set_result(_iteration_work(config, iteration, previous, run_started, pool))
    except BaseException as error:
        handoff.outbox.set_exception(error)
        raise


def _iteration_work(config: PSROConfig, iteration: int, previous: PSROState, run_started: float, pool):
    """`marl_core.psro.steps.run_iteration`, its steps submitted as Prefect tasks on Ray."""
    return psro.run_iteration(config, previous, iteration, RayTaskSteps(), pool, run_started)


@fresh_every_call
@flow(name="psro-iteration", task_runner=FastRayTaskRunner(), validate_parameters=False, persist_result=False)
def pipeline_iteration(config: PSROConfig, iteration: int, run_started: float, pool, handoff: str):
    """Pipeline PSRO's iteration: the levels learn until the lowest one freezes (`train-levels`,
    the learning done by the levels' actors), then its responses join as in a PSRO iteration.
    The handoff's inbox holds (state, pipeline); its outbox gets (record, state, pipeline)."""
    from marl_core.psro.pipeline import with_training_time

    handoff = Handoff.take(handoff)
    previous, pipeline = handoff.inbox.result()
    try:
        runner = RayTaskSteps()
        learning = time.perf_counter()
        responses, pipeline = runner.submit_driving_actors("train-levels", pipeline, runner.share(previous)).result()
        trained = time.perf_counter() - learning
        record, state = psro.run_iteration(config, previous, iteration, runner, pool, run_started, given=responses)
        handoff.outbox.set_result((with_training_time(record, trained), state, pipeline))
    except BaseException as error:
        handoff.outbox.set_exception(error)
        raise


class RayTaskSteps:
    """The flow's `Runner`: every step is a Prefect task on Ray, all submitted at once.

    Ray starts each task as soon as its inputs exist, so no stage waits for a round trip through
    this process. Tasks get object references: each shared value is put in Ray's object store
    once instead of being pickled into every task that reads it, and marked `opaque` so Prefect
    takes it whole. A learned oracle's learner task is served by a collector task that drives
    the run's rollout workers (`pool`, Ray actors). `tasks`: the step name -> Prefect task
    table (default PSRO's; a league generation's is `tasks.league_tasks.TASKS`).
    """

    def __init__(self, task_table: dict | None = None):
        self.tasks = tasks.TASKS if task_table is None else task_table

    def share(self, value):
        return opaque(ray.put(value))

    def submit(self, step: str, *args):
        return self.tasks[step].submit(*_opaque_futures(args))

    def submit_beside(self, partner, step: str, *args):
        """The step only waits on its partner and on actors, so it holds no CPU slot: it starts
        at once beside its partner however busy the cores are. (Holding one, it would wait until
        Ray lent it the slot of a task blocked in `ray.get`, such as its learner's first wait.)"""
        return self.submit_driving_actors(step, *args)

    def submit_driving_actors(self, step: str, *args):
        """A step whose work is done by actors it waits on holds no CPU slot (see `submit_beside`)."""
        from prefect_ray.context import remote_options

        with remote_options(num_cpus=0):
            return self.tasks[step].submit(*_opaque_futures(args))

    def result(self, future):
        return future.result()

    def evaluation_parts(self, config: PSROConfig) -> int:
        return 1 if config.eval == "exact" else max(1, int(ray.cluster_resources().get("CPU", 1)))


def _opaque_futures(args: tuple) -> tuple:
    """Earlier tasks' futures (alone or in a list) wrapped in `opaque`, as `share` wraps what it
    puts in Ray's object store: Prefect resolves them and records them as the task's inputs, but
    does not walk every value inside a population or a table looking for more futures, which it
    otherwise does three times per task (it was a fifth of a worker's time on Leduc)."""
    from prefect.futures import PrefectFuture

    def wrap(value):
        if isinstance(value, PrefectFuture):
            return opaque(value)
        if isinstance(value, list) and value and all(isinstance(item, PrefectFuture) for item in value):
            return [opaque(item) for item in value]
        return value

    return tuple(wrap(arg) for arg in args)


@flow(name="psro", validate_parameters=False, persist_result=False)
def psro_flow(
    config: dict,
    on_iteration: IterationCallback | None = None,
    resume_run_id: str | None = None,
    progress: ProgressView | None = None,
) -> PSROState:
    """The whole run: the deployable entry point (its parameters are a plain config mapping).

    The learned responses' progress is shown in `progress` while the run works; without one (a
    deployment's run) as plain lines in the flow run's log.

    With `resume_run_id` it continues that MLflow run after its last committed iteration; so does
    a retry of a flow run (see `_earlier_attempt`). The export, if configured, is written here,
    so a deployment's run writes it as `psro run` does.
    """
    from flows.preflight import preflight
    from flows.tracking.resume import load_checkpoint
    from flows.tracking.run_tracker import RunTracker

    config = PSROConfig(**config) if isinstance(config, dict) else config
    preflight(config)  # deployments start here, not at the CLI: same checks before any work
    resume_run_id = resume_run_id or _earlier_attempt(config)
    run_started = time.perf_counter()
    checkpoint = load_checkpoint(config.tracking_uri, resume_run_id) if resume_run_id else None
    state = psro.resumed_state(checkpoint) if checkpoint else psro.initial_state(config)
    first = checkpoint.iteration + 1 if checkpoint else 0
    with contextlib.ExitStack() as stack:
        # Heartbeats add seconds to every subflow (docs/performance.md); however the flow was
        # started (CLI, `psro serve`, a work-pool worker), its iterations run without them.
        stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        if not ray.is_initialized():  # run by a deployment: one Ray session for all iterations
            stack.enter_context(reap_on_crash())
            api_url = os.environ.get("PREFECT_API_URL")
            address, worker_env = ray_to_use(config.ray_address, api_url) if api_url else (config.ray_address, {})
            stack.enter_context(ray_session(address, config.num_cpus, worker_env))
        pool = _start_rollout_workers(config, stack)
        if pool is not None:
            stack.enter_context(
                watching(pool.progress, progress or PlainLines(get_run_logger().info, plain_interval()))
            )
        tracker = stack.enter_context(RunTracker(config, resume=checkpoint, tags={FLOW_RUN_TAG: str(flow_run.id)}))
        run = _run_pipeline if config.pipeline is not None else _run_iterations
        state, record = run(config, state, first, run_started, pool, tracker, on_iteration)
        tracker.finish(state)
    if config.export:
        _write_export(config, state, record, time.perf_counter() - run_started)
    return state


def _run_iterations(
    config, state, first, run_started, pool, tracker, on_iteration
) -> tuple[PSROState, IterationRecord | None]:
    """One subflow per iteration, in order; each next subflow starts while this one works.

    Starting a subflow (creating its run, proposing Running) and finishing one (proposing
    Completed) are round trips to the Prefect server that do not depend on the work, so they
    overlap the neighbouring iteration's tasks instead of sitting between two iterations. The
    work itself stays strictly sequential: an iteration's body waits for the previous state,
    which it copies before changing anything, so a state handed to `on_iteration` stays as it was.
    Returns the last state and the last iteration's record (None when nothing was left to run).
    """
    if first > config.iterations:
        return state, None
    threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="psro-iteration")

    def start(iteration: int) -> tuple[Handoff, Future]:
        handoff = Handoff()
        subflow = threads.submit(
            contextvars.copy_context().run, psro_iteration, config, iteration, run_started, pool, handoff.key
        )
        return handoff, subflow

    iteration, upcoming = first, None
    current = start(iteration)
    current[0].inbox.set_result(state)
    try:
        while True:
            upcoming = start(iteration + 1) if iteration < config.iterations else None
            handoff, subflow = current
            wait([handoff.outbox, subflow], return_when=FIRST_COMPLETED)
            if not handoff.outbox.done():
                subflow.result()  # the subflow failed before its work began: raise why
            record, state = handoff.outbox.result()
            stop = psro.should_stop(config, record)
            if upcoming:
                upcoming[0].inbox.set_result(None if stop else state)
            tracker.log_iteration(record, state)
            if on_iteration:
                on_iteration(record, state)
            subflow.result()
            if stop and upcoming:
                with contextlib.suppress(CancelledRun):
                    upcoming[1].result()
            if stop or not upcoming:
                break
            current, iteration = upcoming, iteration + 1
    except BaseException:
        # Ctrl-C or a failed iteration. A subflow still working is not waited for here: stopping
        # Ray (the caller's next step) ends its work, and the run's exit waits for it to record
        # that while the Prefect server still answers (see `finish_before_prefect_stops`).
        if upcoming and not upcoming[0].inbox.done():
            upcoming[0].inbox.set_result(None)
        finish_before_prefect_stops(current[1], *(upcoming[1:] if upcoming else ()))
        threads.shutdown(wait=False, cancel_futures=True)
        raise
    threads.shutdown()
    return state, record


def _run_pipeline(
    config, state, first, run_started, pool, tracker, on_iteration
) -> tuple[PSROState, IterationRecord | None]:
    """Pipeline PSRO: iteration 0 as in PSRO, then one `psro-iteration` subflow per freeze. The
    levels' learners are Ray actors of this process, started between iterations, stopped with
    the run; a resumed run starts its levels afresh above the iterations it committed."""
    from marl_core.psro.pipeline import Pipeline

    record = None
    if first == 0:
        handoff = Handoff()
        handoff.inbox.set_result(state)
        psro_iteration(config, 0, run_started, pool, handoff.key)
        record, state = _logged(handoff.outbox.result(), tracker, on_iteration)
    pipeline = Pipeline(config, state, pool, on_ray=True)
    try:
        while pipeline.levels and not (record and psro.should_stop(config, record)):
            handoff = Handoff()
            handoff.inbox.set_result((state, pipeline))
            try:
                pipeline_iteration(config, state.iteration + 1, run_started, pool, handoff.key)
            finally:
                Handoff._open.pop(handoff.key, None)  # a subflow that never started never took it
            record, state, pipeline = handoff.outbox.result()
            _logged((record, state), tracker, on_iteration)
            pipeline.start_levels(state)
    finally:
        pipeline.close()
    return state, record


def _logged(result: tuple[IterationRecord, PSROState], tracker, on_iteration) -> tuple[IterationRecord, PSROState]:
    record, state = result
    tracker.log_iteration(record, state)
    if on_iteration:
        on_iteration(record, state)
    return record, state


def _earlier_attempt(config: PSROConfig) -> str | None:
    """The MLflow run that an earlier attempt of this flow run committed to, when this is a retry.

    Prefect's UI retries a crashed or failed run (a killed worker process, a lost node) by
    scheduling the same flow run again, state "AwaitingRetry", and a worker or `psro serve` runs
    it again with the same parameters and a higher run count. It continues the MLflow run it
    created, as `psro resume` would, instead of starting another.
    """
    from flows.tracking.resume import find_tagged

    return find_tagged(config, FLOW_RUN_TAG, str(flow_run.id)) if flow_run.run_count > 1 else None


def _write_export(config: PSROConfig, state: PSROState, last: IterationRecord | None, wall: float) -> None:
    """The OpenSpiel-checkable export; `last` is None when a resumed run had nothing left to do."""
    from marl_core.psro.export import write_export

    if last:
        report, approx = last.report, last.approx
    else:
        report, approx = (
            psro.measure(config, state.populations, psro.MetaGame(state.payoffs, state.meta_strategy)),
            None,
        )
    write_export(config.export, config, state.populations, state.meta_strategy, report, state.iteration, wall, approx)


def _start_rollout_workers(config: PSROConfig, stack: contextlib.ExitStack):
    """The run's rollout workers (Ray actors), started once and stopped with the run."""
    pool_config = psro.rollout_pool_config(config)
    if pool_config is None:
        return None
    from marl_core.rollout.pool import WorkerPool

    pool = WorkerPool(pool_config, on_ray=True)
    stack.callback(pool.close)
    return pool


def run_psro(
    config: PSROConfig,
    on_iteration: IterationCallback | None = None,
    resume_run_id: str | None = None,
    services: StartingServices | None = None,
    progress: ProgressView | None = None,
) -> PSROState:
    """Start what the run needs (Prefect server, Ray, MLflow store), run the `psro` flow, stop all.

    ``services``: the services as `services_starting()` began them, for callers that start them
    before their own slow imports (as `psro run` does); ``progress`` shows the run's long work
    (see `psro_flow`).
    """
    with run_services(config.ray_address, config.num_cpus, config.game, config.tracking_uri, services):
        return psro_flow(config, on_iteration, resume_run_id, progress)
