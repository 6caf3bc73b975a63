"""The empirical game: a payoff table over population profiles that grows one iteration at a time.

Entry [p, i_0, ..., i_{n-1}] is player p's expected return when each player q plays member i_q.
When populations grow, only the new profiles are missing; evaluators fill exactly those, so an
iteration costs O(new profiles) evaluations rather than re-playing the whole table.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd  # imported where a frame is made: the table itself is numpy only


@dataclasses.dataclass(frozen=True)
class ProfilePayoffs:
    """What an evaluator returns for m profiles of n players: the rows `PayoffTable.record` takes."""

    mean: np.ndarray  # [m, n]
    stderr: np.ndarray  # [m, n]
    episodes: np.ndarray  # [m]; 0 marks an exact entry


class PayoffTable:
    def __init__(self, num_players: int):
        self.num_players = num_players
        shape = (0,) * num_players
        self.mean = np.zeros((num_players, *shape))
        self.stderr = np.zeros((num_players, *shape))
        self.episodes = np.zeros(shape, dtype=np.int64)  # 0 for exactly evaluated entries
        self.known = np.zeros(shape, dtype=bool)

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.known.shape

    @property
    def complete(self) -> bool:
        return bool(self.known.all())

    def grow(self, sizes: tuple[int, ...]) -> None:
        """Make room for larger populations; existing entries are kept, new ones are missing."""
        if len(sizes) != self.num_players or any(n < o for n, o in zip(sizes, self.sizes)):
            raise ValueError(f"cannot grow payoff table from {self.sizes} to {sizes}")
        old = tuple(slice(0, n) for n in self.sizes)
        for name in ("mean", "stderr"):
            grown = np.zeros((self.num_players, *sizes))
            grown[(slice(None), *old)] = getattr(self, name)
            setattr(self, name, grown)
        episodes = np.zeros(sizes, dtype=np.int64)
        episodes[old] = self.episodes
        known = np.zeros(sizes, dtype=bool)
        known[old] = self.known
        self.episodes, self.known = episodes, known

    def copy(self) -> PayoffTable:
        twin = PayoffTable(self.num_players)
        twin.mean, twin.stderr = self.mean.copy(), self.stderr.copy()
        twin.episodes, twin.known = self.episodes.copy(), self.known.copy()
        return twin

    def missing_profiles(self) -> list[tuple[int, ...]]:
        return [tuple(int(i) for i in row) for row in np.argwhere(~self.known)]

    def record(self, profiles, mean, stderr, episodes) -> None:
        """Store evaluated profiles; refuses non-finite payoffs so a NaN never enters the table."""
        mean, stderr = np.asarray(mean, dtype=np.float64), np.asarray(stderr, dtype=np.float64)
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(stderr))):
            raise ValueError("evaluator returned non-finite payoffs; nothing was recorded")
        index = tuple(np.asarray(profiles, dtype=np.int64).reshape(-1, self.num_players).T)
        for player in range(self.num_players):
            self.mean[(player, *index)] = mean[:, player]
            self.stderr[(player, *index)] = stderr[:, player]
        self.episodes[index] = episodes
        self.known[index] = True

    def mixture_value(self, strategies) -> tuple[np.ndarray, np.ndarray]:
        """Each player's expected payoff [n] when every player mixes its members by `strategies`,
        and its standard error from the entries' own (independent estimates; 0 where exact)."""
        weight = np.ones(self.sizes)
        for player, strategy in enumerate(strategies):
            shape = [1] * self.num_players
            shape[player] = -1
            weight = weight * np.asarray(strategy, dtype=np.float64).reshape(shape)
        value = (self.mean * weight).reshape(self.num_players, -1).sum(axis=1)
        stderr = np.sqrt((np.square(self.stderr) * np.square(weight)).reshape(self.num_players, -1).sum(axis=1))
        return value, stderr

    def to_frame(self, beyond: tuple[int, ...] | None = None) -> pd.DataFrame:
        """One row per evaluated profile: the members played, each player's payoff and
        standard error, and the episodes behind it (0: exact).

        With `beyond` (earlier population sizes), only the profiles outside that box: the
        entries added since the table had those sizes.
        """
        known = self.known.copy()
        if beyond is not None:
            known[tuple(slice(0, n) for n in beyond)] = False
        known = known.reshape(-1)
        grid = np.indices(self.sizes).reshape(self.num_players, -1)[:, known]
        columns: dict[str, np.ndarray] = {}
        for p in range(self.num_players):
            columns[f"member_{p}"] = grid[p]
        for p in range(self.num_players):
            columns[f"payoff_{p}"] = self.mean[p].reshape(-1)[known]
        for p in range(self.num_players):
            columns[f"stderr_{p}"] = self.stderr[p].reshape(-1)[known]
        columns["episodes"] = self.episodes.reshape(-1)[known]
        import pandas as pd

        return pd.DataFrame(columns)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> PayoffTable:
        num_players = sum(1 for c in frame.columns if c.startswith("member_"))
        table = cls(num_players)
        members = frame[[f"member_{p}" for p in range(num_players)]].to_numpy()
        table.grow(tuple(int(m) + 1 for m in members.max(axis=0)) if len(frame) else (0,) * num_players)
        table.record(
            members,
            frame[[f"payoff_{p}" for p in range(num_players)]].to_numpy(),
            frame[[f"stderr_{p}" for p in range(num_players)]].to_numpy(),
            frame["episodes"].to_numpy(),
        )
        return table
