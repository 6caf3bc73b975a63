"""MALib's agent mapping: which population (policy id) plays each environment agent.

A mapping is any callable AgentID -> population id. The ones built here are frozen dataclasses
rather than lambdas so they pickle (Ray ships them to rollout workers) and print readably.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

from marl_core.envs.api import AgentID

AgentMapping = Callable[[AgentID], str]


def one_population_per_agent(agent: AgentID) -> str:
    """Every agent has its own population, named after the agent (PSRO on asymmetric games)."""
    return agent


@dataclasses.dataclass(frozen=True)
class _Shared:
    population: str

    def __call__(self, agent: AgentID) -> str:
        return self.population


def shared_population(name: str) -> AgentMapping:
    """All agents draw from one population (self-play, symmetric games)."""
    return _Shared(name)


@dataclasses.dataclass(frozen=True)
class _ByPrefix:
    prefixes: tuple[tuple[str, str], ...]  # (prefix, population), longest prefix first

    def __call__(self, agent: AgentID) -> str:
        for prefix, population in self.prefixes:
            if agent.startswith(prefix):
                return population
        raise KeyError(f"agent {agent!r} matches none of the prefixes {[p for p, _ in self.prefixes]}")


def by_prefix(prefixes: Mapping[str, str]) -> AgentMapping:
    """Agents named by role share a population, e.g. {"adversary": "red", "agent": "blue"}."""
    return _ByPrefix(tuple(sorted(prefixes.items(), key=lambda item: -len(item[0]))))


@dataclasses.dataclass(frozen=True)
class _FromDict:
    table: dict[AgentID, str]

    def __call__(self, agent: AgentID) -> str:
        if agent not in self.table:
            raise KeyError(f"agent {agent!r} is not in the mapping {list(self.table)}")
        return self.table[agent]


def from_dict(table: Mapping[AgentID, str]) -> AgentMapping:
    """An explicit agent -> population table."""
    return _FromDict(dict(table))


def group_by_policy(agents: Iterable[AgentID], mapping: AgentMapping) -> dict[str, list[AgentID]]:
    """Population id -> the agents it plays, in the agents' order."""
    groups: dict[str, list[AgentID]] = {}
    for agent in agents:
        groups.setdefault(mapping(agent), []).append(agent)
    return groups
