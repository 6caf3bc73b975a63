"""Prefect tasks of a neural CFR round: one per step of `marl_core.neural_cfr.rounds.STEPS`.

The solver is a Ray actor that lives for the whole run (`flows/scenarios/cfr.py`); each task
drives it for a whole round's iterations, or measures its members once.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from marl_core.neural_cfr import rounds

_options = dict(cache_policy=NO_CACHE, persist_result=False)


@task(name="iterate-solver", **_options)
def iterate_solver(solver, iterations: int) -> list:
    """`iterations` CFR iterations: traversals through the game's state API, then training."""
    return rounds.STEPS["iterate-solver"](solver, iterations)


@task(name="measure-members", **_options)
def measure_members(solver):
    """The average-policy networks' exact NashConv, asked at every information state."""
    return rounds.STEPS["measure-members"](solver)


TASKS = {"iterate-solver": iterate_solver, "measure-members": measure_members}
