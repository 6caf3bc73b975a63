"""Payoff evaluators: fill payoff-table entries for a list of profiles.

`exact` computes expected returns over the whole game tree (sequence form), each profile summed on
its own so that its payoff is the same float whichever batch it is evaluated in.
`sampled` plays N episodes per profile on the rollout workers, on any environment, and records
the standard error of the mean (`marl_core.empirical_game.sampled`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from marl_core.empirical_game.payoffs import ProfilePayoffs
from marl_core.games.tree import GameTree, build_tree, sequence_reach
from marl_core.registry import Registry

EvaluateFn = Callable[..., ProfilePayoffs]


def _used_members(populations, profiles: np.ndarray):
    """Per player, the members some profile uses and each profile's position among them."""
    for player, population in enumerate(populations):
        members, position = np.unique(profiles[:, player], return_inverse=True)
        yield player, population[members], position


def evaluate_exact(tree: GameTree, populations, profiles, **_unused) -> ProfilePayoffs:
    profiles = np.asarray(profiles, dtype=np.int64).reshape(-1, tree.num_players)
    weight = np.ones((len(profiles), len(tree.chance_reach)))
    for player, members, position in _used_members(populations, profiles):
        player_tree = tree.players[player]
        terminal_reach = sequence_reach(player_tree, members)[:, player_tree.terminal_seq]
        weight *= terminal_reach[position]
    mean = tree.expected_returns(weight)
    zeros = np.zeros(len(profiles), dtype=np.int64)
    return ProfilePayoffs(mean=mean, stderr=np.zeros_like(mean), episodes=zeros)


def _exact(game, populations, profiles, **_unused) -> ProfilePayoffs:
    from marl_core.policies.population import stacked_tables

    return evaluate_exact(build_tree(game.name), stacked_tables(populations), profiles)


def _sampled(game, populations, profiles, *, episodes: int, seed: int, pool=None, progress=None) -> ProfilePayoffs:
    from marl_core.empirical_game.sampled import evaluate_by_rollouts
    from marl_core.rollout.pool import pool_or_local

    with pool_or_local(pool, game.make_env) as workers:
        return evaluate_by_rollouts(
            workers, game, populations, profiles, episodes=episodes, seed=seed, progress=progress
        )


# Every evaluator takes (game: PSROGame, populations: list[Population], profiles, *, episodes,
# seed, pool=None, progress=None); `pool` is the run's rollout workers, where it has some, and
# `progress` the open work its episodes count towards.
EVALUATORS: Registry[EvaluateFn] = Registry("evaluator")
EVALUATORS.add("exact", _exact, "expected payoffs computed exactly over the game tree")
EVALUATORS.add("sampled", _sampled, "mean returns of rollouts, with their standard errors")
