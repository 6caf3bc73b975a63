"""Export a finished run in a format anyone can check with OpenSpiel alone.

DIR/summary.json, DIR/meta_strategy.json and DIR/policies/player_<p>/member_<k>.json; see
`scripts/verify_export.py` for the check itself.

summary.json's "game" is the string `pyspiel.load_game` turns into the game the policies are keyed
by. For a simultaneous-move game that is not the configured game: PSRO plays its turn-based
conversion, whose information states differ, so "game" names the conversion (loadable as is,
e.g. "turn_based_simultaneous_game(game=matrix_rps())") and "configured_game" keeps what the run
was given.
"""

from __future__ import annotations

import json
from pathlib import Path

from marl_core.games.exploitability import NashConvReport
from marl_core.games.tree import build_tree
from marl_core.games.openspiel import load_game
from marl_core.policies.tabular import policy_to_dict


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
        "game": openspiel_game_string(config.game),
        "configured_game": config.game,
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


def openspiel_game_string(game: str) -> str:
    """The game string that loads, with OpenSpiel alone, the game PSRO trained on.

    A turn-based game is loaded from its own string; a simultaneous one from the string of the
    conversion `load_game` made, which OpenSpiel spells with every parameter and loads back.
    """
    loaded = load_game(game)
    return str(loaded) if loaded.get_type().short_name == "turn_based_simultaneous_game" else game
