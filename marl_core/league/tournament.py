"""Rating policies that never met: every member of one role plays every member of the other
(`episodes` greedy games per pairing, on the rollout workers), and the games are rated.

The games are rated round by round: the first game of every pairing, then the second of every
pairing, and so on. Elo and the skill rating update one game at a time, and rating all of one
pairing's games before the next pairing's would make the result depend on which pairing came
first far more than interleaving does.
"""

from __future__ import annotations

import numpy as np

from marl_core.league.match_table import Game
from marl_core.league.ratings import Ratings, RatingSettings
from marl_core.policies.base import Policy


def round_robin(game, players: list[list[tuple[str, Policy]]], episodes: int, seed: int = 0, pool=None) -> list[Game]:
    """`players`: per role of a two-sided game, (name, policy) pairs. Returns every game, home
    being the role-0 member, in rating order (round by round over the pairings)."""
    from marl_core.psro.learned_oracle import role_returns
    from marl_core.rollout.pool import pool_or_local
    from marl_core.rollout.worker import PolicyMixture, RolloutRequest

    if game.num_roles != 2 or len(players) != 2:
        raise ValueError(f"ratings need a two-sided game; {game.name} has roles {list(game.roles)}")
    if episodes < 1:
        raise ValueError(f"episodes={episodes!r}: needs 1 or more")
    home_role, away_role = game.roles
    pairings = [(home, away) for home in players[0] for away in players[1]]
    requests = [
        RolloutRequest(
            roles=game.mapping,
            populations={
                home_role: PolicyMixture((home[1],), np.ones(1)),
                away_role: PolicyMixture((away[1],), np.ones(1)),
            },
            episodes=episodes,
            seed=(seed, i),
            explore=False,
            experience=False,
        )
        for i, (home, away) in enumerate(pairings)
    ]
    with pool_or_local(pool, game.make_env) as workers:
        results = workers.collect(requests)
    per_pairing = []
    for (home, away), result in zip(pairings, results):
        own, theirs = (
            role_returns(result.episode_returns, game, home_role),
            role_returns(result.episode_returns, game, away_role),
        )
        per_pairing.append([Game(home[0], away[0], float(h), float(a)) for h, a in zip(own, theirs)])
    return [games[e] for e in range(episodes) for games in per_pairing]


def rate(games: list[Game], settings: RatingSettings = RatingSettings()) -> Ratings:
    """Ratings of every player that appears in `games`, rated in the order given."""
    ratings = Ratings(settings)
    for game in games:
        for player in (game.home, game.away):
            if player not in ratings:
                ratings.add(player)
        ratings.record(game)
    return ratings
