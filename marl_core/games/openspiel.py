"""OpenSpiel games: load a game string once, check it fits PSRO, and say clearly when it does not.

PSRO here works on sequential games with perfect recall and information-state strings.
Simultaneous-move games are converted to turn-based ones (each player moves in turn without
seeing the others' moves), which keeps their information structure and equilibria.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys

import pyspiel


class GameError(ValueError):
    """A game string that cannot be loaded or does not fit PSRO's requirements."""


_SUPPORTED_DYNAMICS = (pyspiel.GameType.Dynamics.SEQUENTIAL, pyspiel.GameType.Dynamics.SIMULTANEOUS)


def _unfit_reason(game_type: pyspiel.GameType) -> str | None:
    if game_type.dynamics not in _SUPPORTED_DYNAMICS:
        return "only sequential and simultaneous-move games are supported"
    if not game_type.provides_information_state_string:
        return "it provides no information-state strings"
    if game_type.chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC:
        return "its chance outcomes are sampled, so exact methods cannot enumerate them"
    return None


@contextlib.contextmanager
def _native_stderr_silenced():
    """OpenSpiel's C++ prints its whole game list to stderr on a bad name; keep errors one line."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@functools.lru_cache(maxsize=32)
def load_game(game_string: str) -> pyspiel.Game:
    """Load and validate a game string such as ``kuhn_poker(players=3)``."""
    if not isinstance(game_string, str) or not game_string.strip():
        raise GameError(f"game string {game_string!r} is empty; run `psro games` to list games")
    name = re.split(r"[(\s]", game_string.strip(), maxsplit=1)[0]
    if name not in pyspiel.registered_names():
        where = "" if name == game_string.strip() else f" in {game_string!r}"
        raise GameError(f"unknown game {name!r}{where}; run `psro games` to list games")
    try:
        with _native_stderr_silenced():
            game = pyspiel.load_game(game_string)
    except pyspiel.SpielError as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "unknown error"
        detail = detail.split(" Available games are")[0].rstrip(". :")
        raise GameError(f"cannot load game {game_string!r} ({detail}); run `psro games` to list games") from None
    reason = _unfit_reason(game.get_type())
    if reason:
        raise GameError(f"game {game_string!r} cannot be used: {reason}")
    if game.get_type().dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
        game = pyspiel.convert_to_turn_based(game)
    return game


def is_zero_sum(game: pyspiel.Game) -> bool:
    return game.get_type().utility == pyspiel.GameType.Utility.ZERO_SUM


def supported_games() -> list[pyspiel.GameType]:
    """Registered OpenSpiel games that PSRO accepts, sorted by short name."""
    types = [t for t in pyspiel.registered_games() if _unfit_reason(t) is None]
    return sorted(types, key=lambda t: t.short_name)
