"""Payoff evaluators: fill payoff-table entries for a list of profiles.

`exact` computes expected returns over the whole game tree (sequence form), each profile summed on
its own so that its payoff is the same float whichever batch it is evaluated in.
`sampled` plays N episodes of the real game per profile and records the standard error of the
mean, as an estimate would be made for a game too large to walk. Each profile draws from its own
seeded stream, so results do not depend on how profiles are split across workers.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from marl_core.games.tree import GameTree, sequence_reach
from marl_core.games.openspiel import load_game
from marl_core.registry import Registry


@dataclasses.dataclass(frozen=True)
class ProfilePayoffs:
    mean: np.ndarray  # [m, n]
    stderr: np.ndarray  # [m, n]
    episodes: np.ndarray  # [m]; 0 marks an exact entry


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


def play_episodes(tree: GameTree, policies: list[np.ndarray], episodes: int, rng) -> np.ndarray:
    """Returns [episodes, n] of the real OpenSpiel game with each player on its tabular policy."""
    game = load_game(tree.game_string)
    cumulative = [np.cumsum(policy, axis=1) for policy in policies]
    returns = np.empty((episodes, tree.num_players))
    for episode in range(episodes):
        state = game.new_initial_state()
        while not state.is_terminal():
            if state.is_chance_node():
                actions, probs = zip(*state.chance_outcomes())
                choice = min(np.searchsorted(np.cumsum(probs), rng.random(), side="right"), len(actions) - 1)
                state.apply_action(actions[choice])
                continue
            player = state.current_player()
            row = tree.players[player].index[state.information_state_string(player)]
            cdf = cumulative[player][row]
            state.apply_action(int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1)))
        returns[episode] = state.returns()
    return returns


def evaluate_sampled(tree: GameTree, populations, profiles, *, episodes: int, seed: int) -> ProfilePayoffs:
    profiles = np.asarray(profiles, dtype=np.int64).reshape(-1, tree.num_players)
    mean = np.empty((len(profiles), tree.num_players))
    stderr = np.empty_like(mean)
    for i, profile in enumerate(profiles):
        rng = np.random.default_rng([seed, *profile.tolist()])
        policies = [populations[p][k] for p, k in enumerate(profile)]
        returns = play_episodes(tree, policies, episodes, rng)
        if not np.all(np.isfinite(returns)):
            raise ValueError(f"game {tree.game_string!r} returned a non-finite reward for profile {profile.tolist()}")
        mean[i] = returns.mean(axis=0)
        stderr[i] = returns.std(axis=0, ddof=1) / np.sqrt(episodes) if episodes > 1 else np.inf
    return ProfilePayoffs(mean=mean, stderr=stderr, episodes=np.full(len(profiles), episodes))


EVALUATORS: Registry[EvaluateFn] = Registry("evaluator")
EVALUATORS.add("exact", evaluate_exact)
EVALUATORS.add("sampled", evaluate_sampled)
