"""A round of neural CFR, the step of its scenario: `iterations_per_round` iterations, then the
members measured.

The solver lives where it runs (`SolverActor`: a Ray actor for a flow's run, a plain object in
one process), keeping its networks, memories and generators between rounds; a round's two steps
only drive it, so a round is two coarse tasks, never one per iteration or traversal. The steps
are wired once, over a runner (`marl_core.runner`), as every scenario's are.
"""

from __future__ import annotations

import dataclasses

from marl_core.neural_cfr.config import NeuralCFRConfig


@dataclasses.dataclass(frozen=True)
class CFRRound:
    """What one round measured: the members' exact exploitability (None where not measured) and
    the iterations' training figures."""

    round: int
    iteration: int  # CFR iterations done after this round
    exploitability: float | None
    nash_conv: float | None
    advantage_loss: float
    policy_loss: float
    regret_samples: int
    strategy_samples: int
    traversal_seconds: float
    training_seconds: float
    elapsed_seconds: float  # since this process's run began, orchestration included

    def metrics(self) -> dict[str, float]:
        measured = {} if self.exploitability is None else {"exploitability": self.exploitability}
        if self.nash_conv is not None:
            measured["nash_conv"] = self.nash_conv
        return {
            **measured,
            "iteration": self.iteration,
            "advantage_loss": self.advantage_loss,
            "policy_loss": self.policy_loss,
            "regret_samples": self.regret_samples,
            "strategy_samples": self.strategy_samples,
            "traversal_seconds": self.traversal_seconds,
            "training_seconds": self.training_seconds,
            "elapsed_seconds": self.elapsed_seconds,
        }


class SolverActor:
    """The run's `NeuralCFR` where it runs. It lives in marl_core so that its process imports no
    Prefect; on Ray it is `ray.remote(SolverActor)`, driven through `RaySolver`."""

    def __init__(self, config: NeuralCFRConfig, state: dict | None = None):
        import torch

        from marl_core.neural_cfr.solver import NeuralCFR

        torch.set_num_threads(config.threads)
        self.game = config.game
        self.solver = NeuralCFR.from_state_dict(state) if state else NeuralCFR(config.game, config.neural_cfr)

    def iterate(self, iterations: int) -> list:
        return [self.solver.iterate() for _ in range(iterations)]

    def measure(self):
        """Exact NashConv of the average-policy networks (the tree measures; it never trains)."""
        from marl_core.neural_cfr.solver import exact_exploitability

        return exact_exploitability(self.game, self.solver.members())

    def state_dict(self) -> dict:
        return self.solver.state_dict()

    def members(self) -> list:
        """Each player's average-policy network (copies)."""
        return self.solver.members()


class RaySolver:
    """A `SolverActor` on Ray, with the same methods (each waits for the actor)."""

    def __init__(self, actor):
        self.actor = actor

    def iterate(self, iterations: int) -> list:
        import ray

        return ray.get(self.actor.iterate.remote(iterations))

    def measure(self):
        import ray

        return ray.get(self.actor.measure.remote())


def iterate_solver(solver, iterations: int) -> list:
    return solver.iterate(iterations)


def measure_members(solver):
    return solver.measure()


# The steps of a round, by the names their Prefect tasks have (`tasks.cfr_tasks`).
STEPS = {"iterate-solver": iterate_solver, "measure-members": measure_members}


def run_round(config: NeuralCFRConfig, runner, solver, round: int, started: float) -> CFRRound:
    """Round `round`: the iterations, then (where `exact`) the members' exact exploitability.
    `started`: when this process's run began, on `time.perf_counter`'s clock."""
    import time

    stats = runner.result(runner.submit("iterate-solver", solver, config.iterations_per_round))
    report = runner.result(runner.submit("measure-members", solver)) if config.exact else None
    last = stats[-1]
    return CFRRound(
        round=round,
        iteration=last.iteration,
        exploitability=None if report is None else float(report.exploitability),
        nash_conv=None if report is None else float(report.nash_conv),
        advantage_loss=last.advantage_loss,
        policy_loss=last.policy_loss,
        regret_samples=sum(s.regret_samples for s in stats),
        strategy_samples=sum(s.strategy_samples for s in stats),
        traversal_seconds=sum(s.traversal_seconds for s in stats),
        training_seconds=sum(s.training_seconds for s in stats),
        elapsed_seconds=time.perf_counter() - started,
    )


def iterate_cfr_local(config: NeuralCFRConfig, state: dict | None = None):
    """A run in this process, round by round: the reference a flow's run is compared with (the
    same steps over a `LocalRunner`). Yields each round's record and the solver after it."""
    import time

    from marl_core.runner import LocalRunner

    solver = SolverActor(config, state)
    runner = LocalRunner(STEPS)
    started = time.perf_counter()
    first = 0 if state is None else int(state["iteration"]) // config.iterations_per_round
    for round in range(first, config.rounds):
        record = run_round(config, runner, solver, round, started)
        yield record, solver
        if config.stop_exploitability is not None and record.exploitability <= config.stop_exploitability:
            return
