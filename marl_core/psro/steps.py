"""PSRO as plain functions over a small state, with no orchestration in sight.

One iteration is three named steps, as in OpenSpiel's abstract meta-trainer:

1. ``best_response``: each player's oracle answers the opponents' current meta-strategy mixture;
2. ``expand_population``, then ``plan_evaluation`` and ``evaluate_payoffs``: the answers join
   the populations and only the new profiles of the payoff table are evaluated;
3. ``solve_meta_game``: the new entries are recorded and the meta-solver turns the table into
   new meta-strategies.

``measure`` then reports NashConv/exploitability of the mixture the meta-strategies define.
``run_psro_local`` chains the steps in one process; ``flows/`` runs the same steps as Prefect
tasks on Ray.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, Iterator

import numpy as np

from marl_core.psro.config import PSROConfig
from marl_core.empirical_game.evaluation import EVALUATORS, ProfilePayoffs
from marl_core.games.exploitability import NashConvReport, nash_conv
from marl_core.games.tree import GameTree, build_tree
from marl_core.games.openspiel import load_game
from marl_core.empirical_game.meta_solvers import get_meta_solver
from marl_core.psro.oracles import BestResponse, OracleCall, get_oracle
from marl_core.empirical_game.payoffs import PayoffTable
from marl_core.policies.tabular import append_members, uniform_population


@dataclasses.dataclass
class PSROState:
    populations: list[np.ndarray]  # per player [K_p, I_p, A]
    payoffs: PayoffTable
    meta_strategy: list[np.ndarray]  # per player [K_p]
    iteration: int = 0
    # per player, per member: a learned member's network weights (None for tabular-only members)
    weights: list[list] = dataclasses.field(default_factory=list)

    @property
    def population_sizes(self) -> list[int]:
        return [len(p) for p in self.populations]


class StageClock:
    """Wall seconds per named stage of one iteration, each stage timed from the previous one."""

    def __init__(self):
        self.began = self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage], self._last = now - self._last, now


@dataclasses.dataclass(frozen=True)
class IterationRecord:
    """What one iteration produced, for progress lines, MLflow metrics and benchmarks."""

    iteration: int
    population_sizes: list[int]
    report: NashConvReport
    meta_strategy: list[list[float]]
    stage_seconds: dict[str, float]
    iteration_seconds: float
    elapsed_seconds: float  # since the run started, orchestration included
    oracle_metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # "player_p/name"

    @classmethod
    def finish(
        cls, state: "PSROState", report: NashConvReport, clock: StageClock, run_started: float,
        responses: list[BestResponse] = (),
    ) -> "IterationRecord":
        now = time.perf_counter()
        return cls(
            iteration=state.iteration,
            population_sizes=state.population_sizes,
            report=report,
            meta_strategy=[m.tolist() for m in state.meta_strategy],
            stage_seconds=clock.seconds,
            iteration_seconds=now - clock.began,
            elapsed_seconds=now - run_started,
            oracle_metrics={f"player_{r.player}/oracle_{k}": v for r in responses for k, v in r.metrics.items()},
        )

    def metrics(self) -> dict[str, float]:
        metrics = {
            "exploitability": self.report.exploitability,
            "nash_conv": self.report.nash_conv,
            "iteration_seconds": self.iteration_seconds,
            "elapsed_seconds": self.elapsed_seconds,
        }
        for player, gain in enumerate(self.report.best_response_gains):
            metrics[f"player_{player}/best_response_gain"] = gain
            metrics[f"player_{player}/population_size"] = self.population_sizes[player]
            metrics[f"player_{player}/meta_entropy"] = meta_entropy(self.meta_strategy[player])
        for stage, seconds in self.stage_seconds.items():
            metrics[f"seconds/{stage}"] = seconds
        metrics.update(self.oracle_metrics)
        return metrics


def meta_entropy(weights) -> float:
    w = np.asarray(weights, dtype=np.float64)
    w = w[w > 0]
    return float(-(w * np.log(w)).sum())


# --- the steps -------------------------------------------------------------------------------


def initial_populations(tree: GameTree) -> list[np.ndarray]:
    return [uniform_population(player_tree) for player_tree in tree.players]


def best_response(config: PSROConfig, player: int, populations, meta_strategy, iteration: int, pool=None) -> BestResponse:
    call = OracleCall(config, build_tree(config.game), player, populations, meta_strategy, iteration, pool)
    return get_oracle(config.oracle).compute(call)


def expand_population(populations, responses: list[BestResponse]) -> list[np.ndarray]:
    by_player = {r.player: r.policy for r in responses}
    return [append_members(pop, [by_player[p]]) if p in by_player else pop for p, pop in enumerate(populations)]


def expand_weights(weights: list[list], responses: list[BestResponse]) -> list[list]:
    by_player = {r.player: r.weights for r in responses}
    return [members + [by_player.get(p)] for p, members in enumerate(weights)]


def initial_state(tree: GameTree) -> PSROState:
    populations = initial_populations(tree)
    return PSROState(populations, PayoffTable(tree.num_players), meta_strategy=[], weights=[[None] for _ in populations])


def resumed_state(checkpoint) -> PSROState:
    """The state a committed iteration left (see `flows.tracking.resume`); earlier members' networks
    stay in the registry, so only members added from here on carry weights."""
    return PSROState(
        populations=checkpoint.populations,
        payoffs=checkpoint.payoffs,
        meta_strategy=checkpoint.meta_strategy,
        iteration=checkpoint.iteration,
        weights=[[None] * len(population) for population in checkpoint.populations],
    )


def rollout_pool_config(config: PSROConfig):
    """What the rollout workers of a learned oracle need, or None for oracles that do not learn."""
    if not get_oracle(config.oracle).learns:
        return None
    from marl_core.rollout.pool import PoolConfig

    rollout = config.rollout
    env = functools.partial(psro_env, config.game)
    return PoolConfig(env, rollout.workers, rollout.envs_per_worker, rollout.worker_cpus)


def psro_env(game: str):
    """The game as rollouts play it: the same (turn-based) game the tree and tables are built on."""
    from marl_core.envs import OpenSpielEnv

    return OpenSpielEnv(load_game(game))


def evaluate_payoffs(config: PSROConfig, populations, profiles) -> ProfilePayoffs:
    tree = build_tree(config.game)
    evaluate = EVALUATORS[config.eval]
    return evaluate(tree, populations, profiles, episodes=config.episodes, seed=config.seed)


@dataclasses.dataclass
class MetaGame:
    """The empirical game after an iteration: its payoff table and the solved meta-strategies."""

    payoffs: PayoffTable
    meta_strategy: list[np.ndarray]


def solve_meta_game(config: PSROConfig, payoffs: PayoffTable, chunks, evaluations: list[ProfilePayoffs]) -> MetaGame:
    """Record the newly evaluated profiles in a copy of the table, then solve the grown game."""
    payoffs = payoffs.copy()  # never mutate an input: under Ray it is a read-only shared view
    for profiles, evaluation in zip(chunks, evaluations):
        payoffs.record(profiles, evaluation.mean, evaluation.stderr, evaluation.episodes)
    if not payoffs.complete:
        raise RuntimeError(f"payoff table {payoffs.sizes} still has unevaluated profiles")
    return MetaGame(payoffs, get_meta_solver(config.meta_solver).solve(payoffs.mean))


def measure(config: PSROConfig, populations, meta_game: MetaGame) -> NashConvReport:
    return nash_conv(build_tree(config.game), populations, meta_game.meta_strategy)


def plan_evaluation(payoffs: PayoffTable, population_sizes, parts: int) -> list[list]:
    """Grow the table to the new population sizes; split its missing profiles into chunks."""
    payoffs.grow(tuple(population_sizes))
    profiles = payoffs.missing_profiles()
    parts = max(1, min(parts, len(profiles)))
    return [chunk.tolist() for chunk in np.array_split(np.asarray(profiles), parts) if len(chunk)]


# --- one process, no orchestration -----------------------------------------------------------


def should_stop(config: PSROConfig, record: IterationRecord) -> bool:
    return config.stop_exploitability is not None and record.report.exploitability <= config.stop_exploitability


def run_psro_local(config: PSROConfig, on_iteration: Callable[[IterationRecord, PSROState], None] | None = None) -> PSROState:
    """Run every step in this process; the reference for what the Prefect flow computes."""
    for record, state in iterate_psro_local(config):
        if on_iteration:
            on_iteration(record, state)
    return state


def iterate_psro_local(config: PSROConfig) -> Iterator[tuple[IterationRecord, PSROState]]:
    from marl_core.rollout.pool import LocalWorkerPool

    start = time.perf_counter()
    tree = build_tree(config.game)
    state = initial_state(tree)
    pool_config = rollout_pool_config(config)
    pool = LocalWorkerPool(pool_config) if pool_config else None
    for iteration in range(config.iterations + 1):
        clock = StageClock()
        responses = []
        if iteration > 0:
            responses = [
                best_response(config, p, state.populations, state.meta_strategy, iteration, pool)
                for p in range(tree.num_players)
            ]
            state.populations = expand_population(state.populations, responses)
            state.weights = expand_weights(state.weights, responses)
            clock.lap("best_response")
        chunks = plan_evaluation(state.payoffs, state.population_sizes, parts=1)
        evaluations = [evaluate_payoffs(config, state.populations, chunk) for chunk in chunks]
        clock.lap("evaluate")
        meta_game = solve_meta_game(config, state.payoffs, chunks, evaluations)
        state.payoffs, state.meta_strategy = meta_game.payoffs, meta_game.meta_strategy
        clock.lap("meta_solve")
        report = measure(config, state.populations, meta_game)
        clock.lap("exploitability")
        state.iteration = iteration
        record = IterationRecord.finish(state, report, clock, start, responses)
        yield record, state
        if should_stop(config, record):
            return
