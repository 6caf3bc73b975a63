"""Payoffs of profiles estimated by playing them: the evaluator for games without a tree.

A profile names one member per role. Its payoff to a role is the role's expected return with
every agent acting for its role, all agents of a role with the same member; an episode's return
for the role is the mean of its agents' returns (the agents of one role share a policy, so
their mean is what that policy earns per agent). The estimate is the mean over N episodes with
its standard error.

The episodes are played by rollout workers: one request per profile, all sent in one `collect`
so a Ray pool plays them in parallel. Each request is seeded by (seed, *profile) and answered by
one worker, so an entry does not depend on how many workers the pool has or which one plays it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from marl_core.empirical_game.game import PSROGame
from marl_core.empirical_game.payoffs import ProfilePayoffs
from marl_core.policies.population import Population
from marl_core.rollout.worker import PolicyMixture, RolloutRequest, RolloutResult


class Pool(Protocol):
    def collect(self, requests: list[RolloutRequest], progress: str | None = None) -> list[RolloutResult]: ...


def evaluate_by_rollouts(
    pool: Pool,
    game: PSROGame,
    populations: list[Population],
    profiles,
    *,
    episodes: int,
    seed: int,
    progress: str | None = None,
) -> ProfilePayoffs:
    """[m, num_roles] profiles of member indices -> each role's mean payoff and its standard error.
    `progress`: the open work in the pool's progress that each profile's episodes count towards."""
    profiles = _checked_profiles(game, populations, profiles, episodes)
    requests = [
        RolloutRequest(
            roles=game.mapping,
            populations={
                role: PolicyMixture((population[member],), np.array([1.0]))
                for role, population, member in zip(game.roles, populations, profile)
            },
            episodes=episodes,
            seed=(seed, *profile),
            explore=False,
        )
        for profile in profiles.tolist()
    ]
    columns = [[game.agents.index(agent) for agent in game.agents_of(role)] for role in game.roles]
    mean = np.empty((len(profiles), game.num_roles))
    stderr = np.empty_like(mean)
    for i, (profile, result) in enumerate(zip(profiles.tolist(), pool.collect(requests, progress=progress))):
        returns = result.episode_returns
        if not np.all(np.isfinite(returns)):
            raise ValueError(f"game {game.name!r} returned a non-finite return for profile {profile}")
        per_role = np.stack([returns[:, agents].mean(axis=1) for agents in columns], axis=1)  # [episodes, roles]
        mean[i] = per_role.mean(axis=0)
        stderr[i] = per_role.std(axis=0, ddof=1) / np.sqrt(episodes) if episodes > 1 else np.inf
    return ProfilePayoffs(mean=mean, stderr=stderr, episodes=np.full(len(profiles), episodes))


def _checked_profiles(game: PSROGame, populations: list[Population], profiles, episodes: int) -> np.ndarray:
    """The profiles as an [m, num_roles] int array; a one-line error for anything that does not fit."""
    roles = [population.role for population in populations]
    if roles != list(game.roles):
        raise ValueError(
            f"{game.name}: populations are for roles {roles}; the game's roles are {list(game.roles)}, in that order"
        )
    if not isinstance(episodes, (int, np.integer)) or episodes < 1:
        raise ValueError(f"episodes must be a positive integer, got {episodes!r}")
    profiles = np.asarray(profiles, dtype=np.int64)
    if profiles.ndim != 2 or profiles.shape[1] != game.num_roles:
        raise ValueError(
            f"{game.name}: profiles must be [m, {game.num_roles}] member indices, got shape {profiles.shape}"
        )
    sizes = np.array([len(population) for population in populations])
    outside = (profiles < 0) | (profiles >= sizes)
    if outside.any():
        row = profiles[np.flatnonzero(outside.any(axis=1))[0]].tolist()
        raise ValueError(f"{game.name}: profile {row} names a member outside the populations' sizes {sizes.tolist()}")
    return profiles
