"""PSRO as Prefect flows: a `psro` flow that runs one `psro-iteration` subflow per iteration.

Each iteration's tasks run on Ray through prefect-ray's RayTaskRunner; the best responses of all
players run in parallel, and sampled evaluation fans out over the cores. The driver keeps the
state (populations, payoff table, meta-strategies) and hands MLflow logging to a background
thread so tracking never holds up the next iteration.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Optional

from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from flows.ray_runner import FastRayTaskRunner

import tasks
from flows.runtime import prefect_server, ray_session
from marl_core import psro
from marl_core.config import PSROConfig
from marl_core.game_tree import build_tree
from marl_core.payoffs import PayoffTable
from marl_core.psro import IterationRecord, PSROState

IterationCallback = Callable[[IterationRecord, PSROState], None]


def _timed(stages: dict[str, float], name: str, started: float) -> float:
    now = time.perf_counter()
    stages[name] = now - started
    return now


@flow(name="psro-iteration", task_runner=FastRayTaskRunner(), validate_parameters=False, persist_result=False)
def psro_iteration(config: PSROConfig, iteration: int, state: PSROState, run_started: float) -> IterationRecord:
    """Best responses, then the new payoff entries, then the meta-game; iteration 0 only evaluates."""
    began = t = time.perf_counter()
    stages: dict[str, float] = {}
    if iteration > 0:
        responses = [
            tasks.train_best_response.submit(config, player, state.populations, state.meta_strategy)
            for player in range(len(state.populations))
        ]
        state.populations = tasks.expand_population.submit(state.populations, responses).result()
        t = _timed(stages, "best_response", t)

    table = psro.grown_table(state.payoffs, state.populations)
    profiles = table.missing_profiles()
    parts = 1 if config.eval == "exact" else max(1, int(_cluster_cpus()))
    chunks = psro.split_profiles(profiles, parts)
    evaluations = [tasks.evaluate_payoffs.submit(config, state.populations, chunk) for chunk in chunks]
    for chunk, evaluation in zip(chunks, evaluations):
        psro.record_payoffs(table, chunk, evaluation.result())
    t = _timed(stages, "evaluate", t)

    state.meta_strategy = tasks.solve_meta_game.submit(config, table.mean).result()
    t = _timed(stages, "meta_solve", t)
    report = tasks.measure_exploitability.submit(config, state.populations, state.meta_strategy).result()
    t = _timed(stages, "exploitability", t)
    state.iteration = iteration
    return IterationRecord(
        iteration=iteration,
        population_sizes=state.population_sizes,
        report=report,
        meta_strategy=[m.tolist() for m in state.meta_strategy],
        stage_seconds=stages,
        iteration_seconds=t - began,
        elapsed_seconds=t - run_started,
    )


def _cluster_cpus() -> float:
    import ray

    return ray.cluster_resources().get("CPU", 1)


@flow(name="psro", validate_parameters=False, persist_result=False)
def psro_flow(config: dict, on_iteration: Optional[IterationCallback] = None) -> PSROState:
    """The whole run: the deployable entry point (its parameters are a plain config mapping)."""
    from marl_core.tracking import RunTracker

    config = PSROConfig(**config) if isinstance(config, dict) else config
    run_started = time.perf_counter()
    tree = build_tree(config.game)
    state = PSROState(psro.initial_populations(tree), PayoffTable(tree.num_players), meta_strategy=[])
    with RunTracker(config) as tracker:
        for iteration in range(config.iterations + 1):
            record = psro_iteration(config, iteration, state, run_started)
            tracker.log_iteration(record, state)
            if on_iteration:
                on_iteration(record, state)
            if psro.should_stop(config, record):
                break
        tracker.finish(state)
    return state


def run_psro(config: PSROConfig, on_iteration: Optional[IterationCallback] = None) -> PSROState:
    """Start what the run needs (Prefect server, Ray), run the `psro` flow, stop everything."""
    with contextlib.ExitStack() as stack:
        api_url = stack.enter_context(prefect_server())
        stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        worker_env = {"PREFECT_API_URL": api_url}
        stack.enter_context(ray_session(config.ray_address, config.num_cpus, worker_env))
        return psro_flow(config, on_iteration)
