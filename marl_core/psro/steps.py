"""PSRO as plain functions over a small state, and one iteration that wires them together.

One iteration is three named steps, as in OpenSpiel's abstract meta-trainer:

1. ``best_response``: each role's oracle answers the other roles' current meta-strategy mixture;
   a learned oracle's learner (``train-best-response``) plays its rounds on the rollout workers;
2. ``evaluate_payoffs``: the answers join their populations (``expand_population``) and only the
   new profiles of the payoff table are evaluated;
3. ``solve_meta_game``: the new entries are recorded and the meta-solver turns the table into
   new meta-strategies.

Then the mixture is measured: exact NashConv where the game tree fits (``measure``), and, every
few iterations, approximate NashConv from freshly learned best responses
(``approximate_best_response``), each under its own name.

``run_iteration`` is the only place the steps are wired together. It hands each step to a
`Runner` (`marl_core.runner`): `LocalRunner` calls it in this process (``iterate_psro_local``),
a step submitted beside another in a thread while that one runs; the Prefect flow's runner
submits it as a task on Ray (``flows/runtime/task_steps.py``). Both therefore compute the same
thing by construction, and ``tests/test_flow_matches_local.py`` checks it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator

import numpy as np

from marl_core.empirical_game.evaluation import EVALUATORS, ProfilePayoffs
from marl_core.empirical_game.game import psro_game_of
from marl_core.empirical_game.meta_solvers import get_meta_solver
from marl_core.empirical_game.payoffs import PayoffTable
from marl_core.games.exploitability import NashConvReport, nash_conv
from marl_core.games.tree import build_tree
from marl_core.policies.base import UniformPolicy
from marl_core.policies.population import Population, stacked_tables
from marl_core.policies.tabular import TabularPolicy
from marl_core.policies.tabularize import tabular_forms
from marl_core.psro.config import PSROConfig
from marl_core.psro.oracles import BestResponse, OracleCall, get_oracle
from marl_core.rollout.progress import Work
from marl_core.runner import LocalRunner, Runner


@dataclasses.dataclass
class PSROState:
    populations: list[Population]  # one per role, in the game's role order
    payoffs: PayoffTable
    meta_strategy: list[np.ndarray]  # per role [K_r]
    iteration: int = 0

    @property
    def population_sizes(self) -> list[int]:
        return [len(p) for p in self.populations]

    def tables(self) -> list[np.ndarray]:
        """Every population's stacked tables [K, I, A] (games with a tree, tabular members)."""
        return stacked_tables(self.populations)


@dataclasses.dataclass(frozen=True)
class ApproxNashConv:
    """NashConv estimated with learned best responses: per role, the response's sampled value
    against the others' mixture minus the mixture's value (from the payoff table), with
    standard errors. A response that falls short of a true best response makes this an
    underestimate; where a tree exists the shortfall is reported as `gap_to_exact`."""

    nash_conv: float
    nash_conv_stderr: float
    exploitability: float
    exploitability_stderr: float
    gains: list[float]
    gains_stderr: list[float]
    gap_to_exact: list[float] | None = None  # per role, exact best-response value minus the learned one's


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
    report: NashConvReport | None  # exact, where the game tree fits
    meta_strategy: list[list[float]]
    stage_seconds: dict[str, float]
    iteration_seconds: float
    elapsed_seconds: float  # since the run started, orchestration included
    oracle_metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # "<role>/oracle_<name>"
    approx: ApproxNashConv | None = None
    roles: tuple[str, ...] = ()

    @property
    def exploitability(self) -> float:
        """The exact exploitability where there is one, else the approximate one."""
        return (
            self.report.exploitability if self.report else self.approx.exploitability if self.approx else float("nan")
        )

    def summary(self) -> str:
        """The iteration's measurements on one line, each under its own name."""
        parts = []
        if self.report:
            parts.append(f"exploitability {self.report.exploitability:9.6f}  nash_conv {self.report.nash_conv:9.6f}")
        if self.approx:
            parts.append(
                f"approx_exploitability {self.approx.exploitability:8.4f} ± {self.approx.exploitability_stderr:.4f}"
            )
        return "  ".join(parts) or "exploitability not measured this iteration"

    def metrics(self) -> dict[str, float]:
        metrics = {"iteration_seconds": self.iteration_seconds, "elapsed_seconds": self.elapsed_seconds}
        if self.report:
            metrics.update(exploitability=self.report.exploitability, nash_conv=self.report.nash_conv)
        if self.approx:
            a = self.approx
            metrics.update(
                approx_nash_conv=a.nash_conv,
                approx_nash_conv_stderr=a.nash_conv_stderr,
                approx_exploitability=a.exploitability,
                approx_exploitability_stderr=a.exploitability_stderr,
            )
        for r, role in enumerate(self.roles):
            if self.report:
                metrics[f"{role}/best_response_gain"] = self.report.best_response_gains[r]
            if self.approx:
                metrics[f"{role}/approx_best_response_gain"] = self.approx.gains[r]
                if self.approx.gap_to_exact is not None:
                    metrics[f"{role}/approx_best_response_gap_to_exact"] = self.approx.gap_to_exact[r]
            metrics[f"{role}/population_size"] = self.population_sizes[r]
            metrics[f"{role}/meta_entropy"] = meta_entropy(self.meta_strategy[r])
        for stage, seconds in self.stage_seconds.items():
            metrics[f"seconds/{stage}"] = seconds
        metrics.update(self.oracle_metrics)
        return metrics


def meta_entropy(weights) -> float:
    w = np.asarray(weights, dtype=np.float64)
    w = w[w > 0]
    return float(-(w * np.log(w)).sum())


# --- the steps -------------------------------------------------------------------------------


def initial_populations(config: PSROConfig) -> list[Population]:
    """One member per role that plays uniformly over legal actions (a table where a tree exists)."""
    game = psro_game_of(config)
    if game.has_tree:
        tree = build_tree(config.game)
        return [
            Population.of(role, [TabularPolicy(config.game, r, tree.players[r].uniform_policy())])
            for r, role in enumerate(game.roles)
        ]
    return [Population.of(role, [UniformPolicy()]) for role in game.roles]


def initial_state(config: PSROConfig) -> PSROState:
    populations = initial_populations(config)
    return PSROState(populations, PayoffTable(len(populations)), meta_strategy=[])


def best_response(config: PSROConfig, role: int, populations, meta_strategy, iteration: int, pool=None) -> BestResponse:
    call = OracleCall(
        config,
        role,
        populations,
        meta_strategy,
        iteration,
        pool,
        opponent_epsilon=config.best_response.opponent_epsilon,
    )
    return get_oracle(config.oracle).compute(call)


def expand_population(populations: list[Population], responses: list[BestResponse]) -> list[Population]:
    by_role = {r.role: r.policy for r in responses}
    return [population.added(by_role[r]) if r in by_role else population for r, population in enumerate(populations)]


def evaluate_payoffs(
    config: PSROConfig, populations: list[Population], profiles, pool=None, progress: str | None = None
) -> ProfilePayoffs:
    """`exact` over the game tree; `sampled` by episodes on the rollout workers (the run's `pool`,
    else one in this process), on any environment. `progress`: the open work (`evaluation_work`)
    that the episodes count towards."""
    evaluate = EVALUATORS[config.eval]
    return evaluate(
        psro_game_of(config),
        populations,
        profiles,
        episodes=config.episodes,
        seed=config.seed,
        pool=pool,
        progress=progress,
    )


def evaluation_work(config: PSROConfig, iteration: int, chunks: list[list]) -> Work | None:
    """An iteration's sampled payoff evaluation as progress (its episodes over every new profile);
    None where payoffs are computed exactly, which takes no time worth showing."""
    if config.eval != "sampled":
        return None
    profiles = sum(len(chunk) for chunk in chunks)
    return Work(
        f"evaluation/{iteration}", f"payoff evaluation (iteration {iteration})", profiles * config.episodes, "episodes"
    )


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


def measure(config: PSROConfig, populations: list[Population], meta_game: MetaGame) -> NashConvReport | None:
    """Exact NashConv of the mixture wherever the game tree fits (networks are asked at every
    information state if their members carry no table); None elsewhere."""
    if not psro_game_of(config).has_tree:
        return None
    tree = build_tree(config.game)
    return nash_conv(tree, tabular_forms(populations, tree), meta_game.meta_strategy)


@dataclasses.dataclass(frozen=True)
class ApproxResponse:
    """One role's learned deviation for approximate NashConv: its sampled value against the
    mixture, and where a tree exists its exact shortfall from a true best response."""

    role: int
    value: float
    stderr: float
    gap_to_exact: float | None
    metrics: dict[str, float]


def approximate_best_response(
    config: PSROConfig, role: int, populations, meta_game: MetaGame, iteration: int, pool=None
) -> ApproxResponse:
    """Train a fresh response with the run's oracle and its own budget, then estimate its value."""
    from marl_core.psro.learned_oracle import estimate_value

    settings = config.approx_exploitability
    from marl_core.rollout.pool import pool_or_local

    with pool_or_local(pool, psro_game_of(config).make_env, config.rollout.envs_per_worker) as workers:
        call = OracleCall(
            config,
            role,
            populations,
            meta_game.meta_strategy,
            iteration,
            workers,
            budget=settings.episodes,
            seed_key=(1,),
            purpose="approximate-exploitability response",
        )
        response = get_oracle(config.oracle).compute(call)
        value, stderr = estimate_value(
            workers,
            psro_game_of(config),
            role,
            response.policy,
            populations,
            meta_game.meta_strategy,
            episodes=settings.eval_episodes,
            seed=(config.seed, iteration, role, 2),
        )
    return ApproxResponse(role, value, stderr, response.metrics.get("gap_to_exact"), response.metrics)


def approx_nash_conv(payoffs: PayoffTable, meta_strategy, responses: list[ApproxResponse]) -> ApproxNashConv:
    """Combine the roles' responses with the mixture's values from the payoff table."""
    mixture, mixture_stderr = payoffs.mixture_value(meta_strategy)
    gains = [r.value - mixture[r.role] for r in responses]
    gain_stderr = [float(np.hypot(r.stderr, mixture_stderr[r.role])) for r in responses]
    total, total_stderr = float(sum(gains)), float(np.sqrt(np.sum(np.square(gain_stderr))))
    n = len(responses)
    gaps = [r.gap_to_exact for r in responses]
    return ApproxNashConv(
        nash_conv=total,
        nash_conv_stderr=total_stderr,
        exploitability=total / n,
        exploitability_stderr=total_stderr / n,
        gains=gains,
        gains_stderr=gain_stderr,
        gap_to_exact=None if None in gaps else gaps,
    )


def plan_evaluation(payoffs: PayoffTable, population_sizes, parts: int) -> list[list]:
    """Grow the table to the new population sizes; split its missing profiles into chunks."""
    payoffs.grow(tuple(population_sizes))
    profiles = payoffs.missing_profiles()
    parts = max(1, min(parts, len(profiles)))
    return [chunk.tolist() for chunk in np.array_split(np.asarray(profiles), parts) if len(chunk)]


def approximation_due(config: PSROConfig, iteration: int) -> bool:
    every = config.approx_exploitability.every
    return every > 0 and (iteration % every == 0 or iteration == config.iterations)


def should_stop(config: PSROConfig, record: IterationRecord) -> bool:
    return config.stop_exploitability is not None and record.exploitability <= config.stop_exploitability


def rollout_pool_config(config: PSROConfig):
    """What the rollout workers need, or None where no step uses them (exact oracle and eval)."""
    if not get_oracle(config.oracle).learns and config.eval == "exact":
        return None
    from marl_core.rollout.pool import PoolConfig

    rollout = config.rollout
    return PoolConfig(psro_game_of(config).make_env, rollout.workers, rollout.envs_per_worker, rollout.worker_cpus)


# --- one iteration, wired once ---------------------------------------------------------------


def _evaluate_new_profiles(config, populations, responses, profiles, pool=None, progress=None) -> ProfilePayoffs:
    """`responses` join `populations` in the step that first needs them: a step of its own would
    add a round trip to every iteration for a concatenation."""
    return evaluate_payoffs(config, expand_population(populations, responses), profiles, pool, progress)


def _measure_exactly(config, populations, responses, meta_game) -> NashConvReport | None:
    return measure(config, expand_population(populations, responses), meta_game)


def _approximate(config, role, populations, responses, meta_game, iteration, pool=None) -> ApproxResponse:
    return approximate_best_response(
        config, role, expand_population(populations, responses), meta_game, iteration, pool
    )


STEPS: dict[str, Callable] = {
    "train-best-response": best_response,
    "evaluate-payoffs": _evaluate_new_profiles,
    "solve-meta-game": solve_meta_game,
    "measure-exploitability": _measure_exactly,
    "approximate-best-response": _approximate,
}


def run_iteration(
    config: PSROConfig,
    previous: PSROState,
    iteration: int,
    runner: Runner,
    pool=None,
    run_started: float = 0.0,
    given: list[BestResponse] | None = None,
) -> tuple[IterationRecord, PSROState]:
    """Every step of one iteration, submitted at once, then collected in order; iteration 0 only
    evaluates the first populations. `given`: the iteration's best responses, learned elsewhere
    (Pipeline PSRO's frozen level), instead of the oracle's. Returns the record and the new
    state; `previous` is left as it was."""
    clock = StageClock()
    game = psro_game_of(config)
    state = dataclasses.replace(previous, payoffs=previous.payoffs.copy())
    sizes = [size + (iteration > 0) for size in state.population_sizes]
    populations = runner.share(state.populations)
    responses = []
    with contextlib.ExitStack() as shown:  # long work in progress, from the moment it is asked for
        if given is not None:
            responses = runner.share(given)
        elif iteration > 0 and pool is not None and get_oracle(config.oracle).learns:
            shown.enter_context(_responses_shown(config, state, iteration, pool))
        if iteration > 0 and given is None:
            meta_strategy = runner.share(state.meta_strategy)
            responses = [
                runner.submit("train-best-response", config, r, populations, meta_strategy, iteration, pool)
                for r in range(game.num_roles)
            ]
        chunks = plan_evaluation(state.payoffs, sizes, 1 if config.eval == "exact" else runner.parallelism())
        progress = None
        if pool is not None and (evaluating := evaluation_work(config, iteration, chunks)) is not None:
            progress = shown.enter_context(pool.tracking(evaluating)).id
        evaluations = [
            runner.submit("evaluate-payoffs", config, populations, responses, chunk, pool, progress) for chunk in chunks
        ]
        meta_game = runner.submit("solve-meta-game", config, runner.share(state.payoffs), chunks, evaluations)
        report = runner.submit("measure-exploitability", config, populations, responses, meta_game)
        approx = []
        if approximation_due(config, iteration):
            approx = [
                runner.submit(
                    "approximate-best-response", config, r, populations, responses, meta_game, iteration, pool
                )
                for r in range(game.num_roles)
            ]
        if iteration > 0:
            responses = given if given is not None else [runner.result(response) for response in responses]
            state.populations = expand_population(state.populations, responses)
            clock.lap("best_response")
        for evaluation in evaluations:
            runner.result(evaluation)
        clock.lap("evaluate")
    solved = runner.result(meta_game)
    state.payoffs, state.meta_strategy = solved.payoffs, solved.meta_strategy
    clock.lap("meta_solve")
    report = runner.result(report)
    clock.lap("exploitability")
    approximate = None
    if approx:
        approximate = approx_nash_conv(state.payoffs, state.meta_strategy, [runner.result(a) for a in approx])
        clock.lap("approx_exploitability")
    state.iteration = iteration
    now = time.perf_counter()
    record = IterationRecord(
        iteration=iteration,
        population_sizes=state.population_sizes,
        report=report,
        meta_strategy=[m.tolist() for m in state.meta_strategy],
        stage_seconds=clock.seconds,
        iteration_seconds=now - clock.began,
        elapsed_seconds=now - run_started,
        oracle_metrics={f"{game.roles[r.role]}/oracle_{k}": v for r in responses for k, v in r.metrics.items()},
        approx=approximate,
        roles=game.roles,
    )
    return record, state


@contextlib.contextmanager
def _responses_shown(config: PSROConfig, state: PSROState, iteration: int, pool) -> Iterator[None]:
    """Each role's learned response open in the pool's progress while the block runs: its steps
    may wait a while for a process and their imports before the learner opens it itself."""
    from marl_core.psro.learned_oracle import Rounds

    with contextlib.ExitStack() as opened:
        for role in range(psro_game_of(config).num_roles):
            call = OracleCall(config, role, state.populations, state.meta_strategy, iteration)
            opened.enter_context(pool.tracking(Rounds.of(call).work))
        yield


# --- one process, no orchestration -----------------------------------------------------------


def run_psro_local(
    config: PSROConfig, on_iteration: Callable[[IterationRecord, PSROState], None] | None = None
) -> PSROState:
    """Run every step in this process; the reference for what the Prefect flow computes."""
    for record, state in iterate_psro_local(config):
        if on_iteration:
            on_iteration(record, state)
    return state


def iterate_psro_local(config: PSROConfig) -> Iterator[tuple[IterationRecord, PSROState]]:
    from marl_core.rollout.pool import WorkerPool

    started = time.perf_counter()
    state = initial_state(config)
    pool_config = rollout_pool_config(config)
    pool = WorkerPool(pool_config) if pool_config else None
    runner = LocalRunner(STEPS)
    for iteration in range(config.iterations + 1):
        record, state = run_iteration(config, state, iteration, runner, pool, started)
        yield record, state
        if should_stop(config, record):
            return


def resumed_state(checkpoint) -> PSROState:
    """The state a committed iteration left (see `flows.tracking.resume`)."""
    return PSROState(checkpoint.populations, checkpoint.payoffs, checkpoint.meta_strategy, checkpoint.iteration)
