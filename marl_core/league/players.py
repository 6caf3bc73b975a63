"""The league's members and AlphaStar's matchmaking, as pure functions of the match table.

A *learning player* (a main agent, a main exploiter or a league exploiter) trains; a *snapshot*
is a frozen copy of one, taken when its snapshot rule says so, and never changes again. Each
kind of learning player has its own way of choosing opponents. AlphaStar draws one opponent per
game; here a player trains a whole generation against one opponent distribution, worked out at
the start of the generation from the match table as it then stands (`opponents`), and each
training episode draws its opponent from it. The distribution is the exact mixture of
AlphaStar's branches, which is what its per-game draws converge to while the table stays put.

Candidates are named by id: a learning player's id (its current weights, frozen for the
generation: self-play and exploiters playing main agents) or a snapshot's (`<player>@<n>`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from marl_core.league.match_table import MatchTable
from marl_core.league.pfsp import pfsp
from marl_core.league.settings import LeagueSettings
from marl_core.registry import Registry

MAIN_AGENT, MAIN_EXPLOITER, LEAGUE_EXPLOITER = "main_agent", "main_exploiter", "league_exploiter"
KINDS = (MAIN_AGENT, MAIN_EXPLOITER, LEAGUE_EXPLOITER)


@dataclasses.dataclass
class LearningPlayer:
    id: str  # "<kind>_<n>"
    kind: str
    steps: int = 0  # environment steps it has trained for
    snapshot_steps: int = 0  # `steps` when its last snapshot was taken
    snapshots: int = 0  # how many it has taken


@dataclasses.dataclass(frozen=True)
class Snapshot:
    id: str  # "<parent>@<n>"
    parent: str  # the learning player it copies
    kind: str  # the parent's kind
    generation: int  # the generation at whose end it was taken (0: the seed)


class Distribution(dict):
    """Opponent id -> probability, in the order the league lists its candidates."""

    @classmethod
    def over(cls, ids: Sequence[str], probabilities: Iterable[float]) -> Distribution:
        return cls(zip(ids, map(float, probabilities)))

    @classmethod
    def mix(cls, parts: Iterable[tuple[float, Distribution]]) -> Distribution:
        mixed = cls()
        for share, part in parts:
            for opponent, p in part.items():
                mixed[opponent] = mixed.get(opponent, 0.0) + share * p
        return cls({k: v for k, v in mixed.items() if v > 0})


@dataclasses.dataclass
class League:
    """Who is in the league, and the table of how they fared against each other."""

    settings: LeagueSettings
    players: list[LearningPlayer]
    snapshots: list[Snapshot]
    table: MatchTable

    @classmethod
    def seeded(cls, settings: LeagueSettings) -> League:
        """Every learning player, and one snapshot of each main agent as it starts: AlphaStar's
        seed, without which a main agent would have no past player to draw."""
        counts = {
            MAIN_AGENT: settings.main_agents,
            MAIN_EXPLOITER: settings.main_exploiters,
            LEAGUE_EXPLOITER: settings.league_exploiters,
        }
        players = [LearningPlayer(f"{kind}_{i}", kind) for kind in KINDS for i in range(counts[kind])]
        league = cls(settings, players, [], MatchTable(settings.decay))
        for player in players:
            league.table.add_player(player.id)
        for player in league.of_kind(MAIN_AGENT):
            league.take_snapshot(player, generation=0)
        return league

    def player(self, id: str) -> LearningPlayer:
        return next(p for p in self.players if p.id == id)

    def of_kind(self, kind: str) -> list[LearningPlayer]:
        return [p for p in self.players if p.kind == kind]

    def snapshot_ids(self, parents: Iterable[str] | None = None) -> list[str]:
        wanted = None if parents is None else set(parents)
        return [s.id for s in self.snapshots if wanted is None or s.parent in wanted]

    def take_snapshot(self, player: LearningPlayer, generation: int) -> Snapshot:
        snapshot = Snapshot(f"{player.id}@{player.snapshots}", player.id, player.kind, generation)
        self.snapshots.append(snapshot)
        self.table.add_player(snapshot.id)
        player.snapshots += 1
        player.snapshot_steps = player.steps
        return snapshot

    # --- matchmaking ----------------------------------------------------------------------------

    def opponents(self, player: LearningPlayer) -> Distribution:
        """The distribution `player` draws its opponents from this generation."""
        return MATCHMAKING[player.kind](self, player)

    def _pfsp(self, player: LearningPlayer, candidates: Sequence[str], weighting: str) -> Distribution:
        return Distribution.over(candidates, pfsp(self.table.win_rates(player.id, candidates), weighting))

    def _main_agent(self, player: LearningPlayer) -> Distribution:
        s = self.settings.main_agent
        mains = self.of_kind(MAIN_AGENT)
        parts = [(s.pfsp, self._pfsp(player, self.snapshot_ids(), s.pfsp_weighting))]
        for main in mains:  # the main agent a non-PFSP game is about: uniform over them
            self_play = self._self_play(player, main)
            verification = self._verification(player, main) or self_play
            parts += [(s.verification / len(mains), verification), (s.self_play / len(mains), self_play)]
        return Distribution.mix(parts)

    def _self_play(self, player: LearningPlayer, main: LearningPlayer) -> Distribution:
        s = self.settings.main_agent
        if self.table.win_rate(player.id, main.id) > s.self_play_min_win_rate:
            return Distribution({main.id: 1.0})
        # Too strong an opponent: its snapshots as a curriculum.
        return self._pfsp(player, self.snapshot_ids([main.id]), s.self_play_fallback_weighting)

    def _verification(self, player: LearningPlayer, main: LearningPlayer) -> Distribution | None:
        s = self.settings.main_agent
        exploiters = self.snapshot_ids(p.id for p in self.of_kind(MAIN_EXPLOITER))
        win_rates = self.table.win_rates(player.id, exploiters)
        if len(exploiters) and win_rates.min() < s.exploiter_win_rate:
            return self._pfsp(player, exploiters, s.verification_weighting)
        # Forgetting: its own past snapshots it now loses to, ignoring the recent ones it has
        # not yet overtaken (AlphaStar's monotonic suffix).
        past = self.snapshot_ids([main.id])
        win_rates, past = remove_monotonic_suffix(self.table.win_rates(player.id, past), past)
        if len(past) and win_rates.min() < s.forgetting_win_rate:
            return Distribution.over(past, pfsp(win_rates, s.verification_weighting))
        return None

    def _main_exploiter(self, player: LearningPlayer) -> Distribution:
        s = self.settings.main_exploiter
        mains = self.of_kind(MAIN_AGENT)
        parts = []
        for main in mains:
            if self.table.win_rate(player.id, main.id) > s.min_win_rate:
                parts.append((1 / len(mains), Distribution({main.id: 1.0})))
            else:
                parts.append((1 / len(mains), self._pfsp(player, self.snapshot_ids([main.id]), s.weighting)))
        return Distribution.mix(parts)

    def _league_exploiter(self, player: LearningPlayer) -> Distribution:
        return self._pfsp(player, self.snapshot_ids(), self.settings.league_exploiter.weighting)

    # --- snapshots ------------------------------------------------------------------------------

    def ready_to_snapshot(self, player: LearningPlayer) -> bool:
        """AlphaStar's rule: not before `min_steps`, then once its lowest win rate against the
        opponents it is measured against exceeds `win_rate`, and always after `max_steps`."""
        rule = self.settings.snapshot
        since = player.steps - player.snapshot_steps
        if since < rule.min_steps:
            return False
        if since >= rule.max_steps:
            return True
        measured = [p.id for p in self.of_kind(MAIN_AGENT)] if player.kind == MAIN_EXPLOITER else self.snapshot_ids()
        return bool(measured) and self.table.win_rates(player.id, measured).min() > rule.win_rate

    def resets_at_snapshot(self, player: LearningPlayer, rng: np.random.Generator) -> bool:
        """Whether `player` returns to the initial weights as its snapshot is taken."""
        if player.kind == MAIN_EXPLOITER:
            return self.settings.main_exploiter.reset_on_snapshot
        if player.kind == LEAGUE_EXPLOITER:
            return bool(rng.random() < self.settings.league_exploiter.reset_probability)
        return False

    # --- what a run stores ------------------------------------------------------------------------

    def state(self) -> dict:
        return {
            "players": [dataclasses.asdict(p) for p in self.players],
            "snapshots": [dataclasses.asdict(s) for s in self.snapshots],
            "table": self.table.state(),
        }

    @classmethod
    def from_state(cls, settings: LeagueSettings, state: dict) -> League:
        return cls(
            settings,
            [LearningPlayer(**p) for p in state["players"]],
            [Snapshot(**s) for s in state["snapshots"]],
            MatchTable.from_state(state["table"]),
        )


def remove_monotonic_suffix(win_rates: np.ndarray, players: list[str]) -> tuple[np.ndarray, list[str]]:
    """Drop the newest snapshots over which the win rate only falls (AlphaStar's pseudocode): up
    to and including the last snapshot that it beats more often than the one before it."""
    for i in range(len(win_rates) - 1, 0, -1):
        if win_rates[i - 1] < win_rates[i]:
            return win_rates[: i + 1], players[: i + 1]
    return np.array([]), []


MATCHMAKING: Registry = Registry("league player kind")
MATCHMAKING.add(MAIN_AGENT, League._main_agent, "PFSP over every snapshot, verification and self-play")
MATCHMAKING.add(MAIN_EXPLOITER, League._main_exploiter, "the main agents, or PFSP-variance over their snapshots")
MATCHMAKING.add(LEAGUE_EXPLOITER, League._league_exploiter, "PFSP-linear_capped over every snapshot")
