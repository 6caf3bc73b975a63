"""Export a finished run in a format anyone can check with OpenSpiel alone.

DIR/summary.json, DIR/meta_strategy.json and DIR/policies/player_<p>/member_<k>.json; see
`scripts/verify_export.py` for the check itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from marl_core.exploitability import NashConvReport
from marl_core.game_tree import build_tree
from marl_core.policies import policy_to_dict


def write_export(directory: Path, config, populations, meta_strategy, report: NashConvReport, iterations: int, wall_seconds: float) -> Path:
    directory = Path(directory)
    tree = build_tree(config.game)
    for player, population in enumerate(populations):
        folder = directory / "policies" / f"player_{player}"
        folder.mkdir(parents=True, exist_ok=True)
        for member, policy in enumerate(population):
            table = policy_to_dict(tree.players[player], policy)
            (folder / f"member_{member}.json").write_text(json.dumps(table))
    weights = {str(player): [float(w) for w in strategy] for player, strategy in enumerate(meta_strategy)}
    (directory / "meta_strategy.json").write_text(json.dumps(weights, indent=1))
    summary = {
        "game": config.game,
        "num_players": tree.num_players,
        "iterations": iterations,
        "nash_conv": report.nash_conv,
        "exploitability": report.exploitability,
        "meta_solver": config.meta_solver,
        "oracle": config.oracle,
        "wall_seconds": wall_seconds,
    }
    (directory / "summary.json").write_text(json.dumps(summary, indent=1))
    return directory
