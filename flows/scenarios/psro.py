"""PSRO (and Pipeline PSRO) as a scenario: one `psro-iteration` subflow per iteration.

An iteration is `marl_core.psro.steps.run_iteration`, the function the in-process loop runs:
the best responses of all players in parallel, the new payoff entries, the meta-game. A
learned oracle's responses are played by the run's rollout workers (Ray actors). With
`pipeline` settings the levels' learners are Ray actors of the run, started between
iterations; each iteration after the first trains the levels until the lowest one freezes
(`train-levels`), whose responses then join as in a PSRO iteration. A resumed run starts its
levels afresh above the iterations it committed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from flows.runtime.scenario import SEED, Flag, Scenario, Step, environment_help, one_of
from flows.tracking import layout


def _oracles() -> str:
    from marl_core.psro.oracles import ORACLES

    return f"best-response oracle, {one_of(ORACLES)} (see `psro oracles`)"


def _solvers() -> str:
    from marl_core.empirical_game.meta_solvers import META_SOLVERS

    return f"meta-solver, {one_of(META_SOLVERS)} (see `psro solvers`)"


def _evaluators() -> str:
    from marl_core.empirical_game.evaluation import EVALUATORS

    return f"payoff evaluator, {one_of(EVALUATORS)}"


def _log_placement(pool) -> None:
    """On a cluster, one line of the run's log naming the Ray nodes its rollout workers went to
    (tests/test_cluster.py reads it). Logged here, by the flow: a line logged by a task on a Ray
    worker can be lost when the run ends and Ray stops that worker before its logs are sent."""
    from prefect import get_run_logger

    from tasks.psro_tasks import several_nodes

    if several_nodes():
        get_run_logger().info("rollout workers on Ray nodes %s", ", ".join(pool.node_ids()))


@dataclasses.dataclass
class PSROSession:
    pool: Any  # the rollout workers (None where no step plays episodes)
    started: float  # when this process started the run (iteration records count from it)
    pipeline: Any = None  # Pipeline PSRO's active levels

    def progress(self) -> list:
        return self.pool.progress() if self.pool is not None else []


class PSROScenario(Scenario):
    name = "psro"
    summary = "PSRO on a game: populations grown by best responses to the meta-game's equilibrium"
    step_noun = "iteration"
    steps_setting = "iterations"
    commit_tag = layout.COMMITTED_TAG
    exports = True
    operational = Scenario.operational | {"stop_exploitability"}
    flags = (
        Flag("game", str, environment_help("game")),
        Flag("oracle", str, _oracles),
        Flag("meta-solver", str, _solvers),
        Flag("iterations", int, "PSRO iterations"),
        Flag("eval", str, _evaluators),
        Flag("episodes", int, "episodes per profile when --eval sampled"),
        SEED,
        Flag("stop-exploitability", float, "stop once exploitability is at most this"),
    )

    def build_config(self, values: dict):
        from marl_core.psro.config import build_config

        return build_config(values)

    def describe(self, config) -> str:
        return (
            f"PSRO on [bold]{config.game}[/]: oracle={config.oracle} meta-solver={config.meta_solver} "
            f"eval={config.eval} iterations={config.iterations}; MLflow at {config.tracking_uri}"
        )

    # --- the run ------------------------------------------------------------------------------

    def initial_state(self, config):
        from marl_core.psro.steps import initial_state

        return initial_state(config)

    def load(self, config, client, run_id: str, committed: int):
        import tempfile

        from flows.tracking.resume import read_iteration
        from marl_core.psro.steps import PSROState

        with tempfile.TemporaryDirectory() as scratch:
            logged = config.model_dump(mode="json")
            populations, payoffs, meta_strategy = read_iteration(client, run_id, logged, committed, scratch)
        return PSROState(populations, payoffs, meta_strategy, committed)

    def steps(self, config, committed: int | None) -> range:
        return range(0 if committed is None else committed + 1, config.iterations + 1)

    def open(self, config, state, steps: range, stack) -> PSROSession:
        from marl_core.psro.steps import rollout_pool_config
        from marl_core.rollout.pool import WorkerPool

        pool_config = rollout_pool_config(config)
        pool = None
        if pool_config is not None:
            pool = WorkerPool(pool_config, on_ray=True)
            stack.callback(pool.close)
            _log_placement(pool)
        session = PSROSession(pool, time.perf_counter())
        if config.pipeline is not None:
            stack.callback(lambda: session.pipeline is not None and session.pipeline.close())
            if steps.start > 0:  # resumed: levels above the iterations it committed
                session.pipeline = self._pipeline(config, state, pool)
        return session

    def _pipeline(self, config, state, pool):
        from marl_core.psro.pipeline import Pipeline

        return Pipeline(config, state, pool, on_ray=True)

    def step(self, config, session: PSROSession, state, index: int) -> Step:
        from flows.runtime.task_steps import RayTaskSteps
        from marl_core.psro import steps as psro
        from tasks.psro_tasks import TASKS

        runner = RayTaskSteps(TASKS)
        if session.pipeline is None:
            record, state = psro.run_iteration(config, state, index, runner, session.pool, session.started)
            return Step(record, state)
        from marl_core.psro.pipeline import with_training_time

        learning = time.perf_counter()
        training = runner.submit_driving_actors("train-levels", session.pipeline, runner.share(state))
        responses, session.pipeline = runner.result(training)
        trained = time.perf_counter() - learning
        record, state = psro.run_iteration(config, state, index, runner, session.pool, session.started, given=responses)
        return Step(with_training_time(record, trained), state)

    def between(self, config, session: PSROSession, step: Step) -> Step:
        if config.pipeline is not None:
            if session.pipeline is None:  # after iteration 0: the levels start on its populations
                session.pipeline = self._pipeline(config, step.state, session.pool)
            else:
                session.pipeline.start_levels(step.state)
        return step

    def should_stop(self, config, session, record) -> bool:
        from marl_core.psro.steps import should_stop

        return should_stop(config, record)

    def tracker(self, config, resume, tags):
        from flows.tracking.psro_tracker import PSROTracker

        return PSROTracker(config, resume, tags)

    def export(self, config, state, record, seconds: float) -> None:
        """The OpenSpiel-checkable export; `record` is None when a resumed run had nothing left."""
        from marl_core.psro import steps as psro
        from marl_core.psro.export import write_export

        if record:
            report, approx = record.report, record.approx
        else:
            meta_game = psro.MetaGame(state.payoffs, state.meta_strategy)
            report, approx = psro.measure(config, state.populations, meta_game), None
        write_export(
            config.export, config, state.populations, state.meta_strategy, report, state.iteration, seconds, approx
        )

    # --- the command's lines ------------------------------------------------------------------

    def line(self, record, state) -> str:
        sizes = "x".join(map(str, record.population_sizes))
        return f"iter {record.iteration:4d}  pop {sizes:>9}  {record.summary()}  {record.iteration_seconds:5.2f}s"

    def done(self, config, state, record, seconds: float) -> str:
        text = f"done: {record.iteration} iterations, {record.summary()} in {seconds:.1f}s"
        if config.export:
            text += f"\nexported to {config.export}; check it with: python scripts/verify_export.py {config.export}"
        return text


PSRO = PSROScenario()
