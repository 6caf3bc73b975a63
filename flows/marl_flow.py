"""MARL training as Prefect flows: a `marl` flow that runs one `marl-round` subflow per round.

A round is `marl_core.marl.rounds.run_round`, the same function the in-process loop runs: its
steps (`collect-rollouts`, `update-learner`, `evaluate-policies`) are Prefect tasks on Ray
through prefect-ray's task runner, and drive actors that live for the whole run: the rollout
workers (the one rollout engine's `WorkerPool`, the PSRO oracles' pool too) and the learner.
So the learner's state never travels between rounds: only a round's batch moves, and the
learner publishes its weights to the pool's parameter store, from which each worker pulls them
once per request. An asynchronous algorithm's round (`marl_core.marl.async_rounds`) has the
tasks `stream-rollouts` and one `train-learner` per learner running at once instead: the workers
stream into a dataset server actor while the learner actors train.

Every `checkpoint_every` rounds the learner's training state and each policy's weights go to
MLflow, the policies are registered, and then the run is tagged with the round: the commit. A
killed run resumes from its last committed round (`psro marl resume RUN_ID`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import ray
from prefect import flow, get_run_logger
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows.patches import fresh_every_call
from flows.progress import PlainLines, ProgressView, plain_interval, watching
from flows.ray_runner import FastRayTaskRunner
from flows.runtime import StartingServices, run_services
from marl_core.marl import rounds, training
from marl_core.marl.async_rounds import RayAsyncLearners, asynchronous
from marl_core.marl.training import LearnerActor, MARLConfig, RayLearner, RoundRecord
from marl_core.rollout.pool import WorkerPool

RoundCallback = Callable[[RoundRecord], None]


class _TaskRunner:
    """`rounds.Runner` as Prefect tasks on Ray: each step a task of the round's subflow. The
    tasks only drive actors, so they hold no CPU slot (on a small machine a waiting task that
    held one would starve the actors)."""

    def submit(self, step: str, *args):
        from prefect_ray.context import remote_options

        from tasks.marl_tasks import TASKS

        with remote_options(num_cpus=0):
            return TASKS[step].submit(*args)

    def result(self, future):
        return future.result()


@fresh_every_call
@flow(name="marl-round", task_runner=FastRayTaskRunner(), validate_parameters=False, persist_result=False)
def marl_round(config: MARLConfig, round: int, env_steps: int, pool, learner: RayLearner, layout) -> RoundRecord:
    return rounds.run_round(config, round, env_steps, _TaskRunner(), pool, learner, layout)


@flow(name="marl", validate_parameters=False, persist_result=False)
def marl_flow(
    config: dict,
    on_round: RoundCallback | None = None,
    resume_run_id: str | None = None,
    progress: ProgressView | None = None,
) -> int:
    """The whole run; returns the number of rounds the run has completed. Its training steps are
    shown in `progress` while it works; without one, as plain lines in the flow run's log."""
    from flows.tracking.marl_tracker import MARLTracker, load_marl_checkpoint

    config = MARLConfig(**config) if isinstance(config, dict) else config
    checkpoint = load_marl_checkpoint(config.tracking_uri, resume_run_id) if resume_run_id else None
    first = checkpoint.round + 1 if checkpoint else 0
    env_steps = checkpoint.env_steps if checkpoint else 0
    with contextlib.ExitStack() as stack:
        stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        pool = WorkerPool(training.pool_config(config), on_ray=True)
        stack.callback(pool.close)
        stack.enter_context(pool.tracking(training.training_work(config, first)))
        stack.enter_context(watching(pool.progress, progress or PlainLines(get_run_logger().info, plain_interval())))
        state = checkpoint.state if checkpoint else None
        if asynchronous(config) is not None:
            learner = RayAsyncLearners(config, state, pool)
            stack.callback(learner.close)
            take_checkpoint = learner.checkpoint
        else:
            actor = ray.remote(num_cpus=0)(LearnerActor).remote(config, state)
            learner = RayLearner(actor)
            take_checkpoint = lambda: ray.get(actor.checkpoint.remote())  # noqa: E731
        layout, _ = training.layout_and_spec(config)
        tracker = stack.enter_context(MARLTracker(config, checkpoint))
        for round in range(first, config.rounds):
            record = marl_round(config, round, env_steps, pool, learner, layout)
            env_steps = record.env_steps
            tracker.log_round(record)
            if training.checkpoint_due(config, round):
                state, weights = take_checkpoint()
                tracker.commit(round, env_steps, state, weights)
            if on_round:
                on_round(record)
        tracker.finish()
    return config.rounds


def run_marl(
    config: MARLConfig,
    on_round: RoundCallback | None = None,
    resume_run_id: str | None = None,
    services: StartingServices | None = None,
    progress: ProgressView | None = None,
) -> int:
    """Start what the run needs (a Prefect server, Ray, the MLflow store), run the flow, stop all.
    ``services`` and ``progress`` as for `flows.psro_flow.run_psro`."""
    with run_services(config.ray_address, config.num_cpus, config.env, config.tracking_uri, services):
        return marl_flow(config, on_round, resume_run_id, progress)
