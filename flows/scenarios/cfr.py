"""Neural CFR as a scenario: one `cfr-round` subflow per round, whose two tasks drive the solver,
a Ray actor that keeps its networks, memories and generators for the whole run
(`marl_core.neural_cfr.rounds`).

Every `checkpoint_every` rounds the solver's whole state and both players' average-policy
networks are committed (`flows.tracking.cfr_tracker`); a resumed run restores the solver from
its last commit and continues exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from flows.runtime.scenario import Flag, Scenario, Step
from flows.tracking import layout


@dataclasses.dataclass
class CFRProgress:
    """What is handed from step to step: a resumed run's committed solver state (until its actor
    holds it), and after each round both players' average-policy networks (the export's)."""

    solver_state: dict | None = None
    networks: list | None = None


@dataclasses.dataclass
class CFRSession:
    actor: Any  # a Ray actor of `SolverActor`
    started: float


class CFRScenario(Scenario):
    name = "cfr"
    summary = "Neural CFR: networks trained from sampled play toward an equilibrium of a two-player zero-sum game"
    step_noun = "round"
    steps_setting = "rounds"
    commit_tag = layout.CFR_COMMITTED_TAG
    exports = True
    # when to stop early, not what is computed: a run resumed with another target goes on alike
    operational = Scenario.operational | {"stop_exploitability"}
    flags = (
        Flag("game", str, "a two-player zero-sum OpenSpiel game with information-state tensors"),
        Flag("rounds", int, "rounds (each a Prefect flow run of iterations_per_round CFR iterations)"),
        Flag("iterations-per-round", int, "CFR iterations per round"),
        Flag("seed", int, "random seed", key="neural_cfr.seed"),
        Flag("stop-exploitability", float, "stop after the round whose exact exploitability reaches this"),
    )

    def build_config(self, values: dict):
        from marl_core.neural_cfr.config import NeuralCFRConfig
        from marl_core.psro.config import build_config

        return build_config(values, NeuralCFRConfig)

    def describe(self, config) -> str:
        s = config.neural_cfr
        return (
            f"neural CFR on [bold]{config.game}[/]: {config.rounds} rounds of {config.iterations_per_round} "
            f"iterations, {s.traversals} traversals per player per iteration, {s.strategy}; "
            f"MLflow at {config.tracking_uri}"
        )

    # --- the run ------------------------------------------------------------------------------

    def initial_state(self, config) -> CFRProgress:
        return CFRProgress()

    def load(self, config, client, run_id: str, committed: int) -> CFRProgress:
        from flows.tracking.cfr_tracker import load_solver_state

        return CFRProgress(solver_state=load_solver_state(client, run_id, committed, config))

    def steps(self, config, committed: int | None) -> range:
        return range(0 if committed is None else committed + 1, config.rounds)

    def open(self, config, progress: CFRProgress, steps: range, stack) -> CFRSession:
        import ray

        from marl_core.neural_cfr.rounds import SolverActor

        actor = ray.remote(num_cpus=1)(SolverActor).remote(config, progress.solver_state)
        stack.callback(ray.kill, actor)
        return CFRSession(actor, time.perf_counter())

    def step(self, config, session: CFRSession, progress: CFRProgress, index: int) -> Step:
        import ray

        from flows.runtime.task_steps import RayTaskSteps
        from marl_core.neural_cfr.rounds import RaySolver, run_round
        from tasks.cfr_tasks import TASKS

        runner = RayTaskSteps(TASKS, driving_actors=frozenset(TASKS))
        record = run_round(config, runner, RaySolver(session.actor), index, session.started)
        return Step(record, CFRProgress(networks=ray.get(session.actor.members.remote())))

    def should_stop(self, config, session, record) -> bool:
        target = config.stop_exploitability
        return target is not None and record.exploitability is not None and record.exploitability <= target

    def checkpoint(self, config, session: CFRSession, index: int, step: Step):
        import ray

        if not (config.checkpoint_due(index) or self.should_stop(config, session, step.record)):
            return None
        return ray.get(session.actor.state_dict.remote()), step.state.networks

    def tracker(self, config, resume, tags):
        from flows.tracking.cfr_tracker import CFRTracker

        return CFRTracker(config, resume, tags)

    def export(self, config, progress: CFRProgress, record, seconds: float) -> None:
        """The OpenSpiel-checkable export of the last members; `record` is None when a resumed
        run had nothing left to do (its members are then the committed solver's)."""
        from marl_core.neural_cfr.export import write_export
        from marl_core.neural_cfr.solver import NeuralCFR, exact_exploitability

        if progress.networks is not None:
            networks = progress.networks
        else:
            networks = NeuralCFR.from_state_dict(progress.solver_state).members()
        report = exact_exploitability(config.game, networks)
        iterations = record.iteration if record else int(progress.solver_state["iteration"])
        write_export(config.export, config.game, networks, report, iterations, seconds)

    # --- the command's lines ------------------------------------------------------------------

    def line(self, record, state) -> str:
        measured = "" if record.exploitability is None else f"exploitability {record.exploitability:.4f}  "
        return (
            f"round {record.round:4d}  iteration {record.iteration:5d}  {measured}"
            f"loss {record.advantage_loss:.3g}/{record.policy_loss:.3g}  "
            f"traverse {record.traversal_seconds:5.1f}s  train {record.training_seconds:5.1f}s"
        )

    def done(self, config, state, record, seconds: float) -> str:
        measured = "" if record.exploitability is None else f", exploitability {record.exploitability:.4f}"
        text = f"done: {record.round + 1} rounds ({record.iteration} iterations){measured} in {seconds:.1f}s"
        if config.export:
            text += f"\nexported to {config.export}; check it with: python scripts/verify_export.py {config.export}"
        return text


CFR = CFRScenario()
