"""PFSP weightings, the match table and AlphaStar's matchmaking against distributions worked out
by hand from the formulas, including the league in which every win rate is 1.0."""

import numpy as np
import pytest

from marl_core.league.match_table import Game, MatchTable
from marl_core.league.pfsp import pfsp
from marl_core.league.players import League, remove_monotonic_suffix
from marl_core.league.settings import LeagueSettings, MainAgentSettings


@pytest.mark.parametrize(
    "weighting, weights",
    [
        ("squared", [0.64, 0.25, 0.0]),
        ("variance", [0.16, 0.25, 0.0]),
        ("linear", [0.8, 0.5, 0.0]),
        ("linear_capped", [0.5, 0.5, 0.0]),
        ("uniform", [1.0, 1.0, 1.0]),
    ],
)
def test_pfsp_weights_are_the_formulas(weighting, weights):
    assert pfsp([0.2, 0.5, 1.0], weighting) == pytest.approx(np.array(weights) / sum(weights))


@pytest.mark.parametrize("weighting", ["squared", "variance", "linear", "linear_capped"])
def test_pfsp_falls_back_to_uniform_where_every_weight_is_zero(weighting):
    rates = [1.0, 1.0, 1.0] if weighting != "variance" else [0.0, 1.0, 1.0]
    with np.errstate(all="raise"):  # no division by zero on the way
        assert pfsp(rates, weighting) == pytest.approx([1 / 3] * 3)


def test_pfsp_refuses_what_is_not_a_win_rate():
    with pytest.raises(ValueError, match="at least one opponent"):
        pfsp([], "squared")
    with pytest.raises(ValueError, match=r"win rates must lie in \[0, 1\], got \[1.5\]"):
        pfsp([1.5], "squared")
    with pytest.raises(ValueError, match="unknown PFSP weighting 'square'; choose one of"):
        pfsp([0.5], "square")


def test_the_match_table_decays_each_pair_and_counts_draws_half():
    table = MatchTable(decay=0.5)
    for player in ("a", "b", "c"):
        table.add_player(player)
    table.record(Game("a", "b", 1, -1))  # a wins:  games 1,              wins 1
    table.record(Game("b", "a", 1, -1))  # a loses: games 0.5 + 1 = 1.5,  wins 0.5, losses 1
    table.record(Game("a", "b", 0, 0))  # a draws: games 0.75 + 1 = 1.75, wins 0.25, losses 0.5, draws 1
    assert table.win_rate("a", "b") == pytest.approx((0.25 + 0.5) / 1.75)
    assert table.win_rate("b", "a") == pytest.approx((0.5 + 0.5) / 1.75)
    assert table.pair("a", "b").mean_return == pytest.approx((1 * 0.25 - 1 * 0.5 + 0) / 1.75)
    assert table.win_rate("a", "c") == 0.5  # never played
    assert MatchTable.from_state(table.state()).rows() == table.rows()
    with pytest.raises(ValueError, match="player 'z' is not in the match table"):
        table.record(Game("a", "z", 1, 0))


def _league(**settings) -> League:
    """One main agent with two snapshots, one main exploiter with one; results never decay."""
    league = League.seeded(LeagueSettings(decay=1.0, league_exploiters=1, **settings))
    main, exploiter = league.player("main_agent_0"), league.player("main_exploiter_0")
    league.take_snapshot(main, generation=1)
    league.take_snapshot(exploiter, generation=1)
    return league


def _set_win_rates(league: League, home: str, rates: dict) -> None:
    """Set the home player's win rates against these opponents (as if from 100 games each)."""
    for away, rate in rates.items():
        record = league.table.pair(home, away)
        record.games, record.wins, record.draws, record.losses = 100.0, 100.0 * rate, 0.0, 100.0 * (1 - rate)
        assert league.table.win_rate(home, away) == pytest.approx(rate)


def test_a_main_agent_verifies_against_exploiters_it_loses_to():
    league = _league()
    _set_win_rates(league, "main_agent_0", {"main_agent_0@0": 0.9, "main_agent_0@1": 0.6, "main_exploiter_0@0": 0.2})
    snapshots = ["main_agent_0@0", "main_agent_0@1", "main_exploiter_0@0"]
    assert league.snapshot_ids() == snapshots
    squared = np.array([0.01, 0.16, 0.64]) / 0.81  # (1 - x)^2 over every snapshot
    expected = dict(zip(snapshots, 0.5 * squared))
    expected["main_exploiter_0@0"] += 0.15  # verification: the exploiter's snapshot, won 0.2 < 0.3
    expected["main_agent_0"] = 0.35  # self-play: its win rate against itself is 0.5 > 0.3
    assert league.opponents(league.player("main_agent_0")) == pytest.approx(expected)


def test_a_main_agent_checks_for_forgetting_once_it_beats_the_exploiters():
    league = _league()
    _set_win_rates(league, "main_agent_0", {"main_agent_0@0": 0.5, "main_agent_0@1": 0.9, "main_exploiter_0@0": 0.4})
    squared = np.array([0.25, 0.01, 0.36]) / 0.62
    forgetting = np.array([0.25, 0.01]) / 0.26  # (1 - x)^2 over its own snapshots, 0.5 < 0.7
    distribution = league.opponents(league.player("main_agent_0"))
    assert distribution["main_agent_0@0"] == pytest.approx(0.5 * squared[0] + 0.15 * forgetting[0])
    assert distribution["main_agent_0@1"] == pytest.approx(0.5 * squared[1] + 0.15 * forgetting[1])
    assert distribution["main_exploiter_0@0"] == pytest.approx(0.5 * squared[2])
    assert distribution["main_agent_0"] == pytest.approx(0.35)
    assert sum(distribution.values()) == pytest.approx(1.0)


def test_self_play_turns_to_the_opponents_snapshots_when_it_is_too_strong():
    league = League.seeded(LeagueSettings(decay=1.0, main_agents=2, main_exploiters=0, league_exploiters=0))
    _set_win_rates(league, "main_agent_0", {"main_agent_1": 0.2, "main_agent_0@0": 0.5, "main_agent_1@0": 0.5})
    # PFSP over both seeds (even weights), then per main agent drawn (half each): against itself
    # self-play (0.5 > 0.3) and no verification (one past snapshot has no suffix to keep);
    # against main_agent_1, won only 0.2, PFSP-variance over its one snapshot.
    expected = {"main_agent_0@0": 0.25, "main_agent_1@0": 0.25 + 0.25, "main_agent_0": 0.25}
    assert league.opponents(league.player("main_agent_0")) == pytest.approx(expected)


def test_exploiters_draw_by_their_own_rules():
    league = _league()
    _set_win_rates(league, "main_exploiter_0", {"main_agent_0": 0.3})
    assert league.opponents(league.player("main_exploiter_0")) == {"main_agent_0": 1.0}  # 0.3 > 0.1
    _set_win_rates(league, "main_exploiter_0", {"main_agent_0": 0.1, "main_agent_0@0": 0.2, "main_agent_0@1": 0.5})
    variance = np.array([0.16, 0.25]) / 0.41  # x(1 - x) over the main agent's snapshots
    assert league.opponents(league.player("main_exploiter_0")) == pytest.approx(
        dict(zip(["main_agent_0@0", "main_agent_0@1"], variance))
    )
    _set_win_rates(
        league, "league_exploiter_0", {"main_agent_0@0": 0.7, "main_agent_0@1": 0.2, "main_exploiter_0@0": 0.5}
    )
    capped = np.array([0.3, 0.5, 0.5]) / 1.3  # min(0.5, 1 - x) over every snapshot
    assert league.opponents(league.player("league_exploiter_0")) == pytest.approx(
        dict(zip(league.snapshot_ids(), capped))
    )


def test_a_league_where_every_win_rate_is_one_draws_uniformly():
    league = _league()
    everyone = ["main_agent_0", "main_exploiter_0", "league_exploiter_0", *league.snapshot_ids()]
    for home in everyone:
        _set_win_rates(league, home, {away: 1.0 for away in everyone})
    snapshots = league.snapshot_ids()
    with np.errstate(all="raise"):  # no division by zero on the way
        main = league.opponents(league.player("main_agent_0"))
        exploiter = league.opponents(league.player("main_exploiter_0"))
        league_exploiter = league.opponents(league.player("league_exploiter_0"))
    # PFSP-squared weighs nothing: uniform over the snapshots; verification finds nothing to
    # verify (no win rate below 0.3 or 0.7), so it and self-play play the main agent.
    assert main == pytest.approx({**{s: 0.5 / 3 for s in snapshots}, "main_agent_0": 0.5})
    assert exploiter == {"main_agent_0": 1.0}  # it wins: it keeps playing the main agent
    assert league_exploiter == pytest.approx({s: 1 / 3 for s in snapshots})
    # A main exploiter that never beats the main agent but always beats its snapshots: variance
    # weighs nothing either, and it draws the snapshots uniformly.
    _set_win_rates(league, "main_exploiter_0", {"main_agent_0": 0.0})
    with np.errstate(all="raise"):
        assert league.opponents(league.player("main_exploiter_0")) == pytest.approx(
            {"main_agent_0@0": 0.5, "main_agent_0@1": 0.5}
        )


def test_the_monotonic_suffix_is_alphastars():
    players = ["s0", "s1", "s2", "s3"]
    assert remove_monotonic_suffix(np.array([0.5, 0.9, 0.8, 0.6]), players)[1] == ["s0", "s1"]
    assert remove_monotonic_suffix(np.array([0.9, 0.8, 0.6, 0.4]), players)[1] == []
    assert remove_monotonic_suffix(np.array([0.4]), ["s0"])[1] == []


def test_snapshots_follow_the_win_rate_and_step_rules():
    league = League.seeded(
        LeagueSettings(
            decay=1.0,
            main_exploiters=1,
            league_exploiters=1,
            snapshot={"win_rate": 0.7, "min_steps": 100, "max_steps": 1000},
        )
    )
    main = league.player("main_agent_0")
    _set_win_rates(league, "main_agent_0", {"main_agent_0@0": 0.8})
    main.steps = 99
    assert not league.ready_to_snapshot(main)  # too soon, however well it does
    main.steps = 100
    assert league.ready_to_snapshot(main)  # beats every snapshot 0.8 > 0.7
    snapshot = league.take_snapshot(main, generation=3)
    assert (snapshot.id, snapshot.parent, snapshot.generation, main.snapshot_steps) == (
        "main_agent_0@1",
        "main_agent_0",
        3,
        100,
    )
    main.steps = 1099
    assert not league.ready_to_snapshot(main)  # 0.5 against its new snapshot
    main.steps = 1100
    assert league.ready_to_snapshot(main)  # the step budget
    exploiter = league.player("main_exploiter_0")
    exploiter.steps = 500
    _set_win_rates(league, "main_exploiter_0", {"main_agent_0": 0.8, "main_agent_0@0": 0.1})
    assert league.ready_to_snapshot(exploiter)  # measured against the main agents only
    rng = np.random.default_rng(0)
    assert league.resets_at_snapshot(exploiter, rng)
    assert not league.resets_at_snapshot(main, rng)
    resets = [league.resets_at_snapshot(league.player("league_exploiter_0"), rng) for _ in range(4000)]
    assert np.mean(resets) == pytest.approx(0.25, abs=0.02)


def test_a_league_survives_its_state():
    league = _league()
    _set_win_rates(league, "main_agent_0", {"main_agent_0@1": 0.3})
    again = League.from_state(league.settings, league.state())
    assert again.opponents(again.player("main_agent_0")) == league.opponents(league.player("main_agent_0"))
    assert again.snapshots == league.snapshots


def test_branch_shares_that_do_not_sum_to_one_are_refused():
    with pytest.raises(ValueError, match="pfsp \\+ verification \\+ self_play must sum to 1, got 1.1"):
        MainAgentSettings(pfsp=0.6)
    with pytest.raises(ValueError, match="unknown PFSP weighting; choose one of"):
        LeagueSettings(league_exploiter={"weighting": "cubic"})
