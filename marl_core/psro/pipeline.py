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
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import numpy as np

from marl_core.empirical_game.meta_solvers import get_meta_solver
from marl_core.policies.neural import NeuralPolicy
from marl_core.policies.population import Population
from marl_core.psro.config import PSROConfig
from marl_core.psro.game import psro_game_of
from marl_core.psro.learned_oracle import ResponseLearner, mixtures
from marl_core.psro.oracle_call import BestResponse, OracleCall
from marl_core.psro.settings import Plateau
from marl_core.rollout.worker import PolicyMixture

if TYPE_CHECKING:
    from marl_core.psro.steps import IterationRecord, PSROState


def plateaued(returns: np.ndarray, rule: Optional[Plateau], window: int) -> bool:
    """Whether a level whose training returns so far (one per episode, in order) have stopped
    improving: the mean of its last `window` episodes beats the mean of the `window` before by
    less than the rule's threshold. Checked only from `check_from` episodes, frozen only after
    `min_episodes`; no rule never plateaus."""
    if rule is None or len(returns) < max(rule.check_from, rule.min_episodes, 2 * window):
        return False
    gain = returns[-window:].mean() - returns[-2 * window : -window].mean()
    return bool(gain < rule.threshold)


@dataclasses.dataclass
class Level:
    """One level: a response in progress per role, for the iteration it becomes when frozen."""

    iteration: int
    learners: list[ResponseLearner]  # one per role, in role order

    @property
    def episodes(self) -> int:
        return min(learner.episodes for learner in self.learners)

    def returns(self) -> np.ndarray:
        """[roles, episodes] each role's training return per episode, in order."""
        length = self.episodes
        return np.stack([np.concatenate([np.zeros(0), *learner.returns])[:length] for learner in self.learners])


class Pipeline:
    """The active levels of a run. `state` is the fixed population (a `PSROState`) that their
    mixtures are built on; `pool` the rollout workers; `parallel` runs a list of thunks at once
    and returns their results (default: one thread each)."""

    def __init__(self, config: PSROConfig, state, pool, parallel: Optional[Callable] = None):
        if config.pipeline is None:
            raise ValueError("Pipeline needs a config with a pipeline section")
        self.config, self.pool = config, pool
        self.game = psro_game_of(config)
        self.parallel = parallel or _in_threads
        self.window_rounds = math.ceil(config.pipeline.window / config.best_response.episodes_per_round)
        self.levels: list[Level] = []
        self._fill(state)

    def _fill(self, state) -> None:
        """New levels on top until `active_levels` learn (none past the run's last iteration)."""
        while len(self.levels) < self.config.pipeline.active_levels:
            iteration = self.levels[-1].iteration + 1 if self.levels else state.iteration + 1
            if iteration > self.config.iterations:
                return
            calls = [self._call(state, role, iteration) for role in range(self.game.num_roles)]
            self.levels.append(Level(iteration, [ResponseLearner(call) for call in calls]))

    def _call(self, state, role: int, iteration: int) -> OracleCall:
        """The oracle call of level `iteration`'s response for `role`: what a sequential PSRO
        iteration would ask, so that its seeds, rounds and reported value are the same."""
        config = self.config
        return OracleCall(
            config, role, state.populations, state.meta_strategy, iteration, self.pool,
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
        responses = [learner.response(self._call(state, role, lowest.iteration)) for role, learner in enumerate(lowest.learners)]
        for learner in lowest.learners:
            self.pool.drop(learner.spec.key)
        return responses

    def start_levels(self, state) -> None:
        """After an iteration: new levels on top, built on its state."""
        self._fill(state)

    def _frozen(self, level: Level) -> bool:
        if any(learner.done for learner in level.learners):
            return True
        window, rule = self.config.pipeline.window, self.config.pipeline.plateau
        return all(plateaued(role_returns, rule, window) for role_returns in level.returns())

    def train_window(self, state) -> None:
        """Every level learns one window at once, each against its restricted game's mixture as
        the lower levels' weights stand now."""
        opponents = self.level_mixtures(state)
        jobs = []
        for level, level_opponents in zip(self.levels, opponents):
            for role, learner in enumerate(level.learners):
                rounds = dataclasses.replace(learner.rounds, opponents=level_opponents[role])
                count = min(self.window_rounds, learner.rounds.count - learner.rounds_learned)
                jobs.append(lambda learner=learner, rounds=rounds, count=count: _learn_rounds(learner, self.pool, rounds, count))
        self.parallel(jobs)

    # --- the restricted games ----------------------------------------------------------------

    def level_mixtures(self, state) -> list[list[dict[str, PolicyMixture]]]:
        """Per level, per role: the other roles' mixtures it learns against. The lowest level's
        is the run's meta-strategy over the fixed members; level j's adds the j levels below it,
        weighted by the solution of that restricted game."""
        game = self.game
        fixed = [mixtures(state.populations, state.meta_strategy, game, skip=role) for role in range(game.num_roles)]
        if len(self.levels) == 1:
            return [fixed]
        snapshots = [self._snapshot(level) for level in self.levels[:-1]]
        populations = list(state.populations)
        for members in snapshots:
            populations = [population.added(member) for population, member in zip(populations, members)]
        payoffs = self._restricted_payoffs(state, populations)
        solver = get_meta_solver(self.config.meta_solver)
        result = [fixed]
        for j in range(1, len(self.levels)):
            sizes = [size + j for size in state.population_sizes]
            restricted = [Population.of(population.role, population.members[:size]) for population, size in zip(populations, sizes)]
            meta = solver.solve(payoffs.mean[(slice(None), *(slice(0, size) for size in sizes))])
            result.append([mixtures(restricted, meta, game, skip=role) for role in range(game.num_roles)])
        return result

    def _snapshot(self, level: Level) -> list[NeuralPolicy]:
        """A level's networks as they stand, as members (with their tables where payoffs are exact)."""
        if self.config.eval != "exact":
            return [learner.member() for learner in level.learners]
        from marl_core.games.tabularize import tabularize
        from marl_core.games.tree import build_tree

        tree = build_tree(self.config.game)
        return [learner.member(tabularize(learner.trainer.policy, tree, role)) for role, learner in enumerate(level.learners)]

    def _restricted_payoffs(self, state, populations):
        """The run's payoff table grown by the snapshots, their profiles evaluated."""
        from marl_core.psro.steps import evaluate_payoffs

        payoffs = state.payoffs.copy()
        payoffs.grow(tuple(len(population) for population in populations))
        profiles = payoffs.missing_profiles()
        evaluation = evaluate_payoffs(self.config, populations, profiles, self.pool)
        payoffs.record(profiles, evaluation.mean, evaluation.stderr, evaluation.episodes)
        return payoffs

    def close(self) -> None:
        for level in self.levels:
            for learner in level.learners:
                self.pool.drop(learner.spec.key)
        self.levels = []


def _learn_rounds(learner: ResponseLearner, pool, rounds, count: int) -> None:
    for _ in range(count):
        learner.play_and_learn(pool, rounds)


def _in_threads(jobs: list[Callable]) -> list:
    with ThreadPoolExecutor(max_workers=max(1, len(jobs)), thread_name_prefix="pipeline-level") as threads:
        return [future.result() for future in [threads.submit(job) for job in jobs]]


# --- one process, no orchestration -----------------------------------------------------------


def iterate_pipeline_local(config: PSROConfig) -> Iterator[tuple["IterationRecord", "PSROState"]]:
    """Pipeline PSRO with every step in this process and the levels in threads: the reference
    for what the flow computes, as `steps.iterate_psro_local` is for sequential PSRO."""
    from marl_core.psro.steps import LocalRunner, initial_state, rollout_pool_config, run_iteration, should_stop
    from marl_core.rollout.pool import WorkerPool

    started = time.perf_counter()
    runner, pool = LocalRunner(), WorkerPool(rollout_pool_config(config))
    record, state = run_iteration(config, initial_state(config), 0, runner, pool, started)
    yield record, state
    pipeline = Pipeline(config, state, pool)
    try:
        while pipeline.levels and not should_stop(config, record):
            learning = time.perf_counter()
            responses = pipeline.train_until_frozen(state)
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
        record, stage_seconds={"best_response": seconds, **record.stage_seconds}, iteration_seconds=record.iteration_seconds + seconds,
    )
