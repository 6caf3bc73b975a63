"""A finished neural CFR run's members, exported in the format `scripts/verify_export.py` checks
with OpenSpiel alone: one member per player (its average-policy network's table), each with
weight 1, and the network itself beside it (description and weights only)."""

from __future__ import annotations

import json
from pathlib import Path

from marl_core.games.exploitability import NashConvReport
from marl_core.games.tree import build_tree
from marl_core.policies.neural import NeuralPolicy
from marl_core.policies.storage import save_policy
from marl_core.policies.tabular import policy_to_dict
from marl_core.policies.tabularize import tabularize
from marl_core.rl import AVERAGE_POLICY


def as_member(network, game: str, player: int, tabular: bool = True) -> NeuralPolicy:
    """An average-policy network as a population member, with its table where the tree fits."""
    table = tabularize(network, build_tree(game), player) if tabular else None
    return NeuralPolicy(AVERAGE_POLICY, network.settings(), network.obs_size, network.num_actions, network, table)


def write_export(
    directory: Path, game: str, networks: list, report: NashConvReport, iterations: int, wall_seconds: float
) -> Path:
    directory = Path(directory)
    tree = build_tree(game)
    for player, network in enumerate(networks):
        member = as_member(network, game, player)
        folder = directory / "policies" / f"player_{player}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "member_0.json").write_text(json.dumps(policy_to_dict(tree.players[player], member.table)))
        save_policy(folder / "member_0", member, game, player)
    (directory / "meta_strategy.json").write_text(json.dumps({"0": [1.0], "1": [1.0]}))
    summary = {
        "game": game,
        "configured_game": game,
        "roles": ["player_0", "player_1"],
        "num_players": 2,
        "method": "neural_cfr",
        "iterations": iterations,
        "wall_seconds": wall_seconds,
        "nash_conv": report.nash_conv,
        "exploitability": report.exploitability,
    }
    (directory / "summary.json").write_text(json.dumps(summary, indent=1))
    return directory
