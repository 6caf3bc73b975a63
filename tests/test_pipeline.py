"""Pipeline PSRO in one process: its plateau rule by hand, sequential PSRO exactly with one level,
and several levels learning at once, each freeze an iteration."""

from __future__ import annotations

import numpy as np
import pytest

from marl_core.psro.config import ConfigError, build_config
from marl_core.psro.pipeline import Pipeline, iterate_pipeline_local, plateaued
from marl_core.psro.settings import Plateau
from marl_core.psro.steps import iterate_psro_local

# Kuhn poker, DQN responses of 600 episodes in rounds of 200: seconds per iteration.
QUICK = {
    "game": "kuhn_poker",
    "oracle": "dqn",
    "iterations": 3,
    "seed": 5,
    "best_response": {"episodes": 600, "episodes_per_round": 200},
    "rollout": {"workers": 2, "envs_per_worker": 8},
    "dqn": {"learning_starts": 100, "epsilon_decay_steps": 800},
}


def test_the_plateau_rule_compares_the_last_window_with_the_one_before_from_check_from_on():
    rule = Plateau(threshold=0.01, check_from=6, min_episodes=8)
    flat = np.zeros(8)
    assert plateaued(flat, rule, window=2)  # gain 0 < 0.01 at 8 episodes
    assert not plateaued(flat[:7], rule, window=2)  # fewer than min_episodes
    assert not plateaued(flat, Plateau(threshold=0.01, check_from=9, min_episodes=0), window=2)  # before check_from
    assert not plateaued(flat, None, window=2)  # no rule: a level learns its whole budget
    # the last two episodes against the two before: 1.0 - 0.99 = 0.01 is no plateau, 0.009 is
    rising = np.array([0, 0, 0, 0, 0.99, 0.99, 1.0, 1.0])
    assert not plateaued(rising, rule, window=2)
    assert plateaued(rising - np.array([0, 0, 0, 0, 0, 0, 0.001, 0.001]), rule, window=2)
    # only the last 2 windows count: an early climb does not hold a level back
    assert plateaued(np.array([-5, -5, 0, 0, 0, 0, 0, 0.0]), rule, window=2)
    assert not plateaued(np.array([0, 0, 0, 0, 0, 0, 0.5, 0.5]), rule, window=4)  # windows of 4: 0.25 - 0


def test_a_pipeline_needs_a_learned_oracle():
    with pytest.raises(
        ConfigError,
        match="pipeline: oracle 'exact' computes each best response at once; a pipeline needs a learned oracle",
    ):
        build_config({"game": "kuhn_poker", "pipeline": {"active_levels": 2}})


def _snapshot(state):
    return (
        state.payoffs.mean.copy(),
        [m.copy() for m in state.meta_strategy],
        [p.tables.copy() for p in state.populations],
    )


def test_one_active_level_without_a_plateau_is_sequential_psro_exactly():
    sequential = [(record, _snapshot(state)) for record, state in iterate_psro_local(build_config(QUICK))]
    pipeline = build_config({**QUICK, "pipeline": {"active_levels": 1, "plateau": None}})
    piped = [(record, _snapshot(state)) for record, state in iterate_pipeline_local(pipeline)]
    assert len(piped) == len(sequential) == QUICK["iterations"] + 1
    for (record, (payoffs, meta, tables)), (twin, (twin_payoffs, twin_meta, twin_tables)) in zip(sequential, piped):
        assert twin.iteration == record.iteration
        np.testing.assert_array_equal(twin_payoffs, payoffs)
        for a, b in zip(twin_meta, meta):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(twin_tables, tables):
            np.testing.assert_array_equal(a, b)
        assert twin.exploitability == record.exploitability
        assert twin.oracle_metrics.keys() == record.oracle_metrics.keys()
        for name in ("value", "gap_to_exact", "episodes", "training_return"):
            for role in ("player_0", "player_1"):
                key = f"{role}/oracle_{name}"
                assert (twin.oracle_metrics.get(key), name) == (record.oracle_metrics.get(key), name)
    # the response learned in the first iteration moved from its initialisation
    assert sequential[1][0].oracle_metrics["player_0/oracle_episodes"] == 600


def test_two_levels_learn_at_once_and_freeze_in_order_at_their_plateau():
    config = build_config(
        {
            **QUICK,
            "iterations": 4,
            "best_response": {"episodes": 2000, "episodes_per_round": 200},
            "pipeline": {
                "active_levels": 2,
                "window": 400,
                "plateau": {"threshold": 0.5, "check_from": 800, "min_episodes": 800},
            },
        }
    )
    seen = []
    original = Pipeline.train_until_frozen

    def watched(self, state):
        levels = [(level.iteration, level.episodes) for level in self.levels]
        responses = original(self, state)
        seen.append((levels, [(level.iteration, level.episodes) for level in self.levels], responses))
        return responses

    Pipeline.train_until_frozen = watched
    try:
        records = [(record, state.population_sizes) for record, state in iterate_pipeline_local(config)]
    finally:
        Pipeline.train_until_frozen = original
    assert [record.iteration for record, _ in records] == [0, 1, 2, 3, 4]
    assert [sizes for _, sizes in records] == [[1, 1], [2, 2], [3, 3], [4, 4], [5, 5]]
    beside = 0
    for iteration, (before, after, responses) in enumerate(seen, start=1):
        assert before[0][0] == iteration  # the lowest level is the next iteration's
        episodes = int(responses[0].metrics["episodes"])
        # frozen at its plateau (gain below 0.5 per 400 episodes is soon reached) or its budget
        assert 800 <= episodes <= 2000 and episodes % 200 == 0
        learned = episodes - before[0][1]
        if len(before) > 1:
            # the level above learned beside it, window for window, and was not frozen with it
            assert after[0] == (before[1][0], before[1][1] + learned)
            beside += learned > 0
        if iteration > 1:  # a level that starts above learns while the one below it does
            assert before[0][1] == seen[iteration - 2][1][0][1]
    assert beside >= 2
    assert seen[0][0][1][1] == 0  # at the start, the upper level had learned nothing yet
    assert records[-1][0].exploitability < records[0][0].exploitability
