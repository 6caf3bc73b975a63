"""Export a finished run in a format anyone can check with OpenSpiel alone.

DIR/summary.json, DIR/meta_strategy.json and DIR/policies/<role>/member_<k>.json (an OpenSpiel
game's roles are player_0, player_1, ...); see `scripts/verify_export.py` for the check itself.
Network members are also written as DIR/policies/<role>/member_<k>/ (weights and description).

summary.json's "game" is the string `pyspiel.load_game` turns into the game the policies are keyed
by. For a simultaneous-move game that is not the configured game: PSRO plays its turn-based
conversion, whose information states differ, so "game" names the conversion (loadable as is,
e.g. "turn_based_simultaneous_game(game=matrix_rps())") and "configured_game" keeps what the run
was given.
"""

from __future__ import annotations

import json
from pathlib import Path

from marl_core.empirical_game.game import psro_game_of
from marl_core.games.exploitability import NashConvReport
from marl_core.games.openspiel import load_game
from marl_core.games.tree import build_tree
from marl_core.policies.tabular import policy_to_dict


def write_export(
    directory: Path,
    config,
    populations,
    meta_strategy,
    report: NashConvReport | None,
    iterations: int,
    wall_seconds: float,
    approx=None,
) -> Path:
    """`populations`: one `Population` per role. Members with a table are written as the
    OpenSpiel-checkable JSON; network members also as `member_<k>/` (network.json + weights.pt,
    weights only). `report` is the exact NashConv where the tree fits; `approx` the approximate one."""
    from marl_core.policies.storage import save_policy

    directory = Path(directory)
    game = psro_game_of(config)
    tree = build_tree(config.game) if game.has_tree else None
    for role_index, population in enumerate(populations):
        folder = directory / "policies" / population.role
        folder.mkdir(parents=True, exist_ok=True)
        for member, policy in enumerate(population.members):
            if tree is not None and policy.tabular is not None:
                table = policy_to_dict(tree.players[role_index], policy.tabular)
                (folder / f"member_{member}.json").write_text(json.dumps(table))
            if policy.kind != "tabular":
                save_policy(
                    folder / f"member_{member}",
                    policy,
                    *((config.game, role_index) if tree is not None else (None, None)),
                )
    weights = {
        str(r): [float(w) for w in strategy] for r, strategy in enumerate(meta_strategy)
    }  # by role index, as verify_export reads
    (directory / "meta_strategy.json").write_text(json.dumps(weights, indent=1))
    summary = {
        "game": openspiel_game_string(config.game) if game.is_openspiel else config.game,
        "configured_game": config.game,
        "roles": list(game.roles),
        "num_players": game.num_roles,
        "iterations": iterations,
        "meta_solver": config.meta_solver,
        "oracle": config.oracle,
        "wall_seconds": wall_seconds,
    }
    if report is not None:
        summary.update(nash_conv=report.nash_conv, exploitability=report.exploitability)
    if approx is not None:
        summary.update(
            approx_nash_conv=approx.nash_conv,
            approx_nash_conv_stderr=approx.nash_conv_stderr,
            approx_exploitability=approx.exploitability,
            approx_exploitability_stderr=approx.exploitability_stderr,
        )
    (directory / "summary.json").write_text(json.dumps(summary, indent=1))
    return directory


def openspiel_game_string(game: str) -> str:
    """The game string that loads, with OpenSpiel alone, the game PSRO trained on.

    A turn-based game is loaded from its own string; a simultaneous one from the string of the
    conversion `load_game` made, which OpenSpiel spells with every parameter and loads back.
    """
    loaded = load_game(game)
    return str(loaded) if loaded.get_type().short_name == "turn_based_simultaneous_game" else game
