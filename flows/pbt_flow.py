"""Population-based training as Prefect flows: a `pbt` flow that runs one `pbt-round` subflow
per round.

A round is every member's `marl_core.marl.rounds.run_round` at once, each on its own rollout
workers and learner actor, its steps Prefect tasks on Ray as in a `marl` run
(`flows/marl_flow.py`). Between rounds the driver takes PBT's step (`marl_core.pbt.marl.perturb`):
at a perturbation point each bottom member's learner actor rebuilds its learner with its new
settings and loads the top member's whole training state, passed from actor to actor inside Ray
(it never comes through this process), keeping its own optimizer hyperparameters.

Every `checkpoint_every` rounds every member's training state, the PBT state (settings, lineage,
the generator) and each member's policies go to MLflow, then the commit tag
(`flows.tracking.pbt_tracker`). A killed run resumes from its last committed round (`psro pbt
resume RUN_ID`) with the settings, lineage and generator it committed; as in a `marl` run, the
workers' episodes start afresh there instead of running on from the killed run's.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import ray
from prefect import flow, get_run_logger
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows.marl_flow import _TaskRunner
from flows.patches import fresh_every_call
from flows.progress import PlainLines, ProgressView, plain_interval, watching
from flows.ray_runner import FastRayTaskRunner
from flows.runtime import StartingServices, finish_before_prefect_stops, run_services
from marl_core.marl import training
from marl_core.marl.training import LearnerActor, RayLearner
from marl_core.pbt.marl import PBTConfig, PBTRound, PBTState, perturb, run_pbt_round
from marl_core.rollout.pool import WorkerPool

RoundCallback = Callable[[PBTRound], None]


def _at_once(function, members):
    """`map` over the members on threads, each in a copy of this context (the subflow's run
    context, so every thread's tasks belong to it).

    When one member fails or the run is interrupted, the others are not waited for (a round can
    take minutes): stopping Ray ends their work, and the run's exit waits for their threads to
    record that (`finish_before_prefect_stops`)."""
    members = list(members)
    threads = ThreadPoolExecutor(max_workers=len(members), thread_name_prefix="pbt-member")
    futures = [threads.submit(contextvars.copy_context().run, function, m) for m in members]
    try:
        return [f.result() for f in futures]
    except BaseException:
        finish_before_prefect_stops(*futures)
        raise
    finally:
        threads.shutdown(wait=False)


@fresh_every_call
@flow(name="pbt-round", task_runner=FastRayTaskRunner(), validate_parameters=False, persist_result=False)
def pbt_round(config: PBTConfig, state: PBTState, pools, learners, layout) -> list:
    return run_pbt_round(config, state, _TaskRunner(), pools, learners, layout, concurrently=_at_once)


@flow(name="pbt", validate_parameters=False, persist_result=False)
def pbt_flow(
    config: dict,
    on_round: RoundCallback | None = None,
    resume_run_id: str | None = None,
    progress: ProgressView | None = None,
) -> PBTState:
    """The whole run; returns where it ended. Each member's training steps are shown in
    `progress`; without one, as plain lines in the flow run's log."""
    from flows.tracking.pbt_tracker import PBTTracker, load_pbt_checkpoint

    config = PBTConfig(**config) if isinstance(config, dict) else config
    checkpoint = load_pbt_checkpoint(config.marl.tracking_uri, resume_run_id) if resume_run_id else None
    state = checkpoint.state if checkpoint else PBTState.initial(config)
    with contextlib.ExitStack() as stack:
        stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        pools = []
        for i in range(config.population):
            member = state.member_config(config, i)
            pool = WorkerPool(training.pool_config(member), on_ray=True)
            stack.callback(pool.close)
            work = training.training_work(member, state.round)
            stack.enter_context(pool.tracking(dataclasses.replace(work, label=f"member {i}: {work.label}")))
            pools.append(pool)
        read = lambda: [row for pool in pools for row in pool.progress()]  # noqa: E731
        stack.enter_context(watching(read, progress or PlainLines(get_run_logger().info, plain_interval())))
        actors = [
            ray.remote(num_cpus=0)(LearnerActor).remote(
                state.member_config(config, i), checkpoint.learners[i] if checkpoint else None
            )
            for i in range(config.population)
        ]
        layout, _ = training.layout_and_spec(config.marl)
        tracker = stack.enter_context(PBTTracker(config, checkpoint))
        while state.round < config.marl.rounds:
            records = pbt_round(config, state, pools, [RayLearner(a) for a in actors], layout)
            state.advance(records)
            lineage = perturb(config, state, records)
            sources = {e.source: actors[e.source].state.remote() for e in lineage}
            ray.get(
                [
                    actors[e.member].adopt.remote(state.member_config(config, e.member), sources[e.source])
                    for e in lineage
                ]
            )
            record = PBTRound(state.round - 1, records, [dict(h) for h in state.hyperparameters], lineage)
            tracker.log_round(record)
            if training.checkpoint_due(config.marl, state.round - 1):
                tracker.commit(state, ray.get([a.checkpoint.remote() for a in actors]))
            if on_round:
                on_round(record)
        tracker.finish()
    return state


def run_pbt(
    config: PBTConfig,
    on_round: RoundCallback | None = None,
    resume_run_id: str | None = None,
    services: StartingServices | None = None,
    progress: ProgressView | None = None,
) -> PBTState:
    """Start what the run needs (a Prefect server, Ray, the MLflow store), run the flow, stop all.
    ``services`` and ``progress`` as for `flows.psro_flow.run_psro`."""
    marl = config.marl
    with run_services(marl.ray_address, marl.num_cpus, marl.env, marl.tracking_uri, services):
        return pbt_flow(config, on_round, resume_run_id, progress)
