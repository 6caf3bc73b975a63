"""Population members round-trip through the stored JSON format exactly, and loading refuses
policies that are not distributions over legal actions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from marl_core.games.tree import build_tree
from marl_core.policies.tabular import policy_from_dict, policy_to_dict


def _random_policy(player_tree, seed):
    weights = np.random.default_rng(seed).random(player_tree.legal.shape) * player_tree.legal
    return weights / weights.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("game", ["kuhn_poker", "leduc_poker", "kuhn_poker(players=3)"])
def test_json_round_trip_is_exact(game):
    tree = build_tree(game)
    for player, player_tree in enumerate(tree.players):
        policy = _random_policy(player_tree, seed=player)
        stored = json.loads(json.dumps(policy_to_dict(player_tree, policy)))
        assert len(stored) == player_tree.num_infostates
        np.testing.assert_array_equal(policy_from_dict(player_tree, stored), policy)


def test_loading_refuses_mass_on_illegal_actions_and_missing_states():
    player_tree = build_tree("leduc_poker").players[0]
    table = policy_to_dict(player_tree, player_tree.uniform_policy())
    state, row = next((s, r) for s, r in table.items() if 0 in r)  # a state with an illegal action
    bad = dict(table, **{state: [1.0 if p == 0 else 0.0 for p in row]})
    with pytest.raises(ValueError, match="illegal actions"):
        policy_from_dict(player_tree, bad)
    missing = {s: r for s, r in table.items() if s != state}
    with pytest.raises(ValueError, match="lacks 1 information states"):
        policy_from_dict(player_tree, missing)
    unnormalised = dict(table, **{state: [2 * p for p in row]})
    with pytest.raises(ValueError, match="probability distributions"):
        policy_from_dict(player_tree, unnormalised)
