"""A population: the members one role has grown, in order. PSRO adds one per iteration.

Populations belong to roles (in `simple_tag` every adversary draws from the population
"adversary"); on an OpenSpiel game the roles are its players. Where every member has a tabular
form, the population also keeps them stacked as one [K, I, A] array (`tables`), grown by one
member at a time, which is what the exact methods read.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from marl_core.policies.base import Policy


@dataclasses.dataclass(frozen=True, eq=False)
class Population:
    role: str
    members: tuple[Policy, ...]
    tables: np.ndarray | None = None  # [K, I, A], present when every member is tabular-capable

    @classmethod
    def of(cls, role: str, members) -> Population:
        members = tuple(members)
        tables = np.stack([m.tabular for m in members]) if all(m.tabular is not None for m in members) else None
        return cls(role, members, tables)

    def added(self, member: Policy) -> Population:
        """A new population with `member` appended; this one is left as it was."""
        tables = None
        if self.tables is not None and member.tabular is not None:
            tables = np.concatenate([self.tables, member.tabular[None]], axis=0)
        return Population(self.role, (*self.members, member), tables)

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int) -> Policy:
        return self.members[index]


def stacked_tables(populations: list[Population]) -> list[np.ndarray]:
    """Every population's [K, I, A] tables, for the exact methods; a one-line error otherwise."""
    missing = [p.role for p in populations if p.tables is None]
    if missing:
        raise ValueError(f"population(s) {missing} have members without a tabular form; exact methods need one")
    return [p.tables for p in populations]
