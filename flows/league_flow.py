"""League training as Prefect flows: a `league` flow that runs one `league-generation` subflow
per generation.

A generation is `marl_core.league.generation.run_generation`, the function the in-process loop
runs: every learning player's roles train at once as `train-player` tasks, each served by a
`collect-experience` task driving the run's rollout workers (Ray actors that live for the whole
run), then the driver updates the league and `measure-players` measures the main agents. After
each generation the tracker commits it to MLflow (`flows.tracking.league_tracker`); a killed run
resumes from its last committed generation (`psro league resume RUN_ID`) and, because a
generation is defined by the state it starts from, ends with the league it would have had.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable

from prefect import flow, get_run_logger
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows.patches import fresh_every_call
from flows.progress import PlainLines, ProgressView, plain_interval, watching
from flows.psro_flow import RayTaskSteps
from flows.ray_runner import FastRayTaskRunner
from flows.runtime import StartingServices, run_services
from marl_core.league import generation as league
from marl_core.league.config import LeagueConfig
from marl_core.league.generation import GenerationRecord, LeagueState

GenerationCallback = Callable[[GenerationRecord, LeagueState], None]

# A generation's starting state, by key: Prefect records a subflow's parameters on its server,
# and a league's trainer states (replay buffers included) are no parameters to send there.
_STARTING: dict[str, LeagueState] = {}


@fresh_every_call
@flow(name="league-generation", task_runner=FastRayTaskRunner(), validate_parameters=False, persist_result=False)
def league_generation(config: LeagueConfig, generation: int, state_key: str, pool, run_started: float):
    from tasks.league_tasks import TASKS

    state = _STARTING.pop(state_key)
    return league.run_generation(config, state, generation, RayTaskSteps(TASKS), pool, run_started)


@flow(name="league", validate_parameters=False, persist_result=False)
def league_flow(
    config: dict,
    on_generation: GenerationCallback | None = None,
    resume_run_id: str | None = None,
    progress: ProgressView | None = None,
) -> LeagueState:
    """The whole run; returns the final league. The learners' progress is shown in `progress`;
    without one, as plain lines in the flow run's log."""
    from flows.preflight import preflight
    from flows.tracking.league_tracker import LeagueTracker, committed_league, load_league_state
    from marl_core.psro.steps import rollout_pool_config
    from marl_core.rollout.pool import WorkerPool

    config = LeagueConfig(**config) if isinstance(config, dict) else config
    preflight(config)  # deployments start here, not at the CLI: same checks before any work
    started = time.perf_counter()
    checkpoint = committed_league(config.tracking_uri, resume_run_id) if resume_run_id else None
    state = load_league_state(config, checkpoint) if checkpoint else league.initial_state(config)
    with contextlib.ExitStack() as stack:
        stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        pool = WorkerPool(rollout_pool_config(config.oracle_config()), on_ray=True)
        stack.callback(pool.close)
        stack.enter_context(watching(pool.progress, progress or PlainLines(get_run_logger().info, plain_interval())))
        tracker = stack.enter_context(LeagueTracker(config, checkpoint))
        if checkpoint is None:
            tracker.commit_seed(state)
        for generation in range(state.generation + 1, config.generations + 1):
            key = uuid.uuid4().hex
            _STARTING[key] = state
            record, state = league_generation(config, generation, key, pool, started)
            tracker.log_generation(record, state)
            if on_generation:
                on_generation(record, state)
        tracker.finish(state)
    if config.export:
        league.write_main_agent_export(config.export, config, state, time.perf_counter() - started)
    return state


def run_league(
    config: LeagueConfig,
    on_generation: GenerationCallback | None = None,
    resume_run_id: str | None = None,
    services: StartingServices | None = None,
    progress: ProgressView | None = None,
) -> LeagueState:
    """Start what the run needs (a Prefect server, Ray, the MLflow store), run the flow, stop all.
    ``services`` and ``progress`` as for `flows.psro_flow.run_psro`."""
    with run_services(config.ray_address, config.num_cpus, config.game, config.tracking_uri, services):
        return league_flow(config, on_generation, resume_run_id, progress)
