"""Who played whom, and how it went: AlphaStar's payoff table over a league's players.

Every game between a home and an away player updates the pair in both directions: the pair's
counts first decay by `decay` (AlphaStar: 0.99), then the game is added. So a win rate follows
the players as they change rather than their whole history. A win rate is
`(wins + draws / 2) / games`, and a pair that never played counts as 0.5.

A game's outcome comes from the two sides' returns: the higher return wins, equal returns draw.
An episode cut off by a time limit is scored the same way, on the returns it collected so far
(a Pong rally cut by its serve timer is a draw when the score is level). A player against
itself (self-play with live weights) scores each game once as a win and once as a loss, as
AlphaStar's table does, so its win rate against itself stays near one half.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence

import numpy as np


class Outcome(enum.IntEnum):
    """A game's result for the home side; its value is what the game scores (ratings, win rates)
    doubled, so it stays an integer."""

    LOSS = 0
    DRAW = 1
    WIN = 2

    @classmethod
    def of(cls, home_return: float, away_return: float) -> Outcome:
        if home_return > away_return:
            return cls.WIN
        if home_return < away_return:
            return cls.LOSS
        return cls.DRAW

    @property
    def score(self) -> float:
        """1 for a win, 0.5 for a draw, 0 for a loss."""
        return self.value / 2

    @property
    def reversed(self) -> Outcome:
        return Outcome(2 - self.value)


@dataclasses.dataclass(frozen=True)
class Game:
    """One finished game: the home player's id, the away player's, and each side's return."""

    home: str
    away: str
    home_return: float
    away_return: float

    @property
    def outcome(self) -> Outcome:
        return Outcome.of(self.home_return, self.away_return)


@dataclasses.dataclass
class PairRecord:
    """A pair's decayed counts, from the home side's point of view."""

    games: float = 0.0
    wins: float = 0.0
    draws: float = 0.0
    losses: float = 0.0
    returns: float = 0.0  # the home side's returns, summed with the same decay

    def decayed(self, decay: float) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) * decay)

    def add(self, outcome: Outcome, home_return: float) -> None:
        self.games += 1
        self.wins += outcome is Outcome.WIN
        self.draws += outcome is Outcome.DRAW
        self.losses += outcome is Outcome.LOSS
        self.returns += home_return

    @property
    def win_rate(self) -> float:
        return 0.5 if self.games == 0 else (self.wins + 0.5 * self.draws) / self.games

    @property
    def mean_return(self) -> float:
        return float("nan") if self.games == 0 else self.returns / self.games


class MatchTable:
    def __init__(self, decay: float = 0.99):
        if not 0 < decay <= 1:
            raise ValueError(f"decay={decay!r}: must lie in (0, 1]")
        self.decay = decay
        self._pairs: dict[tuple[str, str], PairRecord] = {}
        self.players: list[str] = []  # in the order they joined

    def add_player(self, player: str) -> None:
        if player in self.players:
            raise ValueError(f"player {player!r} is already in the match table")
        self.players.append(player)

    def record(self, game: Game) -> None:
        for player in (game.home, game.away):
            if player not in self.players:
                raise ValueError(f"player {player!r} is not in the match table; its players are {self.players}")
        outcome = game.outcome
        home, away = self.pair(game.home, game.away), self.pair(game.away, game.home)
        home.decayed(self.decay)
        away.decayed(self.decay)
        home.add(outcome, game.home_return)
        away.add(outcome.reversed, game.away_return)

    def record_all(self, games: Iterable[Game]) -> None:
        for game in games:
            self.record(game)

    def pair(self, home: str, away: str) -> PairRecord:
        return self._pairs.setdefault((home, away), PairRecord())

    def win_rate(self, home: str, away: str) -> float:
        record = self._pairs.get((home, away))
        return 0.5 if record is None else record.win_rate

    def win_rates(self, home: str, aways: Sequence[str]) -> np.ndarray:
        return np.array([self.win_rate(home, away) for away in aways], dtype=np.float64)

    def rows(self) -> list[dict]:
        """Every played pair as one row: what MLflow logs and what a resumed run reloads."""
        return [
            {
                "home": home,
                "away": away,
                **dataclasses.asdict(record),
                "win_rate": record.win_rate,
                "mean_return": record.mean_return,
            }
            for (home, away), record in self._pairs.items()
            if record.games > 0
        ]

    def state(self) -> dict:
        fields = [f.name for f in dataclasses.fields(PairRecord)]
        return {
            "decay": self.decay,
            "players": list(self.players),
            "pairs": [
                [home, away, *(getattr(record, f) for f in fields)] for (home, away), record in self._pairs.items()
            ],
        }

    @classmethod
    def from_state(cls, state: dict) -> MatchTable:
        table = cls(state["decay"])
        table.players = list(state["players"])
        for home, away, *counts in state["pairs"]:
            table._pairs[home, away] = PairRecord(*map(float, counts))
        return table

    def win_rate_matrix(self, players: Sequence[str] | None = None) -> np.ndarray:
        """[home, away] win rates over `players` (default: all), 0.5 where a pair never played."""
        players = self.players if players is None else players
        return np.array([self.win_rates(home, players) for home in players], dtype=np.float64).reshape(
            len(players), len(players)
        )
