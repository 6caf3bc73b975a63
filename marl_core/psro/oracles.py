"""Best-response oracles, looked up by name.

An oracle answers "what should this role add to its population?" given the current populations
and meta-strategy. `exact` computes the true best response to the opponents' meta-strategy
mixture by one backward pass over the game tree (OpenSpiel games whose tree fits). Every RL
algorithm in `marl_core.rl.ALGORITHMS` is also a learned oracle of the same name: it learns a
network from episodes played by rollout workers on any environment
(`marl_core.psro.learned_oracle`: a learner, and a collector that drives the workers), with the
settings the config holds under its name. Their torch code is imported only when they run, so
choosing or validating an oracle stays cheap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from marl_core.games.exploitability import mixed_reach
from marl_core.games.tree import best_response, build_tree
from marl_core.policies.population import stacked_tables
from marl_core.psro.oracle_call import BestResponse, OracleCall
from marl_core.registry import Registry
from marl_core.rl import ALGORITHMS

__all__ = ["BestResponse", "ORACLES", "Oracle", "OracleCall", "OracleError", "get_oracle"]


def exact_oracle(call: OracleCall) -> BestResponse:
    from marl_core.policies.tabular import TabularPolicy

    tree = build_tree(call.config.game)
    reaches = mixed_reach(tree, stacked_tables(call.populations), call.meta_strategy)
    value, table = best_response(tree, call.role, reaches)
    return BestResponse(role=call.role, policy=TabularPolicy(call.config.game, call.role, table), value=value)


def learned_oracle(call: OracleCall) -> BestResponse:
    from marl_core.psro.learned_oracle import train_best_response

    return train_best_response(call)


@dataclasses.dataclass(frozen=True)
class Oracle:
    name: str
    summary: str
    compute: Callable[[OracleCall], BestResponse]
    learns: bool = False  # an RL algorithm: needs rollout workers and takes the settings under its name


class OracleError(ValueError):
    pass


ORACLES: Registry[Oracle] = Registry("oracle", OracleError)


def _oracle(name: str, summary: str, compute: Callable[[OracleCall], BestResponse], learns: bool = False) -> None:
    """`ORACLES.add`, with the name and summary written once for registry and oracle."""
    ORACLES.add(name, Oracle(name, summary, compute, learns), summary)


_oracle("exact", "exact best response by a backward pass over the game tree", exact_oracle)
for _name in ALGORITHMS:
    _oracle(_name, f"{ALGORITHMS.summary(_name)}, trained on rollouts", learned_oracle, learns=True)


def get_oracle(name: str) -> Oracle:
    return ORACLES[name]
