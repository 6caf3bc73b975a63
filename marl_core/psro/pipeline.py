"""Pipeline PSRO (McAleer et al., NeurIPS 2020): several best responses per role learn at once.

Above the population's fixed members sit `active_levels` levels that are still learning, in the
order they will join. Level j of a role learns a best response to the other roles' mixture over
the fixed members and the levels below j, weighted by the Nash equilibrium (the run's meta-solver)
of that restricted game; the lowest level's restricted game is the fixed population, as in PSRO.

The levels learn in windows of `pipeline.window` episodes, all at once (`Pipeline.train_window`).
Between windows the lower levels' latest weights are taken as members, the restricted games
grow by their payoffs and are solved again, and the lowest level is checked: it is frozen when
every role's training return gained less than `plateau.threshold` over the last window
(`Plateau`), or when its budget (`best_response.episodes`) is spent. Only the lowest level ever freezes, so the
members join in level order. Each freeze is one PSRO iteration: the frozen responses join
their populations, their payoffs are evaluated and the meta-game solved and measured
(`steps.run_iteration` with the responses given), and a new level starts on top.

Every window is defined by the state before it (the levels' weights, the fixed population), so
a run is reproducible however its learners are scheduled. With one active level and no plateau
the one level learns its whole budget, round for round, against the fixed mixture: sequential
PSRO exactly (`tests/test_pipeline.py`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from marl_core.empirical_game.game import psro_game_of
from marl_core.empirical_game.meta_solvers import get_meta_solver
from marl_core.policies.neural import NeuralPolicy
from marl_core.policies.population import Population
from marl_core.psro.config import PSROConfig
from marl_core.psro.learned_oracle import ResponseLearner, Rounds, mixtures
from marl_core.psro.oracle_call import BestResponse, OracleCall
from marl_core.psro.settings import Plateau
from marl_core.rollout.worker import PolicyMixture

if TYPE_CHECKING:
    from marl_core.psro.steps import IterationRecord, PSROState


def plateaued(returns: np.ndarray, rule: Plateau | None, window: int) -> bool:
    """Whether a level whose training returns so far (one per episode, in order) have stopped
    improving: the mean of its last `window` episodes beats the mean of the `window` before by
    less than the rule's threshold. Checked only from `check_from` episodes, frozen only after
    `min_episodes`; no rule never plateaus."""
    if rule is None or len(returns) < max(rule.check_from, rule.min_episodes, 2 * window):
        return False
    gain = returns[-window:].mean() - returns[-2 * window : -window].mean()
    return bool(gain < rule.threshold)


class LevelLearner:
    """One role's response at one level, where it learns: in this process, or as a Ray actor
    (`start_learner`) that keeps its trainer between windows while the driver only sees returns."""

    def __init__(self, call: OracleCall):
        self.restart(call)

    def restart(self, call: OracleCall) -> None:
        """Learn `call`'s response from scratch: a frozen level's learner serves the next level
        (an actor's process, with torch imported, outlives the level it learned for)."""
        self.learner, self.pool = ResponseLearner(call), call.pool

    def train(self, opponents: dict[str, PolicyMixture], rounds: int) -> np.ndarray:
        """Learn `rounds` rounds against `opponents`; the training return of each of their episodes."""
        against = dataclasses.replace(self.learner.rounds, opponents=opponents)
        first = len(self.learner.returns)
        for _ in range(rounds):
            self.learner.play_and_learn(self.pool, against)
        return np.concatenate([np.zeros(0), *self.learner.returns[first:]])

    def member(self, tree_game: str | None) -> NeuralPolicy:
        """The network as it stands, as a member; with its table where `tree_game` names the tree."""
        if tree_game is None:
            return self.learner.member()
        from marl_core.games.tree import build_tree
        from marl_core.policies.tabularize import tabularize

        return self.learner.member(
            tabularize(self.learner.trainer.policy, build_tree(tree_game), self.learner.call.role)
        )

    def response(self, call: OracleCall) -> BestResponse:
        return self.learner.response(call)

    def close(self) -> None:
        self.pool.drop(self.learner.spec.key)


def start_learner(call: OracleCall, on_ray: bool):
    """A level learner in this process, or a Ray actor holding one. The actor reserves no CPU slot:
    every level learns at once however many cores there are (as the rollout workers do)."""
    if not on_ray:
        return LevelLearner(call)
    import ray

    return ray.remote(num_cpus=0)(LevelLearner).remote(call)


def _run_all(calls: list[tuple]) -> list:
    """Call `(learner, method, *args)` for every entry at once; their results in order."""
    if not calls:
        return []
    import ray

    if isinstance(calls[0][0], ray.actor.ActorHandle):
        return ray.get([getattr(learner, method).remote(*args) for learner, method, *args in calls])
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="pipeline-level") as threads:
        futures = [threads.submit(getattr(learner, method), *args) for learner, method, *args in calls]
        return [future.result() for future in futures]


@dataclasses.dataclass
class Level:
    """One level: a response in progress per role, for the iteration it becomes when frozen."""

    iteration: int
    learners: list  # per role, in role order: a `LevelLearner` or its actor
    rounds: int  # its budget in rounds
    returns: list[np.ndarray]  # per role: the training return of each episode so far
    work: list[str]  # per role: its id in the pool's progress
    rounds_learned: int = 0

    @property
    def episodes(self) -> int:
        return len(self.returns[0])

    @property
    def done(self) -> bool:
        return self.rounds_learned >= self.rounds


class Pipeline:
    """The active levels of a run, built on the fixed population `state` (a `PSROState`), their
    rounds played by `pool`. Small and picklable (learners on Ray are actor handles), so a
    flow's task can train it and hand it back."""

    def __init__(self, config: PSROConfig, state, pool, on_ray: bool = False):
        if config.pipeline is None:
            raise ValueError("Pipeline needs a config with a pipeline section")
        self.config, self.pool, self.on_ray = config, pool, on_ray
        self.window_rounds = math.ceil(config.pipeline.window / config.best_response.episodes_per_round)
        self.levels: list[Level] = []
        self.idle: list = []  # learners of frozen levels, for the next levels to reuse
        self.start_levels(state)

    @property
    def game(self):
        return psro_game_of(self.config)

    def start_levels(self, state) -> None:
        """New levels on top until `active_levels` learn (none past the run's last iteration),
        each shown as open work in the pool's progress."""
        while len(self.levels) < self.config.pipeline.active_levels:
            iteration = self.levels[-1].iteration + 1 if self.levels else state.iteration + 1
            if iteration > self.config.iterations:
                return
            calls = [self._call(state, role, iteration) for role in range(self.game.num_roles)]
            works = [Rounds.of(call).work for call in calls]
            for work in works:
                self.pool.store.begin(work)
            reused = [(self.idle.pop(), call) for call in calls[: len(self.idle)]]
            if self.on_ray:  # each in its own process
                _run_all([(learner, "restart", call) for learner, call in reused])
            else:  # one after another: a network's seeded initialisation uses torch's global generator
                for learner, call in reused:
                    learner.restart(call)
            learners = [learner for learner, _ in reused] + [
                start_learner(call, self.on_ray) for call in calls[len(reused) :]
            ]
            rounds = Rounds.of(calls[0]).count
            self.levels.append(
                Level(iteration, learners, rounds, [np.zeros(0) for _ in calls], [work.id for work in works])
            )

    def _call(self, state, role: int, iteration: int) -> OracleCall:
        """The oracle call of level `iteration`'s response for `role`: what a sequential PSRO
        iteration would ask, so that its seeds, rounds and reported value are the same."""
        config = self.config
        return OracleCall(
            config,
            role,
            state.populations,
            state.meta_strategy,
            iteration,
            self.pool,
            opponent_epsilon=config.best_response.opponent_epsilon,
        )

    # --- one iteration: windows until the lowest level freezes -------------------------------

    def train_until_frozen(self, state) -> list[BestResponse]:
        """Learn window after window until the lowest level freezes; returns its responses, each
        valued against the fixed mixture of `state`, and takes the level out."""
        if not self.levels:
            raise RuntimeError("no level is learning: the run has no iterations left")
        while not self._frozen(self.levels[0]):
            self.train_window(state)
        lowest = self.levels.pop(0)
        calls = [self._call(state, role, lowest.iteration) for role in range(self.game.num_roles)]
        responses = _run_all([(learner, "response", call) for learner, call in zip(lowest.learners, calls)])
        self._close(lowest)
        return responses

    def _frozen(self, level: Level) -> bool:
        if level.done:
            return True
        window, rule = self.config.pipeline.window, self.config.pipeline.plateau
        return all(plateaued(returns, rule, window) for returns in level.returns)

    def train_window(self, state) -> None:
        """Every level learns one window at once, each against its restricted game's mixture as
        the lower levels' weights stand now."""
        calls, counts = [], []
        for level, opponents in zip(self.levels, self.level_mixtures(state)):
            count = min(self.window_rounds, level.rounds - level.rounds_learned)
            counts.append(count)
            calls += [(learner, "train", opponents[role], count) for role, learner in enumerate(level.learners)]
        returns = iter(_run_all(calls))
        for level, count in zip(self.levels, counts):
            level.returns = [np.concatenate([before, next(returns)]) for before in level.returns]
            level.rounds_learned += count

    # --- the restricted games ----------------------------------------------------------------

    def level_mixtures(self, state) -> list[list[dict[str, PolicyMixture]]]:
        """Per level, per role: the other roles' mixtures it learns against. The lowest level's
        is the run's meta-strategy over the fixed members; level j's adds the j levels below it,
        weighted by the solution of that restricted game."""
        game = self.game
        fixed = [mixtures(state.populations, state.meta_strategy, game, skip=role) for role in range(game.num_roles)]
        if len(self.levels) == 1:
            return [fixed]
        tree_game = self.config.game if self.config.eval == "exact" else None
        snapshots = _run_all(
            [(learner, "member", tree_game) for level in self.levels[:-1] for learner in level.learners]
        )
        populations = list(state.populations)
        for j in range(len(self.levels) - 1):
            members = snapshots[j * game.num_roles : (j + 1) * game.num_roles]
            populations = [population.added(member) for population, member in zip(populations, members)]
        payoffs = self._restricted_payoffs(state, populations)
        solver = get_meta_solver(self.config.meta_solver)
        result = [fixed]
        for j in range(1, len(self.levels)):
            sizes = [size + j for size in state.population_sizes]
            restricted = [
                Population.of(population.role, population.members[:size])
                for population, size in zip(populations, sizes)
            ]
            meta = solver.solve(payoffs.mean[(slice(None), *(slice(0, size) for size in sizes))])
            result.append([mixtures(restricted, meta, game, skip=role) for role in range(game.num_roles)])
        return result

    def _restricted_payoffs(self, state, populations):
        """The run's payoff table grown by the snapshots, their profiles evaluated."""
        from marl_core.psro.steps import evaluate_payoffs

        payoffs = state.payoffs.copy()
        payoffs.grow(tuple(len(population) for population in populations))
        profiles = payoffs.missing_profiles()
        evaluation = evaluate_payoffs(self.config, populations, profiles, self.pool)
        payoffs.record(profiles, evaluation.mean, evaluation.stderr, evaluation.episodes)
        return payoffs

    def _close(self, level: Level) -> None:
        """A frozen level's learners drop their weights from the store and wait for a next level."""
        _run_all([(learner, "close") for learner in level.learners])
        for work in level.work:
            self.pool.store.end_work(work)
        self.idle.extend(level.learners)

    def close(self) -> None:
        """Stop every learner (a run that ends or stops). Actors are ended at once: one may still
        be learning a window, and the store ends with the run."""
        learners = [learner for level in self.levels for learner in level.learners] + self.idle
        for level in self.levels:
            for work in level.work:
                self.pool.store.end_work(work)
        if self.on_ray:
            import ray

            for learner in learners:
                ray.kill(learner)
        else:
            _run_all([(learner, "close") for learner in learners])
        self.levels, self.idle = [], []


def train_levels(pipeline: Pipeline, state) -> tuple[list[BestResponse], Pipeline]:
    """The `train-levels` step: the levels learn until the lowest freezes. Returns its responses
    and the pipeline as it now stands (a step on Ray trains a copy)."""
    responses = pipeline.train_until_frozen(state)
    return responses, pipeline


# --- one process, no orchestration -----------------------------------------------------------


def iterate_pipeline_local(config: PSROConfig) -> Iterator[tuple[IterationRecord, PSROState]]:
    """Pipeline PSRO with every step in this process and the levels in threads: the reference
    for what the flow computes, as `steps.iterate_psro_local` is for sequential PSRO."""
    from marl_core.psro.steps import STEPS, initial_state, rollout_pool_config, run_iteration, should_stop
    from marl_core.rollout.pool import WorkerPool
    from marl_core.runner import LocalRunner

    started = time.perf_counter()
    runner, pool = LocalRunner(STEPS), WorkerPool(rollout_pool_config(config))
    record, state = run_iteration(config, initial_state(config), 0, runner, pool, started)
    yield record, state
    pipeline = Pipeline(config, state, pool)
    try:
        while pipeline.levels and not should_stop(config, record):
            learning = time.perf_counter()
            responses, pipeline = train_levels(pipeline, state)
            trained = time.perf_counter() - learning
            record, state = run_iteration(config, state, state.iteration + 1, runner, pool, started, given=responses)
            yield with_training_time(record, trained), state
            pipeline.start_levels(state)
    finally:
        pipeline.close()
        pool.close()


def with_training_time(record, seconds: float):
    """An iteration's record with the levels' training since the previous freeze as its
    best-response stage (it ran before the iteration's own steps)."""
    return dataclasses.replace(
        record,
        stage_seconds={"best_response": seconds, **record.stage_seconds},
        iteration_seconds=record.iteration_seconds + seconds,
    )
