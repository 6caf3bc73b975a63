"""Payoff evaluators, the payoff table and the PSRO loop, against OpenSpiel and known answers."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pandas as pd
import pyspiel
import pytest
from open_spiel.python import policy as policy_lib
from open_spiel.python.algorithms import expected_game_score, policy_aggregator
from open_spiel.python.algorithms import exploitability as os_exploitability

from marl_core.empirical_game.evaluation import EVALUATORS, evaluate_exact
from marl_core.empirical_game.payoffs import PayoffTable
from marl_core.games.openspiel import load_game
from marl_core.games.tree import build_tree
from marl_core.policies.population import Population
from marl_core.policies.tabular import TabularPolicy
from marl_core.psro import steps as psro
from marl_core.psro.config import build_config

GAMES = ["kuhn_poker", "leduc_poker", "kuhn_poker(players=3)"]


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def random_policy(player_tree, rng) -> np.ndarray:
    raw = rng.dirichlet(np.ones(player_tree.num_actions), size=player_tree.num_infostates) * player_tree.legal
    return raw / raw.sum(axis=1, keepdims=True)


def random_populations(tree, sizes, seed):
    rng = np.random.default_rng(seed)
    return [np.stack([random_policy(pt, rng) for _ in range(k)]) for pt, k in zip(tree.players, sizes)]


def to_openspiel(game, tree, policies) -> policy_lib.TabularPolicy:
    """OpenSpiel TabularPolicy playing policies[p] for player p, matched by infostate string."""
    tabular = policy_lib.TabularPolicy(game)
    for player, player_tree in enumerate(tree.players):
        for state in tabular.states_per_player[player]:
            tabular.action_probability_array[tabular.state_lookup[state]] = policies[player][player_tree.index[state]]
    return tabular


def openspiel_returns(game, tree, policies) -> np.ndarray:
    tabular = to_openspiel(game, tree, policies)
    return np.array(
        pyspiel.expected_returns(
            game.new_initial_state(), policy_lib.python_policy_to_pyspiel_policy(tabular), -1, True
        )
    )


def openspiel_moments(game, tree, policies):
    """Exact mean and variance of each player's return, by walking OpenSpiel's game tree."""
    tabular = to_openspiel(game, tree, policies)
    n = game.num_players()
    first, second = np.zeros(n), np.zeros(n)

    def walk(state, prob):
        nonlocal first, second
        if state.is_terminal():
            r = np.array(state.returns())
            first += prob * r
            second += prob * r * r
            return
        outcomes = state.chance_outcomes() if state.is_chance_node() else tabular.action_probabilities(state).items()
        for action, p in outcomes:
            if p > 0:
                walk(state.child(action), prob * p)

    walk(game.new_initial_state(), 1.0)
    return first, second - first**2


def all_profiles(sizes):
    return [list(p) for p in itertools.product(*(range(k) for k in sizes))]


def scratch_table(tree, populations) -> PayoffTable:
    """A payoff table evaluated in one go, from nothing."""
    sizes = tuple(len(p) for p in populations)
    table = PayoffTable(tree.num_players)
    table.grow(sizes)
    profiles = all_profiles(sizes)
    result = evaluate_exact(tree, populations, profiles)
    table.record(profiles, result.mean, result.stderr, result.episodes)
    return table


def filled_table(sizes, seed=0) -> PayoffTable:
    rng = np.random.default_rng(seed)
    table = PayoffTable(len(sizes))
    table.grow(sizes)
    profiles = all_profiles(sizes)
    table.record(
        profiles,
        rng.normal(size=(len(profiles), len(sizes))),
        rng.random(size=(len(profiles), len(sizes))),
        rng.integers(0, 100, size=len(profiles)),
    )
    return table


def assert_tables_equal(a: PayoffTable, b: PayoffTable, atol=0.0):
    assert a.num_players == b.num_players
    assert a.sizes == b.sizes
    np.testing.assert_array_equal(a.known, b.known)
    np.testing.assert_array_equal(a.episodes, b.episodes)
    np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=atol)
    np.testing.assert_allclose(a.stderr, b.stderr, rtol=0, atol=atol)


# --------------------------------------------------------------------------------------------
# evaluate_exact
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("game_string", GAMES)
def test_evaluate_exact_matches_openspiel_expected_returns(game_string):
    tree = build_tree(game_string)
    game = load_game(game_string)
    sizes = (2,) * tree.num_players if game_string == "leduc_poker" else (3, 2, 2)[: tree.num_players]
    populations = random_populations(tree, sizes, seed=1)
    profiles = all_profiles(sizes)
    result = evaluate_exact(tree, populations, profiles)
    assert result.mean.shape == (len(profiles), tree.num_players)
    np.testing.assert_array_equal(result.stderr, 0.0)
    np.testing.assert_array_equal(result.episodes, 0)
    for row, profile in enumerate(profiles):
        policies = [populations[p][k] for p, k in enumerate(profile)]
        np.testing.assert_allclose(result.mean[row], openspiel_returns(game, tree, policies), rtol=0, atol=1e-9)


def test_evaluate_exact_matches_python_policy_value():
    game_string = "kuhn_poker(players=3)"
    tree = build_tree(game_string)
    game = load_game(game_string)
    populations = random_populations(tree, (2, 2, 2), seed=8)
    profiles = [[1, 0, 1], [0, 1, 1]]
    result = evaluate_exact(tree, populations, profiles)
    for row, profile in enumerate(profiles):
        tabular = to_openspiel(game, tree, [populations[p][k] for p, k in enumerate(profile)])
        expected = expected_game_score.policy_value(game.new_initial_state(), [tabular] * 3)
        np.testing.assert_allclose(result.mean[row], expected, rtol=0, atol=1e-9)


def test_evaluate_exact_does_not_depend_on_chunking_or_order():
    """To the last bit: a run stores each entry from whatever batch its iteration evaluated,
    and `psro evaluate` must reproduce it from another batch (README, "bit for bit")."""
    tree = build_tree("leduc_poker")
    populations = random_populations(tree, (3, 3), seed=2)
    profiles = all_profiles((3, 3))
    together = evaluate_exact(tree, populations, profiles).mean
    for i, profile in enumerate(profiles):
        alone = evaluate_exact(tree, populations, [profile]).mean[0]
        np.testing.assert_array_equal(alone, together[i])
    reverse = evaluate_exact(tree, populations, profiles[::-1]).mean[::-1]
    np.testing.assert_array_equal(reverse, together)
    pairs = np.concatenate([evaluate_exact(tree, populations, chunk).mean for chunk in np.array_split(profiles, 4)])
    np.testing.assert_array_equal(pairs, together)


def test_matrix_rps_pure_strategies_give_the_rps_matrix():
    tree = build_tree("matrix_rps")
    assert [pt.num_infostates for pt in tree.players] == [1, 1]
    pure = np.eye(3)[:, None, :]  # 3 members, 1 information state, 3 actions
    populations = [pure, pure]
    profiles = all_profiles((3, 3))
    result = evaluate_exact(tree, populations, profiles)
    matrix_game = pyspiel.load_matrix_game("matrix_rps")
    row = result.mean[:, 0].reshape(3, 3)
    col = result.mean[:, 1].reshape(3, 3)
    np.testing.assert_array_equal(row, matrix_game.row_utilities())
    np.testing.assert_array_equal(col, matrix_game.col_utilities())
    rock_paper_scissors = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]])
    np.testing.assert_array_equal(row, rock_paper_scissors)
    np.testing.assert_array_equal(col, -rock_paper_scissors)


def test_kuhn_uniform_value_is_zero_sum_and_matches_openspiel():
    """Uniform vs uniform Kuhn is not 0 for player 0: the first player wins 1/8 on average
    (OpenSpiel agrees); the payoffs do sum to zero."""
    tree = build_tree("kuhn_poker")
    game = load_game("kuhn_poker")
    populations = [pt.uniform_policy()[None] for pt in tree.players]
    value = evaluate_exact(tree, populations, [[0, 0]]).mean[0]
    expected = expected_game_score.policy_value(game.new_initial_state(), [policy_lib.UniformRandomPolicy(game)] * 2)
    np.testing.assert_allclose(value, expected, rtol=0, atol=1e-12)
    assert value.sum() == pytest.approx(0.0, abs=1e-12)
    assert value[0] == pytest.approx(1 / 8, abs=1e-12)


def test_kuhn_exact_payoffs_are_zero_sum_for_every_profile():
    tree = build_tree("kuhn_poker")
    populations = random_populations(tree, (4, 4), seed=5)
    result = evaluate_exact(tree, populations, all_profiles((4, 4)))
    np.testing.assert_allclose(result.mean.sum(axis=1), 0.0, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------------
# sampled evaluation (through a rollout worker), against OpenSpiel's exact moments
# --------------------------------------------------------------------------------------------

EPISODES = 3000


def evaluate_sampled(tree, tables, profiles, *, episodes, seed):
    """The `sampled` evaluator on tabular populations given as [K, I, A] arrays."""
    from marl_core.empirical_game.game import psro_game

    game = psro_game(tree.game_string)
    populations = [
        Population.of(role, [TabularPolicy(tree.game_string, p, table) for table in tables[p]])
        for p, role in enumerate(game.roles)
    ]
    return EVALUATORS["sampled"](game, populations, profiles, episodes=episodes, seed=seed)


@pytest.fixture(scope="module")
def kuhn_sampled():
    tree = build_tree("kuhn_poker")
    populations = random_populations(tree, (2, 2), seed=3)
    profiles = [[0, 1], [1, 0]]
    return tree, populations, profiles, evaluate_sampled(tree, populations, profiles, episodes=EPISODES, seed=123)


def test_sampled_mean_is_near_the_exact_value(kuhn_sampled):
    tree, populations, profiles, sampled = kuhn_sampled
    game = load_game("kuhn_poker")
    np.testing.assert_array_equal(sampled.episodes, EPISODES)
    for row, profile in enumerate(profiles):
        policies = [populations[p][k] for p, k in enumerate(profile)]
        mean, variance = openspiel_moments(game, tree, policies)
        assert np.all(sampled.stderr[row] > 0)
        assert np.all(np.abs(sampled.mean[row] - mean) <= 4 * sampled.stderr[row])
        # stderr estimates std / sqrt(N) of the real return distribution.
        np.testing.assert_allclose(sampled.stderr[row], np.sqrt(variance / EPISODES), rtol=0.1)


def test_sampled_three_player_mean_is_near_the_exact_value():
    tree = build_tree("kuhn_poker(players=3)")
    game = load_game("kuhn_poker(players=3)")
    populations = random_populations(tree, (1, 1, 1), seed=4)
    sampled = evaluate_sampled(tree, populations, [[0, 0, 0]], episodes=2000, seed=0)
    mean, variance = openspiel_moments(game, tree, [p[0] for p in populations])
    assert np.all(np.abs(sampled.mean[0] - mean) <= 4 * sampled.stderr[0])
    np.testing.assert_allclose(sampled.stderr[0], np.sqrt(variance / 2000), rtol=0.1)


def test_sampled_is_reproducible_and_seed_dependent(kuhn_sampled):
    tree, populations, profiles, sampled = kuhn_sampled
    again = evaluate_sampled(tree, populations, profiles, episodes=EPISODES, seed=123)
    np.testing.assert_array_equal(again.mean, sampled.mean)
    np.testing.assert_array_equal(again.stderr, sampled.stderr)
    other = evaluate_sampled(tree, populations, profiles, episodes=EPISODES, seed=124)
    assert not np.array_equal(other.mean, sampled.mean)


def test_sampled_does_not_depend_on_chunking(kuhn_sampled):
    tree, populations, profiles, sampled = kuhn_sampled
    for i, profile in enumerate(profiles):
        alone = evaluate_sampled(tree, populations, [profile], episodes=EPISODES, seed=123)
        np.testing.assert_array_equal(alone.mean[0], sampled.mean[i])
        np.testing.assert_array_equal(alone.stderr[0], sampled.stderr[i])
    reverse = evaluate_sampled(tree, populations, profiles[::-1], episodes=EPISODES, seed=123)
    np.testing.assert_array_equal(reverse.mean[::-1], sampled.mean)


def test_sampled_follows_deterministic_policies():
    """matrix_rps with pure policies: every episode returns the same RPS payoff."""
    tree = build_tree("matrix_rps")
    rock, paper = np.eye(3)[[0]], np.eye(3)[[1]]
    sampled = evaluate_sampled(tree, [rock[None], paper[None]], [[0, 0]], episodes=50, seed=0)
    np.testing.assert_array_equal(sampled.mean, [[-1.0, 1.0]])
    np.testing.assert_array_equal(sampled.stderr, [[0.0, 0.0]])


def test_sampled_run_with_one_episode_is_refused_up_front():
    """One episode has no standard error: the payoff table would refuse its infinite stderr
    after the first iteration's work, so the config refuses the setting before any."""
    from marl_core.psro.config import ConfigError

    with pytest.raises(ConfigError, match=r"^episodes=1: Input should be greater than or equal to 2$"):
        build_config({"game": "kuhn_poker", "eval": "sampled", "episodes": 1, "iterations": 1})


# --------------------------------------------------------------------------------------------
# PayoffTable
# --------------------------------------------------------------------------------------------


def test_grow_keeps_old_entries_and_marks_only_new_ones_missing():
    table = filled_table((2, 2))
    before = table.copy()
    assert table.complete and table.missing_profiles() == []
    table.grow((3, 3))
    assert table.sizes == (3, 3)
    assert not table.complete
    np.testing.assert_array_equal(table.mean[:, :2, :2], before.mean)
    np.testing.assert_array_equal(table.stderr[:, :2, :2], before.stderr)
    np.testing.assert_array_equal(table.episodes[:2, :2], before.episodes)
    assert table.known[:2, :2].all()
    assert sorted(table.missing_profiles()) == [(0, 2), (1, 2), (2, 0), (2, 1), (2, 2)]


def test_grow_one_player_only_and_three_players():
    table = filled_table((2, 1, 2))
    table.grow((2, 2, 2))
    assert sorted(table.missing_profiles()) == [(i, 1, k) for i in range(2) for k in range(2)]
    table.grow((2, 2, 2))  # same size: nothing changes
    assert len(table.missing_profiles()) == 4


def test_grow_refuses_to_shrink_or_change_player_count():
    table = filled_table((2, 2))
    for bad in [(1, 2), (2, 1), (2, 2, 2), (3,)]:
        with pytest.raises(ValueError):
            table.grow(bad)
    assert table.sizes == (2, 2) and table.complete


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["mean", "stderr"])
def test_record_refuses_non_finite_values_and_leaves_table_unchanged(bad, where):
    table = filled_table((2, 2))
    table.grow((3, 2))
    before = table.copy()
    mean = np.array([[1.0, 2.0], [3.0, 4.0]])
    stderr = np.zeros((2, 2))
    (mean if where == "mean" else stderr)[1, 0] = bad
    with pytest.raises(ValueError):
        table.record([(2, 0), (2, 1)], mean, stderr, [0, 0])
    assert_tables_equal(table, before)
    assert sorted(table.missing_profiles()) == [(2, 0), (2, 1)]


def test_record_fills_the_right_entries():
    table = PayoffTable(2)
    table.grow((2, 3))
    table.record([(1, 2)], [[5.0, -5.0]], [[0.5, 0.25]], [7])
    assert table.mean[0, 1, 2] == 5.0 and table.mean[1, 1, 2] == -5.0
    assert table.stderr[0, 1, 2] == 0.5 and table.stderr[1, 1, 2] == 0.25
    assert table.episodes[1, 2] == 7
    assert table.known.sum() == 1 and table.known[1, 2]


@pytest.mark.parametrize("sizes", [(2, 3), (2, 1, 3), (1, 1)])
def test_frame_round_trip_is_exact(sizes):
    table = filled_table(sizes, seed=3)
    frame = table.to_frame()
    assert len(frame) == int(np.prod(sizes))
    n = len(sizes)
    assert list(frame.columns) == (
        [f"member_{p}" for p in range(n)]
        + [f"payoff_{p}" for p in range(n)]
        + [f"stderr_{p}" for p in range(n)]
        + ["episodes"]
    )
    back = PayoffTable.from_frame(frame)
    assert_tables_equal(back, table)
    # And through a serialised form with full float precision.
    back_json = PayoffTable.from_frame(pd.read_json(io.StringIO(frame.to_json(double_precision=15))))
    np.testing.assert_allclose(back_json.mean, table.mean, rtol=1e-14)


def test_frame_round_trip_of_an_empty_table():
    table = PayoffTable(2)
    back = PayoffTable.from_frame(table.to_frame())
    assert back.sizes == (0, 0) and back.num_players == 2


def test_frame_rows_name_the_right_profiles():
    table = filled_table((2, 3), seed=4)
    for _, row in table.to_frame().iterrows():
        i, j = int(row.member_0), int(row.member_1)
        assert row.payoff_0 == table.mean[0, i, j] and row.payoff_1 == table.mean[1, i, j]
        assert row.stderr_1 == table.stderr[1, i, j] and row.episodes == table.episodes[i, j]


def test_copy_is_independent():
    table = filled_table((2, 2))
    twin = table.copy()
    assert_tables_equal(twin, table)
    twin.record([(0, 0)], [[99.0, 98.0]], [[0.0, 0.0]], [0])
    twin.grow((3, 3))
    assert table.sizes == (2, 2) and table.mean[0, 0, 0] != 99.0
    table.record([(1, 1)], [[-7.0, 7.0]], [[0.0, 0.0]], [0])
    assert twin.mean[0, 1, 1] != -7.0


# --------------------------------------------------------------------------------------------
# plan_evaluation, solve_meta_game and the local PSRO loop
# --------------------------------------------------------------------------------------------


def test_plan_evaluation_chunks_exactly_the_missing_profiles():
    table = filled_table((2, 2))
    chunks = psro.plan_evaluation(table, [3, 3], parts=3)
    assert table.sizes == (3, 3)
    assert len(chunks) == 3
    flat = [tuple(p) for chunk in chunks for p in chunk]
    assert sorted(flat) == [(0, 2), (1, 2), (2, 0), (2, 1), (2, 2)]
    assert len(set(flat)) == len(flat)
    assert len(psro.plan_evaluation(table.copy(), [3, 3], parts=50)) == 5  # never more chunks than profiles
    assert len(psro.plan_evaluation(table.copy(), [3, 3], parts=0)) == 1
    complete = filled_table((2, 2))
    assert psro.plan_evaluation(complete, [2, 2], parts=4) == []


def test_solve_meta_game_records_into_a_copy_and_solves():
    config = build_config({"game": "matrix_rps", "meta_solver": "nash"})
    tree = build_tree("matrix_rps")
    pure = np.eye(3)[:, None, :]
    populations = [
        Population.of(f"player_{p}", [TabularPolicy("matrix_rps", p, row) for row in pure]) for p in range(2)
    ]
    table = PayoffTable(2)
    chunks = psro.plan_evaluation(table, [3, 3], parts=2)
    evaluations = [psro.evaluate_payoffs(config, populations, chunk) for chunk in chunks]
    before = table.copy()
    meta_game = psro.solve_meta_game(config, table, chunks, evaluations)
    assert_tables_equal(table, before)  # input untouched
    assert not table.complete and meta_game.payoffs.complete
    assert_tables_equal(meta_game.payoffs, scratch_table(tree, [pure, pure]))
    for strategy in meta_game.meta_strategy:  # RPS: the unique Nash is uniform
        np.testing.assert_allclose(strategy, np.full(3, 1 / 3), atol=1e-6)
    with pytest.raises(RuntimeError):
        psro.solve_meta_game(config, table, chunks[:1], evaluations[:1])


def run_incrementally(config):
    """The PSRO loop from the public steps, keeping the solved table as the flow does."""
    tree = build_tree(config.game)
    populations = psro.initial_populations(config)
    table = PayoffTable(tree.num_players)
    evaluated, exploitabilities = [], []
    meta = None
    for iteration in range(config.iterations + 1):
        if iteration > 0:
            responses = [psro.best_response(config, p, populations, meta, iteration) for p in range(tree.num_players)]
            populations = psro.expand_population(populations, responses)
        old = int(np.prod(table.sizes))
        chunks = psro.plan_evaluation(table, [len(p) for p in populations], parts=2)
        evaluated.append((sum(len(c) for c in chunks), int(np.prod(table.sizes)) - old))
        evaluations = [psro.evaluate_payoffs(config, populations, chunk) for chunk in chunks]
        meta_game = psro.solve_meta_game(config, table, chunks, evaluations)
        table, meta = meta_game.payoffs, meta_game.meta_strategy
        exploitabilities.append(psro.measure(config, populations, meta_game).exploitability)
    return tree, [p.tables for p in populations], table, evaluated, exploitabilities


def test_incremental_table_equals_table_from_scratch():
    config = build_config({"game": "kuhn_poker", "meta_solver": "nash", "iterations": 5})
    tree, populations, table, evaluated, exploitabilities = run_incrementally(config)
    assert [len(p) for p in populations] == [6, 6]
    for done, new in evaluated:  # each iteration evaluates exactly the new profiles
        assert done == new
    assert table.complete
    assert_tables_equal(table, scratch_table(tree, populations), atol=1e-12)
    # The local runner computes the same populations and exploitability sequence.
    records = [record.report.exploitability for record, _ in psro.iterate_psro_local(config)]
    np.testing.assert_allclose(records, exploitabilities, rtol=0, atol=1e-7)  # interior-point Nash: ~1e-9 accurate
    state = psro.run_psro_local(config)
    for ours, theirs in zip(populations, state.tables()):
        np.testing.assert_array_equal(ours, theirs)


def test_run_psro_local_final_table_equals_table_from_scratch():
    config = build_config({"game": "kuhn_poker", "meta_solver": "nash", "iterations": 5})
    state = psro.run_psro_local(config)
    tree = build_tree(config.game)
    assert state.payoffs.complete
    assert_tables_equal(state.payoffs, scratch_table(tree, state.tables()), atol=1e-12)


def openspiel_nash_conv_of(game, tree, populations, meta_strategy) -> float:
    n = tree.num_players
    members = [
        [
            to_openspiel(game, tree, [m if q == p else tree.players[q].uniform_policy() for q in range(n)])
            for m in populations[p]
        ]
        for p in range(n)
    ]
    aggregated = policy_aggregator.PolicyAggregator(game).aggregate(
        list(range(n)), members, [list(map(float, w)) for w in meta_strategy]
    )
    return os_exploitability.nash_conv(game, aggregated)


def test_kuhn_psro_with_nash_converges():
    config = build_config({"game": "kuhn_poker", "meta_solver": "nash", "iterations": 30, "stop_exploitability": 1e-3})
    records = []
    state = psro.run_psro_local(config, on_iteration=lambda record, _: records.append(record))
    assert records[0].iteration == 0
    assert records[0].report.nash_conv == pytest.approx(11 / 12, abs=1e-9)  # uniform Kuhn
    final = records[-1]
    assert final.iteration <= 30
    assert final.report.exploitability <= 1e-3
    assert final.report.exploitability == pytest.approx(final.report.nash_conv / 2, abs=1e-15)
    assert state.iteration == final.iteration
    # The stop rule fired at the first iteration under the threshold.
    assert all(r.report.exploitability > 1e-3 for r in records[:-1])
    # OpenSpiel agrees on the final mixture's NashConv.
    game = load_game("kuhn_poker")
    tree = build_tree("kuhn_poker")
    expected = openspiel_nash_conv_of(game, tree, state.tables(), state.meta_strategy)
    assert final.report.nash_conv == pytest.approx(expected, abs=1e-9)


def test_three_player_kuhn_with_prd_decreases_exploitability():
    config = build_config({"game": "kuhn_poker(players=3)", "meta_solver": "prd", "iterations": 8})
    records = []
    state = psro.run_psro_local(config, on_iteration=lambda record, _: records.append(record))
    assert [r.iteration for r in records] == list(range(9))
    assert state.population_sizes == [9, 9, 9]
    game = load_game("kuhn_poker(players=3)")
    uniform = os_exploitability.nash_conv(game, policy_lib.UniformRandomPolicy(game))
    assert records[0].report.nash_conv == pytest.approx(uniform, abs=1e-9)
    assert records[-1].report.exploitability < records[0].report.exploitability
    for strategy, population in zip(state.meta_strategy, state.populations):
        assert len(strategy) == len(population)
        assert np.all(strategy >= 0) and strategy.sum() == pytest.approx(1.0, abs=1e-9)
