"""Best-response oracles, looked up by name.

An oracle answers "what should this player add to its population?" given the current
populations and meta-strategy. `exact` computes the true best response to the opponents'
meta-strategy mixture by one backward pass over the tree, so it also returns the value that
response earns (the basis of NashConv).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from marl_core.exploitability import mixed_reach
from marl_core.game_tree import GameTree, best_response


@dataclasses.dataclass(frozen=True)
class BestResponse:
    player: int
    policy: np.ndarray  # [I, A]
    value: float  # expected return of the response against the opponents' mixture


OracleFn = Callable[[GameTree, int, list[np.ndarray], list[np.ndarray]], BestResponse]


def exact_oracle(tree: GameTree, player: int, populations, meta_strategy) -> BestResponse:
    value, policy = best_response(tree, player, mixed_reach(tree, populations, meta_strategy))
    return BestResponse(player=player, policy=policy, value=value)


@dataclasses.dataclass(frozen=True)
class Oracle:
    name: str
    summary: str
    compute: OracleFn


ORACLES: dict[str, Oracle] = {
    "exact": Oracle("exact", "exact best response by a backward pass over the game tree", exact_oracle),
}


class OracleError(ValueError):
    pass


def get_oracle(name: str) -> Oracle:
    if name not in ORACLES:
        raise OracleError(f"unknown oracle {name!r}; choose one of: {', '.join(sorted(ORACLES))}")
    return ORACLES[name]
