"""Check an exported PSRO result with OpenSpiel alone.

The framework reports the NashConv of its final meta-strategy mixture using its own
vectorised evaluator. This script recomputes that number with nothing but OpenSpiel's
reference code, so anyone can check a result without trusting (or even installing) the
framework:

* every population member is rebuilt as an ``open_spiel.python.policy.TabularPolicy``,
* the members are mixed with ``policy_aggregator.PolicyAggregator`` (the same call that
  OpenSpiel's ``psro_v2_example.py`` uses), and
* ``exploitability.nash_conv`` measures the mixture.

Usage::

    python scripts/verify_export.py DIR [--tolerance 1e-6]

Export layout read from ``DIR``:

* ``summary.json``: ``{"game": ..., "num_players": n, "nash_conv": x, "exploitability": x / n, ...}``;
  ``game`` loads with ``pyspiel.load_game`` alone (a simultaneous-move game is named by its
  turn-based conversion, ``turn_based_simultaneous_game(game=...)``, which PSRO plays).
* ``meta_strategy.json``: ``{"0": [w, ...], "1": [...]}``, per player weights in population order.
* ``policies/player_<p>/member_<k>.json``: ``{info state string: [prob of action 0..A-1]}``.

Exit status: 0 when the reported NashConv matches OpenSpiel's within the tolerance, 1 when
it does not, 2 when the export itself is malformed (missing file, missing information
state, weights that do not sum to 1, ...).

Deliberately imports only json, argparse, pathlib, numpy, pyspiel and open_spiel.python.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np
import pyspiel
from open_spiel.python import policy as policy_lib
from open_spiel.python.algorithms import exploitability, policy_aggregator

# How far a probability row may be from a distribution before the export is rejected. This is
# about the file being well formed, not about the NashConv tolerance.
DISTRIBUTION_TOLERANCE = 1e-6


class ExportError(ValueError):
    """The export directory is incomplete or does not match the game."""


# --------------------------------------------------------------------------------------------
# Reading the export
# --------------------------------------------------------------------------------------------


def read_json(path: pathlib.Path):
    if not path.is_file():
        raise ExportError(f"missing file {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ExportError(f"{path} is not valid JSON: {exc}") from None


def load_game(game_string: str) -> pyspiel.Game:
    """The game the policies are keyed by, loaded from summary.json's string as it is.

    A simultaneous-move game has no information states to key a policy by here: PSRO plays its
    turn-based conversion, and the export names that conversion.
    """
    try:
        game = pyspiel.load_game(game_string)
    except pyspiel.SpielError as exc:
        raise ExportError(f"OpenSpiel cannot load game {game_string!r}: {exc}") from None
    if game.get_type().dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
        raise ExportError(
            f"game {game_string!r} is a simultaneous-move game; an export names the turn-based "
            f"game its policies are keyed by, turn_based_simultaneous_game(game={game})"
        )
    return game


def member_files(directory: pathlib.Path, player: int) -> list[pathlib.Path]:
    """Member files of one player in population order (member_0, member_1, ...).

    Gaps in the numbering are an error: population order is what ties a member to its
    meta-strategy weight, so a missing member would silently shift every weight after it.
    """
    folder = directory / "policies" / f"player_{player}"
    if not folder.is_dir():
        raise ExportError(f"missing folder {folder}")
    indexed = {}
    for path in folder.glob("member_*.json"):
        suffix = path.stem[len("member_") :]
        if not suffix.isdigit():
            raise ExportError(f"unexpected member file name {path}")
        indexed[int(suffix)] = path
    if not indexed:
        raise ExportError(f"no member_<k>.json files in {folder}")
    expected = list(range(len(indexed)))
    if sorted(indexed) != expected:
        missing = sorted(set(range(max(indexed) + 1)) - set(indexed))
        raise ExportError(f"{folder}: member numbering has gaps, missing member(s) {missing}")
    return [indexed[k] for k in expected]


def load_meta_strategy(directory: pathlib.Path, num_players: int) -> list[np.ndarray]:
    """Per-player weight vectors, checked to be probability distributions."""
    path = directory / "meta_strategy.json"
    raw = read_json(path)
    weights = []
    for player in range(num_players):
        if str(player) not in raw:
            raise ExportError(f"{path} has no weights for player {player}")
        w = np.asarray(raw[str(player)], dtype=np.float64)
        if w.ndim != 1 or w.size == 0:
            raise ExportError(f"{path}: weights of player {player} must be a non-empty list")
        if np.any(w < 0) or abs(w.sum() - 1.0) > DISTRIBUTION_TOLERANCE:
            raise ExportError(f"{path}: weights of player {player} are not a distribution (sum {w.sum():.12g})")
        weights.append(w)
    return weights


def fill_member(
    template: policy_lib.TabularPolicy, player: int, table: dict, path: pathlib.Path
) -> policy_lib.TabularPolicy:
    """A TabularPolicy whose rows for ``player`` come from one member file.

    Copying a template shares its state enumeration, which is the expensive part of building
    a TabularPolicy; only the probability array is per member. The file must cover exactly
    the player's information states: a missing one would otherwise fall back to uniform and
    an unknown one means the file belongs to another game.
    """
    keys = template.states_per_player[player]
    missing = [key for key in keys if key not in table]
    if missing:
        raise ExportError(
            f"{path}: missing {len(missing)} of {len(keys)} information states of player "
            f"{player}, first missing: {missing[0]!r}"
        )
    if len(table) != len(keys):
        unknown = sorted(set(table) - set(keys))
        raise ExportError(
            f"{path}: {len(unknown)} keys are not information states of player {player} "
            f"in this game, e.g. {unknown[0]!r}"
        )
    rows = [template.state_lookup[key] for key in keys]
    member = template.__copy__(copy_action_probability_array=True)
    member.action_probability_array[rows] = _checked_rows(
        [table[key] for key in keys], template.legal_actions_mask[rows], keys, path
    )
    return member


def _checked_rows(values, legal_mask, keys, path) -> np.ndarray:
    """The member's probability rows, rejected unless each is a distribution over legal actions.

    TabularPolicy only reads legal actions, so mass on an illegal action would silently
    vanish and the mixture OpenSpiel evaluates would differ from the one exported. Checked
    for all rows at once (a Leduc member has hundreds) and reported for the first bad one.
    """
    num_actions = legal_mask.shape[1]
    bad_length = [k for k, v in zip(keys, values) if not isinstance(v, list) or len(v) != num_actions]
    if bad_length:
        raise ExportError(f"{path}: state {bad_length[0]!r} does not have {num_actions} action probabilities")
    probs = np.asarray(values, dtype=np.float64)
    problems = {
        "has negative probabilities": np.any(probs < 0, axis=1),
        "puts mass on illegal actions": np.where(legal_mask == 0, probs, 0.0).sum(axis=1) > DISTRIBUTION_TOLERANCE,
        "does not sum to 1": np.abs(probs.sum(axis=1) - 1.0) > DISTRIBUTION_TOLERANCE,
    }
    for problem, bad in problems.items():
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ExportError(f"{path}: state {keys[row]!r} {problem}: {probs[row].tolist()}")
    return probs


def load_population(
    directory: pathlib.Path, template: policy_lib.TabularPolicy, player: int
) -> list[policy_lib.TabularPolicy]:
    return [fill_member(template, player, read_json(path), path) for path in member_files(directory, player)]


# --------------------------------------------------------------------------------------------
# OpenSpiel evaluation
# --------------------------------------------------------------------------------------------


def drop_zero_weights(populations, weights):
    """Remove members whose weight is exactly zero before aggregating.

    PolicyAggregator walks the game tree once per player and, at every node, queries every
    member; its cost is linear in the population size. A member with weight 0.0 contributes
    exactly 0.0 to every reach sum, so removing it leaves the aggregated policy bit-for-bit
    unchanged while Nash meta-strategies usually have small supports.
    """
    kept_policies, kept_weights = [], []
    for members, w in zip(populations, weights):
        keep = [k for k in range(len(members)) if w[k] > 0.0]
        kept_policies.append([members[k] for k in keep])
        kept_weights.append([float(w[k]) for k in keep])
    return kept_policies, kept_weights


def openspiel_nash_conv(game, populations, weights) -> float:
    """NashConv of the meta-strategy mixture, computed as psro_v2_example.py does."""
    policies, mixture_weights = drop_zero_weights(populations, weights)
    aggregator = policy_aggregator.PolicyAggregator(game)
    aggregated = aggregator.aggregate(range(game.num_players()), policies, mixture_weights)
    return float(exploitability.nash_conv(game, aggregated))


def verify(directory, tolerance: float = 1e-6) -> dict:
    """Recompute the export's NashConv with OpenSpiel and compare it with the reported one.

    Raises ExportError when the export is malformed. Returns a dict with the reported and
    recomputed numbers, their absolute difference and ``passed``.
    """
    directory = pathlib.Path(directory)
    start = time.perf_counter()
    summary = read_json(directory / "summary.json")
    for field in ("game", "nash_conv"):
        if field not in summary:
            raise ExportError(f"{directory / 'summary.json'} has no {field!r} field")
    game = load_game(summary["game"])
    num_players = game.num_players()
    if summary.get("num_players", num_players) != num_players:
        raise ExportError(f"summary says {summary['num_players']} players, the game has {num_players}")
    weights = load_meta_strategy(directory, num_players)
    template = policy_lib.TabularPolicy(game)
    populations = [load_population(directory, template, p) for p in range(num_players)]
    for player, (members, w) in enumerate(zip(populations, weights)):
        if len(members) != len(w):
            raise ExportError(f"player {player}: {len(members)} member files but {len(w)} meta-strategy weights")
    loaded = time.perf_counter()
    nash_conv = openspiel_nash_conv(game, populations, weights)
    reported = float(summary["nash_conv"])
    diff = abs(reported - nash_conv)
    return {
        "game": summary["game"],
        "num_players": num_players,
        "population_sizes": [len(m) for m in populations],
        "support_sizes": [int(np.count_nonzero(w)) for w in weights],
        "reported_nash_conv": reported,
        "openspiel_nash_conv": nash_conv,
        "reported_exploitability": float(summary.get("exploitability", reported / num_players)),
        "openspiel_exploitability": nash_conv / num_players,
        "abs_diff": diff,
        "tolerance": tolerance,
        "passed": bool(diff <= tolerance),
        "load_seconds": loaded - start,
        "evaluate_seconds": time.perf_counter() - loaded,
    }


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def print_report(result: dict) -> None:
    print(f"game:                      {result['game']}")
    print(f"population sizes:          {result['population_sizes']} (support {result['support_sizes']})")
    print(f"reported NashConv:         {result['reported_nash_conv']:.12g}")
    print(f"OpenSpiel NashConv:        {result['openspiel_nash_conv']:.12g}")
    print(f"reported exploitability:   {result['reported_exploitability']:.12g}")
    print(f"OpenSpiel exploitability:  {result['openspiel_exploitability']:.12g}")
    print(f"|difference| (NashConv):   {result['abs_diff']:.3g} (tolerance {result['tolerance']:g})")
    print(f"time: load {result['load_seconds']:.2f} s, OpenSpiel evaluation {result['evaluate_seconds']:.2f} s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=pathlib.Path, help="export directory")
    parser.add_argument(
        "--tolerance", type=float, default=1e-6, help="largest accepted |reported - OpenSpiel| NashConv (default 1e-6)"
    )
    args = parser.parse_args(argv)
    try:
        result = verify(args.directory, args.tolerance)
    except ExportError as exc:
        print(f"ERROR: malformed export: {exc}", file=sys.stderr)
        return 2
    print_report(result)
    if result["passed"]:
        print("OK: reported NashConv matches OpenSpiel")
        return 0
    print(
        f"MISMATCH: reported NashConv differs from OpenSpiel's by {result['abs_diff']:.3g} "
        f"> tolerance {result['tolerance']:g}"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
