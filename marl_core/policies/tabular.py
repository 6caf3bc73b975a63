"""Tabular policies: one row of action probabilities per information state of an OpenSpiel game.

A table [I, A] follows the information-state order of the player's `PlayerTree`; stacked, a
population's tables are one array [K, I, A] (member, information state, action), which is what
the exact methods work on. Illegal actions hold probability 0, so any row can be sampled from or
exported as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from marl_core.games.tree import PlayerTree, build_tree
from marl_core.policies.base import Observations, Policy


@dataclasses.dataclass(frozen=True, eq=False)
class TabularPolicy(Policy):
    """Player `player` of OpenSpiel game `game`, acting by its row at each information state."""

    kind: ClassVar[str] = "tabular"
    game: str
    player: int
    table: np.ndarray  # [I, A]

    @property
    def tabular(self) -> np.ndarray:
        return self.table

    def rows(self, infostates) -> np.ndarray:
        index = build_tree(self.game).players[self.player].index
        try:
            return np.fromiter((index[s] for s in infostates), dtype=np.int64, count=len(infostates))
        except KeyError as missing:
            raise ValueError(f"{self.game} player {self.player} has no information state {missing}") from None

    def action_probs(self, batch: Observations) -> np.ndarray:
        if batch.infostates is None:
            raise ValueError(
                f"a tabular policy of {self.game} needs information-state strings; this environment gives none"
            )
        return self.table[self.rows(batch.infostates)]

    def description(self) -> dict[str, Any]:
        return {"kind": self.kind, "game": self.game, "player": self.player}

    def weights(self) -> dict[str, Any]:
        return {"table": self.table}


def uniform_population(tree: PlayerTree) -> np.ndarray:
    """A population of one member that plays uniformly over legal actions."""
    return tree.uniform_policy()[None]


def append_members(population: np.ndarray, members: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([population, np.stack(members)], axis=0)


def check_policy(tree: PlayerTree, policy: np.ndarray) -> None:
    """Reject a policy that puts mass on illegal actions or whose rows are not distributions."""
    if policy.shape != tree.legal.shape:
        raise ValueError(f"policy has shape {policy.shape}, expected {tree.legal.shape}")
    if np.any(policy[~tree.legal] != 0):
        raise ValueError("policy puts probability on illegal actions")
    if not np.allclose(policy.sum(axis=1), 1.0, atol=1e-9) or np.any(policy < 0):
        raise ValueError("policy rows must be probability distributions")


def policy_to_dict(tree: PlayerTree, policy: np.ndarray) -> dict[str, list[float]]:
    """The export format: information-state string -> probabilities of every distinct action."""
    return {state: [float(p) for p in policy[row]] for row, state in enumerate(tree.infostates)}


def policy_from_dict(tree: PlayerTree, table: dict[str, list[float]]) -> np.ndarray:
    missing = [state for state in tree.infostates if state not in table]
    if missing:
        raise ValueError(f"policy lacks {len(missing)} information states, e.g. {missing[0]!r}")
    policy = np.array([table[state] for state in tree.infostates], dtype=np.float64)
    check_policy(tree, policy)
    return policy
