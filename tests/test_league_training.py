"""League generations in one process: the games become the match table and the ratings, the
snapshot rules take snapshots, and a generation run again from a copied state gives the same
league (what resuming a killed run relies on)."""

import numpy as np
import pytest

from marl_core.league.config import build_league_config
from marl_core.league.generation import initial_state, iterate_league_local

CONFIG = dict(
    game="kuhn_poker",
    generations=2,
    episodes=300,
    episodes_per_round=150,
    eval_episodes=40,
    rollout={"workers": 1, "envs_per_worker": 16},
    league={"snapshot": {"max_steps": 600}},
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


def test_pbt_inside_a_league_copies_a_lower_rated_player_and_its_learner_trains_with_its_new_values():
    """Two main agents, one at a learning rate that cannot learn: after generation 1 the
    lower-rated one takes the other's networks, trainer state and settings, its learning rate
    explored, and is rated as it is; in generation 2 its learner trains with that learning rate."""
    config = build_league_config(
        {
            **CONFIG,
            "algorithm": "ppo",
            "league": {"main_agents": 2, "main_exploiters": 0, "league_exploiters": 0, "snapshot": {"max_steps": 600}},
            "player_settings": {"main_agent_1": {"lr": 1e-7}},
            "pbt": {
                "perturbation_interval": 1,
                "quantile_fraction": 0.5,
                "resample_probability": 0.0,
                "hyperparam_mutations": {"lr": {"loguniform": [1e-5, 1e-2]}},
            },
        }
    )
    first, second = _run(config)
    (record, state), (record2, state2) = first, second
    ratings = {p: state.ratings[p] for p in ("main_agent_0", "main_agent_1")}
    (entry,) = record.lineage
    member, source = entry.member, entry.source
    assert {member, source} == {"main_agent_0", "main_agent_1"}
    # the lower rated before the copy: the generation's games rated it below its source
    assert entry.member_score < entry.source_score
    assert state.members[member] is state.members[source] and state.trainers[member] is state.trainers[source]
    assert ratings[member].mu == ratings[source].mu and ratings[member].sigma == ratings[source].sigma
    before = 1e-7 if source == "main_agent_1" else config.ppo.lr
    assert entry.before == {"lr": 1e-7 if member == "main_agent_1" else config.ppo.lr}
    assert entry.after["lr"] == pytest.approx(before * 1.2) or entry.after["lr"] == pytest.approx(before * 0.8)
    assert state.settings[member] == {"lr": entry.after["lr"]} and state.lineage == [entry]
    assert record.metrics()[f"hp/{member}/lr"] == entry.after["lr"]
    # generation 2: each learner's optimizer ran at its player's learning rate (a player copied
    # at generation 2's end holds its source's trainer)
    copied = {e.member: e.source for e in record2.lineage}
    for player in ("main_agent_0", "main_agent_1"):
        lr = state.settings.get(copied.get(player, player), {}).get("lr", config.ppo.lr)
        for trainer in state2.trainers[player]:
            assert trainer["optimizer"]["param_groups"][0]["lr"] == pytest.approx(lr)
