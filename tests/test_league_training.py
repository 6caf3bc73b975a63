"""League generations in one process: the games become the match table and the ratings, the
snapshot rules take snapshots, and a generation run again from a copied state gives the same
league (what resuming a killed run relies on)."""

import numpy as np
import pytest

from marl_core.league.config import build_league_config
from marl_core.league.generation import initial_state, iterate_league_local

CONFIG = dict(
    game="kuhn_poker", generations=2, episodes=300, episodes_per_round=150, eval_episodes=40,
    rollout={"workers": 1, "envs_per_worker": 16}, league={"snapshot": {"max_steps": 600}},
)


def _run(config, state=None):
    return list(iterate_league_local(config, state))


@pytest.fixture(scope="module")
def straight():
    return _run(build_league_config(CONFIG))


def test_every_training_game_reaches_the_table_and_the_ratings(straight):
    record, state = straight[0]
    table = state.league.table
    # Four learning players, two roles each, 300 games per role: each game is counted for its
    # player (home) and, reversed, for its opponent (away), decayed by 0.99 per game of the pair.
    main = table.pair("main_agent_0", "main_agent_0@0").games + table.pair("main_agent_0", "main_agent_0").games / 2
    assert 0 < main < 600
    assert state.ratings["main_exploiter_0"].games == 600  # it only plays the main agent
    assert record.opponents["main_exploiter_0"] == {"main_agent_0": 1.0}
    assert record.opponents["main_agent_0"] == {"main_agent_0@0": 0.5, "main_agent_0": 0.5}
    assert state.league.player("main_agent_0").steps > 600  # Kuhn: two or three moves per episode
    assert 0 <= record.measured["main_agent_0/exploitability"] <= 2  # Kuhn pays at most 2
    assert 0 <= record.measured["main_agent_0/win_rate_vs_uniform"] <= 1


def test_ready_players_snapshot_and_main_exploiters_reset(straight):
    record, state = straight[0]
    assert record.snapshots == ["main_agent_0@1", "main_exploiter_0@0", "league_exploiter_0@0", "league_exploiter_1@0"]
    assert "main_exploiter_0" in record.resets
    seed = state.members["main_agent_0@0"]
    assert state.members["main_exploiter_0"] is not state.members["main_exploiter_0@0"]
    for reset, original in zip(state.members["main_exploiter_0"], seed):
        np.testing.assert_array_equal(reset.tabular, original.tabular)  # back to the initial network
    assert state.members["main_agent_0@1"] is state.members["main_agent_0"]
    assert state.ratings["main_agent_0@1"].mu == state.ratings["main_agent_0"].mu


def test_a_generation_run_again_from_its_state_gives_the_same_league(straight):
    config = build_league_config(CONFIG)
    again = _run(config, straight[0][1].copy())
    assert len(again) == 1
    (record, state), (expected_record, expected) = again[0], straight[1]
    assert state.league.state() == expected.league.state()
    assert state.ratings.table() == expected.ratings.table()
    assert record.snapshots == expected_record.snapshots
    assert record.measured == expected_record.measured


def test_a_league_refuses_a_game_that_is_not_two_sided():
    from marl_core.psro.config import ConfigError

    with pytest.raises(ConfigError, match=r"game 'kuhn_poker\(players=3\)' has 3 roles"):
        build_league_config({**CONFIG, "game": "kuhn_poker(players=3)"})


def test_the_seeded_league_rates_its_seed_like_its_main_agent():
    state = initial_state(build_league_config(CONFIG))
    assert [s.id for s in state.league.snapshots] == ["main_agent_0@0"]
    assert state.members["main_agent_0@0"] is state.members["league_exploiter_1"]
    assert state.ratings["main_agent_0@0"].mu == 25.0
