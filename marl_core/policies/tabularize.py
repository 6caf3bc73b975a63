"""Turn a network policy into a tabular one by asking it at every information state.

Why: on an OpenSpiel game the exact machinery (payoffs, NashConv, the export OpenSpiel checks)
works on tabular policies. A learned best response joins its population as the action
distribution its network gives at each information state, so every number reported for a
learned population is exact for the policy that was actually learned, not a sampled estimate.
"""

from __future__ import annotations

import functools

import numpy as np

from marl_core.games.openspiel import load_game
from marl_core.games.tree import GameTree, build_tree
from marl_core.policies.tabular import check_policy


@functools.lru_cache(maxsize=8)
def infostate_observations(game_string: str) -> tuple[np.ndarray, ...]:
    """Per player, the observation vector [I_p, O] of every information state in tree order.

    The vector is what `OpenSpielEnv` shows an agent (the information-state tensor), so a
    network sees the same input here as during rollouts.
    """
    game = load_game(game_string)
    tree = build_tree(game_string)
    has_tensor = game.get_type().provides_information_state_tensor
    observations = [np.zeros((p.num_infostates, _observation_size(game, has_tensor)), np.float32) for p in tree.players]
    seen = [np.zeros(p.num_infostates, dtype=bool) for p in tree.players]
    stack = [game.new_initial_state()]
    while stack:
        state = stack.pop()
        if state.is_terminal():
            continue
        if state.is_chance_node():
            stack.extend(state.child(action) for action, prob in state.chance_outcomes() if prob > 0)
            continue
        player = state.current_player()
        row = tree.players[player].index[state.information_state_string(player)]
        if not seen[player][row]:
            seen[player][row] = True
            tensor = state.information_state_tensor(player) if has_tensor else state.observation_tensor(player)
            observations[player][row] = tensor
        stack.extend(state.child(action) for action in state.legal_actions())
    return tuple(observations)


def _observation_size(game, has_tensor: bool) -> int:
    shape = game.information_state_tensor_shape() if has_tensor else game.observation_tensor_shape()
    return int(np.prod(shape))


def tabularize(policy, tree: GameTree, player: int) -> np.ndarray:
    """[I, A] action probabilities of a policy (anything with `action_probs(obs, mask)`)."""
    player_tree = tree.players[player]
    observations = infostate_observations(tree.game_string)[player]
    probs = np.asarray(policy.action_probs(observations, player_tree.legal), dtype=np.float64)
    probs = np.where(player_tree.legal, probs, 0.0)
    probs /= probs.sum(axis=1, keepdims=True)
    check_policy(player_tree, probs)
    return probs


def tabular_forms(populations, tree: GameTree) -> list[np.ndarray]:
    """Every population's members as tables [K, I, A]: the stacked tables where the population
    keeps them, else each member's table, a network asked at every information state."""
    forms = []
    for role, population in enumerate(populations):
        if population.tables is not None:
            forms.append(population.tables)
            continue
        forms.append(
            np.stack(
                [
                    member.tabular if member.tabular is not None else tabularize(member.network, tree, role)
                    for member in population.members
                ]
            )
        )
    return forms
