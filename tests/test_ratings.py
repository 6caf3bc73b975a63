"""Elo and the Plackett-Luce skill rating against values computed by hand on a short sequence of
games, and how draws, self-play and snapshots are rated."""

import math

import pytest

from marl_core.league.match_table import Game, Outcome
from marl_core.league.ratings import Ratings, RatingSettings, elo_expected


def test_elo_follows_a_hand_computed_sequence():
    ratings = Ratings(RatingSettings(elo_k=32, elo_initial=1000))
    ratings.add("a")
    ratings.add("b")
    # a beats b: expected 0.5 each, so a gains 32 * (1 - 0.5) = 16.
    ratings.record(Game("a", "b", 1.0, -1.0))
    assert ratings["a"].elo == pytest.approx(1016.0)
    assert ratings["b"].elo == pytest.approx(984.0)
    # a draws with b: a's expected score is 1 / (1 + 10^(-32/400)) = 0.545922..., so a moves by
    # 32 * (0.5 - 0.545922) = -1.469502.
    ratings.record(Game("b", "a", 0.0, 0.0))
    assert ratings["a"].elo == pytest.approx(1014.530498, abs=1e-6)
    assert ratings["b"].elo == pytest.approx(985.469502, abs=1e-6)
    # b beats a: b's expected score is 1 / (1 + 10^(29.060997/400)) = 0.458275..., so b gains
    # 32 * (1 - 0.458275) = 17.335196.
    ratings.record(Game("b", "a", 2.0, 1.0))
    assert ratings["b"].elo == pytest.approx(1002.804698, abs=1e-5)
    assert ratings["a"].elo == pytest.approx(997.195302, abs=1e-5)
    assert ratings["a"].games == ratings["b"].games == 3


def test_elo_expected_score_is_the_400_point_logistic():
    assert elo_expected(1400, 1000) == pytest.approx(10 / 11)  # 400 points: ten to one
    assert elo_expected(1000, 1000) == 0.5


def _plackett_luce_two_players(mu, sigma, ranks, beta=25 / 6, tau=25 / 300, kappa=1e-4):
    """Weng and Lin (2011), algorithm 4, written out for two one-player teams."""
    s2 = [s * s + tau * tau for s in sigma]
    c = math.sqrt(sum(v + beta * beta for v in s2))
    e = [math.exp(m / c) for m in mu]
    new_mu, new_sigma = [], []
    for i in range(2):
        omega = delta = 0.0
        for q in range(2):
            if ranks[q] > ranks[i]:
                continue
            tied = sum(r == ranks[q] for r in ranks)
            total = sum(e[s] for s in range(2) if ranks[s] >= ranks[q])
            p = e[i] / total
            omega += ((i == q) - p) / tied
            delta += (math.sqrt(s2[i]) / c) * p * (1 - p) / tied
        new_mu.append(mu[i] + s2[i] / c * omega)
        new_sigma.append(math.sqrt(s2[i] * max(1 - s2[i] / c**2 * delta, kappa)))
    return new_mu, new_sigma


def test_the_skill_rating_follows_the_plackett_luce_update():
    ratings = Ratings()
    ratings.add("a")
    ratings.add("b")
    ratings.record(Game("a", "b", 1.0, 0.0))
    # By hand: c^2 = 2 (sigma^2 + tau^2 + beta^2) = 173.625, each side's win probability 1/2,
    # so mu moves by (sigma^2 + tau^2) / c / 2 = 2.635389.
    assert ratings["a"].mu == pytest.approx(27.635389, abs=1e-6)
    assert ratings["b"].mu == pytest.approx(22.364611, abs=1e-6)
    assert ratings["a"].sigma == ratings["b"].sigma == pytest.approx(8.065901, abs=1e-6)
    expected_mu, expected_sigma = _plackett_luce_two_players(
        [ratings["a"].mu, ratings["b"].mu], [ratings["a"].sigma, ratings["b"].sigma], ranks=[1, 1]
    )
    ratings.record(Game("a", "b", 0.5, 0.5))  # a draw ranks both first
    assert [ratings["a"].mu, ratings["b"].mu] == pytest.approx(expected_mu, abs=1e-9)
    assert [ratings["a"].sigma, ratings["b"].sigma] == pytest.approx(expected_sigma, abs=1e-9)
    assert ratings["a"].mu < 27.635389  # the stronger side drew: it loses some of its lead
    expected_mu, expected_sigma = _plackett_luce_two_players(
        [ratings["b"].mu, ratings["a"].mu], [ratings["b"].sigma, ratings["a"].sigma], ranks=[1, 2]
    )
    ratings.record(Game("a", "b", -1.0, 1.0))  # a loss for the home side ranks the away side first
    assert [ratings["b"].mu, ratings["a"].mu] == pytest.approx(expected_mu, abs=1e-9)
    assert [ratings["b"].sigma, ratings["a"].sigma] == pytest.approx(expected_sigma, abs=1e-9)


def test_team_games_move_every_member_and_rate_a_side_at_its_mean_elo():
    ratings = Ratings()
    for player in ("a", "b", "c"):
        ratings.add(player)
    ratings.record_teams([["a", "b"], ["c"]], Outcome.LOSS)
    assert ratings["a"].elo == ratings["b"].elo == pytest.approx(984.0)
    assert ratings["c"].elo == pytest.approx(1016.0)
    assert ratings["a"].mu < 25 < ratings["c"].mu


def test_a_snapshot_starts_at_its_parents_rating_and_self_play_rates_nothing():
    ratings = Ratings()
    ratings.add("main")
    ratings.add("other")
    ratings.record(Game("main", "other", 1, 0))
    ratings.add("main@1", like="main")
    assert (ratings["main@1"].elo, ratings["main@1"].mu, ratings["main@1"].sigma) == (
        ratings["main"].elo,
        ratings["main"].mu,
        ratings["main"].sigma,
    )
    assert ratings["main@1"].games == 0
    before = ratings["main"]
    ratings.record(Game("main", "main", 1, -1))
    assert (ratings["main"].elo, ratings["main"].mu) == (before.elo, before.mu)


def test_ratings_survive_their_state_and_refuse_strangers():
    ratings = Ratings(RatingSettings(elo_k=16))
    ratings.add("a")
    ratings.add("b")
    ratings.record(Game("a", "b", 1, 0))
    again = Ratings.from_state(ratings.state())
    assert again.table() == ratings.table()
    assert again.settings.elo_k == 16
    with pytest.raises(ValueError, match="player 'z' is not rated"):
        ratings.record(Game("a", "z", 1, 0))
    assert ratings.table()[0]["player"] == "a"  # the winner ranks first


def test_a_round_robin_plays_every_pairing_and_rates_round_by_round():
    from marl_core.empirical_game.game import psro_game
    from marl_core.games.tree import build_tree
    from marl_core.league.tournament import rate, round_robin
    from marl_core.policies.tabular import TabularPolicy

    tree = build_tree("kuhn_poker")
    always_bet = tree.players[0].uniform_policy() * 0
    always_bet[:, 1] = 1.0  # bet at every information state
    always_pass = tree.players[1].uniform_policy() * 0
    always_pass[:, 0] = 1.0  # check, or fold to a bet
    players = [
        [
            ("bet", TabularPolicy("kuhn_poker", 0, always_bet)),
            ("uniform", TabularPolicy("kuhn_poker", 0, tree.players[0].uniform_policy())),
        ],
        [("fold", TabularPolicy("kuhn_poker", 1, always_pass))],
    ]
    games = round_robin(psro_game("kuhn_poker"), players, episodes=6, seed=3)
    assert [g.home for g in games] == ["bet", "uniform"] * 6  # round by round, not pairing by pairing
    assert all(g.away == "fold" for g in games)
    assert all(
        (g.home_return, g.away_return) == (1.0, -1.0) for g in games if g.home == "bet"
    )  # a bet is always folded to
    ratings = rate(games)
    assert [row["player"] for row in ratings.table()][0] == "bet"
    assert ratings["bet"].games == ratings["uniform"].games == 6 and ratings["fold"].games == 12


def test_games_of_a_pairing_rated_as_matches_on_their_summed_returns():
    """Matches of three games: a wins two small pots and loses one big one, so b wins the match,
    rated once as one game b won; either side may be home; a match in play is part of the state."""
    matches = Ratings(RatingSettings(games_per_match=3))
    single = Ratings()
    for ratings in (matches, single):
        ratings.add("a")
        ratings.add("b")
    matches.record(Game("a", "b", 1.0, -1.0))
    matches.record(Game("b", "a", -1.0, 1.0))
    assert matches["a"] == single["a"] and matches["a"].games == 0  # nothing rated mid-match
    resumed = Ratings.from_state(matches.state())
    resumed.record(Game("b", "a", 4.0, -4.0))  # a: 1 + 1 - 4 = -2
    single.record(Game("b", "a", 1.0, -1.0))
    assert resumed["a"] == single["a"] and resumed["b"] == single["b"] and resumed["b"].games == 1
    assert resumed.state()["matches"] == []
    drawn = Ratings(RatingSettings(games_per_match=2))
    drawn.add("a")
    drawn.add("b")
    drawn.record(Game("a", "b", 2.0, -2.0))
    drawn.record(Game("a", "b", -2.0, 2.0))
    assert drawn["a"].elo == drawn["b"].elo == 1000.0 and drawn["a"].games == 1  # a drawn match
