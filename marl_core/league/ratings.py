"""Ratings of a league's players from the games they played: Elo, and a Bayesian skill rating
(`openskill`'s Plackett-Luce model, the maintained successor of TrueSkill-style ratings).

Both are updated game by game, in the order the games are recorded. Elo keeps a point estimate
on a 400-point scale: the home side's expected score is `1 / (1 + 10^((away - home) / 400))`
and each side moves by `k` times its score minus its expected score. The skill rating keeps a
mean `mu` and an uncertainty `sigma` per player; `sigma` is the confidence printed beside it,
and `mu - 3 sigma` (openskill's `ordinal`) is the conservative figure a ranking sorts by.

How results map to ranks: a win ranks the winner first, a draw ranks both sides equal (Elo: a
score of 0.5 each); a game cut off by a time limit is scored on the returns it had
(`marl_core.league.match_table.Outcome`). Team games rate every member of a side: the skill
rating natively (teams are lists of players), Elo by rating a side at its members' mean and
moving every member by the side's change.

A snapshot starts with its parent's rating at the moment it is taken: it is the same policy.

Where one game says little, several are rated as one match (`games_per_match`): a pairing's
consecutive games are summed, and the side with the larger total wins the match. A poker hand
is won or lost mostly by who folds, not by who plays better; a session of hands is not (on Leduc,
matches of 50 hands rank a league's main agents in the order of their exploitability, single
hands do not: docs/leagues.md). A match in progress is part of the ratings' state. `games`
counts rated results: games, or matches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from marl_core.league.match_table import Game, Outcome


class RatingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    elo_k: float = Field(
        32.0, gt=0, description="Elo's K: points a game can move a rating (DI-engine's EloCalculator: 32)"
    )
    elo_initial: float = Field(1000.0, description="a new player's Elo")
    mu: float = Field(25.0, description="a new player's skill mean (openskill's default)")
    sigma: float = Field(25.0 / 3, gt=0, description="a new player's skill uncertainty (openskill's default)")
    beta: float = Field(
        25.0 / 6, gt=0, description="the skill difference that gives about 76% odds (openskill's default)"
    )
    tau: float = Field(
        25.0 / 300, ge=0, description="uncertainty added before each game, so ratings keep moving (openskill's default)"
    )
    games_per_match: int = Field(
        1,
        ge=1,
        description="consecutive games of one pairing rated as one match, won by the larger summed return "
        "(a poker session); 1: every game",
    )


def elo_expected(home: float, away: float) -> float:
    """The home side's expected score against the away side."""
    return 1.0 / (1.0 + 10.0 ** ((away - home) / 400.0))


@dataclasses.dataclass(frozen=True)
class Rating:
    elo: float
    mu: float
    sigma: float
    games: int

    @property
    def ordinal(self) -> float:
        """mu - 3 sigma: a rating the player exceeds with high probability."""
        return self.mu - 3.0 * self.sigma


class Ratings:
    """Every player's Elo and skill rating, updated one game (or team game) at a time."""

    def __init__(self, settings: RatingSettings = RatingSettings()):
        from openskill.models import PlackettLuce

        self.settings = settings
        self._model = PlackettLuce(mu=settings.mu, sigma=settings.sigma, beta=settings.beta, tau=settings.tau)
        self._ratings: dict[str, Rating] = {}
        self._matches: dict[
            tuple[str, str], list[float]
        ] = {}  # (home, away) in play -> [games, home total, away total]

    def __contains__(self, player: str) -> bool:
        return player in self._ratings

    def __getitem__(self, player: str) -> Rating:
        return self._ratings[player]

    @property
    def players(self) -> list[str]:
        return list(self._ratings)

    def add(self, player: str, like: str | None = None) -> None:
        """A new player, rated as `like` is now (a snapshot of it), else at the initial ratings."""
        if player in self._ratings:
            raise ValueError(f"player {player!r} is already rated")
        s = self.settings
        self._ratings[player] = (
            dataclasses.replace(self._ratings[like], games=0) if like else Rating(s.elo_initial, s.mu, s.sigma, 0)
        )

    def reset(self, player: str, like: str) -> None:
        """`player` is rated as `like` is now: it went back to the policy `like` holds."""
        self._ratings[player] = dataclasses.replace(self._ratings[like], games=self._ratings[player].games)

    def record(self, game: Game) -> None:
        """A two-sided game between single players: rated at once, or as part of its pairing's
        match (`games_per_match`), rated when the match is complete."""
        if self.settings.games_per_match == 1 or game.home == game.away:
            self.record_teams([[game.home], [game.away]], game.outcome)
            return
        pairing = tuple(sorted((game.home, game.away)))
        own, theirs = (
            (game.home_return, game.away_return) if pairing[0] == game.home else (game.away_return, game.home_return)
        )
        match = self._matches.setdefault(pairing, [0, 0.0, 0.0])
        match[0], match[1], match[2] = match[0] + 1, match[1] + own, match[2] + theirs
        if match[0] == self.settings.games_per_match:
            del self._matches[pairing]
            self.record_teams([[pairing[0]], [pairing[1]]], Game(pairing[0], pairing[1], match[1], match[2]).outcome)

    def record_teams(self, teams: Sequence[Sequence[str]], outcome: Outcome) -> None:
        """A game between two teams (lists of players); `outcome` is the first team's."""
        if len(teams) != 2 or not all(teams):
            raise ValueError(f"a rated game has two sides of at least one player each, got {[list(t) for t in teams]}")
        for player in (p for team in teams for p in team):
            if player not in self._ratings:
                raise ValueError(f"player {player!r} is not rated; the rated players are {sorted(self._ratings)}")
        if set(teams[0]) & set(teams[1]):
            # A policy against itself: the result says nothing about its skill.
            for player in {p for team in teams for p in team}:
                self._ratings[player] = dataclasses.replace(
                    self._ratings[player], games=self._ratings[player].games + 1
                )
            return
        elo = self._elo_changes(teams, outcome.score)
        ranks = {Outcome.WIN: [1, 2], Outcome.DRAW: [1, 1], Outcome.LOSS: [2, 1]}[outcome]
        rated = self._model.rate(
            [
                [self._model.rating(mu=self._ratings[p].mu, sigma=self._ratings[p].sigma) for p in team]
                for team in teams
            ],
            ranks=ranks,
        )
        for side, team in enumerate(teams):
            for player, skill in zip(team, rated[side]):
                old = self._ratings[player]
                self._ratings[player] = Rating(old.elo + elo[side], float(skill.mu), float(skill.sigma), old.games + 1)

    def _elo_changes(self, teams, home_score: float) -> tuple[float, float]:
        home, away = (sum(self._ratings[p].elo for p in team) / len(team) for team in teams)
        expected = elo_expected(home, away)
        change = self.settings.elo_k * (home_score - expected)
        return change, -change

    def win_probability(self, home: str, away: str) -> float:
        """The skill model's probability that `home` beats `away`."""
        a, b = (self._model.rating(mu=self._ratings[p].mu, sigma=self._ratings[p].sigma) for p in (home, away))
        return float(self._model.predict_win([[a], [b]])[0])

    def table(self) -> list[dict]:
        """One row per player, best conservative skill first."""
        rows = [{"player": p, **dataclasses.asdict(r), "ordinal": r.ordinal} for p, r in self._ratings.items()]
        return sorted(rows, key=lambda row: -row["ordinal"])

    def state(self) -> dict:
        matches = [[home, away, *match] for (home, away), match in self._matches.items()]
        return {
            "settings": self.settings.model_dump(),
            "ratings": {p: dataclasses.asdict(r) for p, r in self._ratings.items()},
            "matches": matches,
        }

    @classmethod
    def from_state(cls, state: dict) -> Ratings:
        ratings = cls(RatingSettings(**state["settings"]))
        ratings._ratings = {p: Rating(**r) for p, r in state["ratings"].items()}
        ratings._matches = {
            (home, away): [int(games), float(a), float(b)] for home, away, games, a, b in state.get("matches", [])
        }
        return ratings
