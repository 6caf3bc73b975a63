"""The sequence-form game tree, best responses and NashConv, checked against OpenSpiel itself.

Every expected value here comes from OpenSpiel (its tabular policies, best responders, policy
aggregator and NashConv) or from a closed form (Kuhn's equilibria), never from our own output.
"""

from __future__ import annotations

import numpy as np
import pyspiel
import pytest
from open_spiel.python import policy as policy_lib
from open_spiel.python.algorithms import best_response as os_best_response
from open_spiel.python.algorithms import exploitability as os_exploitability
from open_spiel.python.algorithms import policy_aggregator

from marl_core.games.exploitability import mixed_reach, nash_conv
from marl_core.games.openspiel import GameError, load_game
from marl_core.games.tree import best_response, build_tree, profile_values, sequence_reach

GAMES = ["kuhn_poker", "leduc_poker", "kuhn_poker(players=3)", "goofspiel(num_cards=3)"]


# --------------------------------------------------------------------------------------------
# Helpers: random tabular policies and their OpenSpiel twins
# --------------------------------------------------------------------------------------------


def random_policy(player_tree, rng) -> np.ndarray:
    """A full-support random policy [I, A] over each information state's legal actions."""
    raw = rng.dirichlet(np.ones(player_tree.num_actions), size=player_tree.num_infostates)
    raw = raw * player_tree.legal
    return raw / raw.sum(axis=1, keepdims=True)


def to_openspiel(game, tree, policies) -> policy_lib.TabularPolicy:
    """An OpenSpiel TabularPolicy playing policies[p] for every player p, matched by the
    information-state strings OpenSpiel itself enumerates (not by our row order)."""
    tabular = policy_lib.TabularPolicy(game)
    for player, player_tree in enumerate(tree.players):
        for state in tabular.states_per_player[player]:
            tabular.action_probability_array[tabular.state_lookup[state]] = policies[player][player_tree.index[state]]
    return tabular


def from_openspiel(tree, player, tabular: policy_lib.TabularPolicy) -> np.ndarray:
    player_tree = tree.players[player]
    return np.array([tabular.action_probability_array[tabular.state_lookup[s]] for s in player_tree.infostates])


def own_reaches(tree, policies) -> list[np.ndarray]:
    return [sequence_reach(pt, p[None])[0] for pt, p in zip(tree.players, policies)]


def openspiel_br_value(game, player, tabular) -> float:
    return os_best_response.BestResponsePolicy(game, player, tabular).value(game.new_initial_state())


# --------------------------------------------------------------------------------------------
# Tree sizes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("game_string", GAMES + ["matrix_rps"])
def test_information_states_match_openspiel_enumeration(game_string):
    tree = build_tree(game_string)
    game = load_game(game_string)
    tabular = policy_lib.TabularPolicy(game)
    assert tree.num_players == game.num_players()
    assert tree.num_actions == game.num_distinct_actions()
    for player, player_tree in enumerate(tree.players):
        expected = set(tabular.states_per_player[player])
        assert set(player_tree.infostates) == expected
        assert player_tree.num_infostates == len(expected)
        assert len(set(player_tree.infostates)) == player_tree.num_infostates
        for state, row in player_tree.index.items():
            assert player_tree.infostates[row] == state
        # Legal-action masks agree with OpenSpiel's legal_actions_mask per information state.
        for state in expected:
            np.testing.assert_array_equal(
                player_tree.legal[player_tree.index[state]],
                tabular.legal_actions_mask[tabular.state_lookup[state]].astype(bool),
            )


def _count_terminals(state) -> int:
    if state.is_terminal():
        return 1
    if state.is_chance_node():
        return sum(_count_terminals(state.child(a)) for a, p in state.chance_outcomes() if p > 0)
    return sum(_count_terminals(state.child(a)) for a in state.legal_actions())


def test_known_tree_sizes():
    kuhn = build_tree("kuhn_poker")
    assert [pt.num_infostates for pt in kuhn.players] == [6, 6]
    assert len(kuhn.chance_reach) == 30 == _count_terminals(load_game("kuhn_poker").new_initial_state())
    leduc = build_tree("leduc_poker")
    assert [pt.num_infostates for pt in leduc.players] == [468, 468]
    assert len(leduc.chance_reach) == _count_terminals(load_game("leduc_poker").new_initial_state())
    assert leduc.utilities.shape == (len(leduc.chance_reach), 2)
    for player_tree in leduc.players:
        assert player_tree.terminal_seq.shape == leduc.chance_reach.shape
        assert player_tree.num_sequences == 1 + 468 * 3


# --------------------------------------------------------------------------------------------
# sequence_reach
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("game_string", GAMES)
def test_sequence_reach_is_parent_times_action_probability(game_string):
    tree = build_tree(game_string)
    rng = np.random.default_rng(7)
    for player_tree in tree.players:
        policies = np.stack([random_policy(player_tree, rng) for _ in range(3)] + [player_tree.uniform_policy()])
        reach = sequence_reach(player_tree, policies)
        assert reach.shape == (4, player_tree.num_sequences)
        np.testing.assert_array_equal(reach[:, 0], 1.0)
        for row in range(player_tree.num_infostates):
            parent = reach[:, player_tree.parent_seq[row]]
            for action in range(player_tree.num_actions):
                seq = 1 + row * player_tree.num_actions + action
                np.testing.assert_allclose(reach[:, seq], parent * policies[:, row, action], rtol=0, atol=1e-15)
                if not player_tree.legal[row, action]:
                    np.testing.assert_array_equal(reach[:, seq], 0.0)
            # Children of one information state share out their parent's reach.
            children = player_tree.sequence_ids(np.array([row]))[0]
            np.testing.assert_allclose(reach[:, children].sum(axis=1), parent, rtol=0, atol=1e-14)


def _walk_reach_product(state, game, tabular, prob=1.0) -> float:
    """sum over terminals of chance(z) * prod_p own reach_p(z), by walking the real game."""
    if state.is_terminal():
        return prob
    if state.is_chance_node():
        return sum(_walk_reach_product(state.child(a), game, tabular, prob * p) for a, p in state.chance_outcomes())
    probs = tabular.action_probabilities(state)
    return sum(_walk_reach_product(state.child(a), game, tabular, prob * p) for a, p in probs.items())


@pytest.mark.parametrize("game_string", GAMES)
def test_terminal_reach_sums_to_one_over_chance(game_string):
    tree = build_tree(game_string)
    rng = np.random.default_rng(11)
    for trial in range(3):
        if trial == 0:
            policies = [pt.uniform_policy() for pt in tree.players]
        elif trial == 1:  # deterministic policies: every row a pure action
            policies = []
            for pt in tree.players:
                pure = np.zeros(pt.legal.shape)
                legal_rows = [np.flatnonzero(m) for m in pt.legal]
                pure[np.arange(pt.num_infostates), [rng.choice(r) for r in legal_rows]] = 1.0
                policies.append(pure)
        else:
            policies = [random_policy(pt, rng) for pt in tree.players]
        reaches = own_reaches(tree, policies)
        weight = tree.chance_reach.copy()
        for pt, reach in zip(tree.players, reaches):
            weight *= reach[pt.terminal_seq]
        assert weight.sum() == pytest.approx(1.0, abs=1e-12)
    if game_string == "kuhn_poker":  # and the same sum found by walking OpenSpiel's game
        game = load_game(game_string)
        tabular = to_openspiel(game, tree, policies)
        assert _walk_reach_product(game.new_initial_state(), game, tabular) == pytest.approx(1.0, abs=1e-12)


# --------------------------------------------------------------------------------------------
# best_response against OpenSpiel
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("game_string", GAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_best_response_value_matches_openspiel(game_string, seed):
    tree = build_tree(game_string)
    game = load_game(game_string)
    rng = np.random.default_rng(seed)
    policies = [random_policy(pt, rng) for pt in tree.players]
    tabular = to_openspiel(game, tree, policies)
    reaches = own_reaches(tree, policies)
    for player in range(tree.num_players):
        value, br_policy = best_response(tree, player, reaches)
        expected = openspiel_br_value(game, player, tabular)
        assert value == pytest.approx(expected, abs=1e-9)
        # C++ TabularBestResponse agrees too.
        table = {
            state: list(enumerate(tabular.action_probability_array[i])) for state, i in tabular.state_lookup.items()
        }
        cpp = pyspiel.TabularBestResponse(game, player, table)
        assert value == pytest.approx(cpp.value(game.new_initial_state().history_str()), abs=1e-9)

        # The returned policy is deterministic, legal, and actually earns the value when played
        # in OpenSpiel against the others' policies.
        assert np.all(br_policy.sum(axis=1) == 1.0)
        assert set(np.unique(br_policy)) <= {0.0, 1.0}
        assert np.all(br_policy[~tree.players[player].legal] == 0)
        deviated = list(policies)
        deviated[player] = br_policy
        dev_tabular = to_openspiel(game, tree, deviated)
        played = pyspiel.expected_returns(
            game.new_initial_state(), policy_lib.python_policy_to_pyspiel_policy(dev_tabular), -1, True
        )
        assert played[player] == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("game_string", ["kuhn_poker", "kuhn_poker(players=3)", "leduc_poker"])
def test_best_response_actions_match_openspiel(game_string):
    """With full-support random opponents there are no ties, so the argmax actions agree."""
    tree = build_tree(game_string)
    game = load_game(game_string)
    rng = np.random.default_rng(3)
    policies = [random_policy(pt, rng) for pt in tree.players]
    tabular = to_openspiel(game, tree, policies)
    reaches = own_reaches(tree, policies)
    for player in range(tree.num_players):
        _, br_policy = best_response(tree, player, reaches)
        responder = os_best_response.BestResponsePolicy(game, player, tabular)
        responder.value(game.new_initial_state())
        mismatches = []
        for infostate, states in responder.infosets.items():
            row = tree.players[player].index[infostate]
            ours = int(br_policy[row].argmax())
            theirs = responder.best_response_action(infostate)
            if ours != theirs:
                q = {a: sum(cf * responder.q_value(s, a) for s, cf in states) for a in states[0][0].legal_actions()}
                if abs(q[ours] - q[theirs]) > 1e-12:
                    mismatches.append((infostate, ours, theirs, q))
        assert not mismatches
        assert len(responder.infosets) == tree.players[player].num_infostates


def test_best_response_ignores_own_reach():
    tree = build_tree("kuhn_poker")
    rng = np.random.default_rng(5)
    policies = [random_policy(pt, rng) for pt in tree.players]
    reaches = own_reaches(tree, policies)
    other = own_reaches(tree, [random_policy(pt, rng) for pt in tree.players])
    for player in range(2):
        mixed = list(reaches)
        mixed[player] = other[player]
        a = best_response(tree, player, reaches)
        b = best_response(tree, player, mixed)
        assert a[0] == b[0]
        np.testing.assert_array_equal(a[1], b[1])


# --------------------------------------------------------------------------------------------
# NashConv of meta-weighted mixtures against OpenSpiel's PolicyAggregator + nash_conv
# --------------------------------------------------------------------------------------------


def openspiel_mixture_nash_conv(game, tree, populations, weights) -> float:
    n = tree.num_players
    member_policies = []
    for player in range(n):
        members = []
        for member in populations[player]:
            profile = [member if q == player else tree.players[q].uniform_policy() for q in range(n)]
            members.append(to_openspiel(game, tree, profile))
        member_policies.append(members)
    aggregated = policy_aggregator.PolicyAggregator(game).aggregate(
        list(range(n)), member_policies, [list(map(float, w)) for w in weights]
    )
    return os_exploitability.nash_conv(game, aggregated)


@pytest.mark.parametrize(
    "game_string, sizes",
    [
        ("kuhn_poker", (3, 4)),
        ("kuhn_poker(players=3)", (2, 3, 2)),
        ("leduc_poker", (2, 2)),
        ("goofspiel(num_cards=3)", (2, 3)),
    ],
)
def test_mixture_nash_conv_matches_openspiel_aggregator(game_string, sizes):
    tree = build_tree(game_string)
    game = load_game(game_string)
    rng = np.random.default_rng(42)
    populations = [np.stack([random_policy(pt, rng) for _ in range(k)]) for pt, k in zip(tree.players, sizes)]
    weights = [rng.dirichlet(np.ones(k)) for k in sizes]
    report = nash_conv(tree, populations, weights)
    expected = openspiel_mixture_nash_conv(game, tree, populations, weights)
    assert report.nash_conv == pytest.approx(expected, abs=1e-9)
    assert report.exploitability == pytest.approx(report.nash_conv / tree.num_players, abs=1e-15)
    assert report.nash_conv >= -1e-12
    assert all(g >= -1e-12 for g in report.best_response_gains)
    assert sum(report.best_response_gains) == pytest.approx(report.nash_conv, abs=1e-12)


def test_mixture_reach_is_meta_weighted_member_reach():
    tree = build_tree("kuhn_poker")
    rng = np.random.default_rng(9)
    populations = [np.stack([random_policy(pt, rng) for _ in range(3)]) for pt in tree.players]
    weights = [np.array([0.2, 0.5, 0.3]), np.array([1.0, 0.0, 0.0])]
    reaches = mixed_reach(tree, populations, weights)
    for pt, population, w, reach in zip(tree.players, populations, weights, reaches):
        expected = sum(wi * sequence_reach(pt, member[None])[0] for wi, member in zip(w, population))
        np.testing.assert_allclose(reach, expected, rtol=0, atol=1e-15)


def test_single_member_nash_conv_matches_openspiel_tabular():
    for game_string in ["kuhn_poker", "kuhn_poker(players=3)"]:
        tree = build_tree(game_string)
        game = load_game(game_string)
        rng = np.random.default_rng(4)
        policies = [random_policy(pt, rng) for pt in tree.players]
        report = nash_conv(tree, [p[None] for p in policies], [np.ones(1)] * tree.num_players)
        tabular = to_openspiel(game, tree, policies)
        assert report.nash_conv == pytest.approx(os_exploitability.nash_conv(game, tabular), abs=1e-9)
        values = pyspiel.expected_returns(
            game.new_initial_state(), policy_lib.python_policy_to_pyspiel_policy(tabular), -1, True
        )
        np.testing.assert_allclose(report.mixture_values, values, rtol=0, atol=1e-9)
        np.testing.assert_allclose(profile_values(tree, own_reaches(tree, policies)), values, rtol=0, atol=1e-9)


# --------------------------------------------------------------------------------------------
# Known values
# --------------------------------------------------------------------------------------------


def uniform_report(game_string):
    tree = build_tree(game_string)
    return nash_conv(tree, [pt.uniform_policy()[None] for pt in tree.players], [np.ones(1)] * tree.num_players)


def test_uniform_kuhn_nash_conv_is_eleven_twelfths():
    report = uniform_report("kuhn_poker")
    assert report.nash_conv == pytest.approx(11 / 12, abs=1e-12)
    assert report.exploitability == pytest.approx(11 / 24, abs=1e-12)
    game = load_game("kuhn_poker")
    assert report.nash_conv == pytest.approx(
        os_exploitability.nash_conv(game, policy_lib.UniformRandomPolicy(game)), abs=1e-12
    )


def kuhn_equilibrium(alpha: float) -> dict[str, list[float]]:
    """The closed-form Kuhn equilibrium family (Kuhn 1950), actions [pass, bet]; cards 0=J,1=Q,2=K."""
    return {
        # player 0
        "0": [1 - alpha, alpha],
        "0pb": [1.0, 0.0],
        "1": [1.0, 0.0],
        "1pb": [1 - (alpha + 1 / 3), alpha + 1 / 3],
        "2": [1 - 3 * alpha, 3 * alpha],
        "2pb": [0.0, 1.0],
        # player 1
        "0p": [2 / 3, 1 / 3],
        "0b": [1.0, 0.0],
        "1p": [1.0, 0.0],
        "1b": [2 / 3, 1 / 3],
        "2p": [0.0, 1.0],
        "2b": [0.0, 1.0],
    }


@pytest.mark.parametrize("alpha", [0.0, 1 / 6, 1 / 3])
def test_kuhn_closed_form_equilibrium_has_zero_nash_conv(alpha):
    tree = build_tree("kuhn_poker")
    table = kuhn_equilibrium(alpha)
    policies = [np.array([table[s] for s in pt.infostates]) for pt in tree.players]
    report = nash_conv(tree, [p[None] for p in policies], [np.ones(1)] * 2)
    assert report.nash_conv == pytest.approx(0.0, abs=1e-12)
    assert report.mixture_values[0] == pytest.approx(-1 / 18, abs=1e-12)  # the game's value
    assert report.mixture_values[1] == pytest.approx(1 / 18, abs=1e-12)


def test_cfr_average_policy_is_near_nash_and_agrees_with_openspiel():
    game = load_game("kuhn_poker")
    tree = build_tree("kuhn_poker")
    solver = pyspiel.CFRSolver(game)
    for _ in range(300):
        solver.evaluate_and_update_policy()
    average = solver.average_policy()
    policies = []
    for pt in tree.players:
        rows = []
        for state in pt.infostates:
            probs = dict(average.get_state_policy(state))
            rows.append([probs.get(a, 0.0) for a in range(pt.num_actions)])
        policies.append(np.array(rows))
    report = nash_conv(tree, [p[None] for p in policies], [np.ones(1)] * 2)
    expected = pyspiel.nash_conv(game, average)
    assert report.nash_conv == pytest.approx(expected, abs=1e-9)
    assert report.nash_conv < 1e-2
    # And a mixture of that average with itself changes nothing.
    doubled = nash_conv(tree, [np.stack([p, p]) for p in policies], [np.array([0.3, 0.7])] * 2)
    assert doubled.nash_conv == pytest.approx(report.nash_conv, abs=1e-12)


# --------------------------------------------------------------------------------------------
# load_game errors
# --------------------------------------------------------------------------------------------


def _assert_one_line_game_error(game_string):
    with pytest.raises(GameError) as info:
        load_game(game_string)
    message = str(info.value)
    assert "\n" not in message
    assert game_string in message
    return message


def test_unknown_game_string_is_a_one_line_game_error():
    message = _assert_one_line_game_error("no_such_game")
    assert "psro games" in message


def test_bad_game_parameter_is_a_one_line_game_error():
    _assert_one_line_game_error("kuhn_poker(bogus=1)")
    _assert_one_line_game_error("kuhn_poker(players=x)")


def test_empty_game_string_is_a_game_error():
    for bad in ["", "   "]:
        with pytest.raises(GameError) as info:
            load_game(bad)
        assert "\n" not in str(info.value)


def _registered(short_name):
    return next(t for t in pyspiel.registered_games() if t.short_name == short_name)


def test_game_without_information_state_strings_is_rejected():
    assert not _registered("catch").provides_information_state_string
    assert _registered("catch").dynamics == pyspiel.GameType.Dynamics.SEQUENTIAL
    message = _assert_one_line_game_error("catch")
    assert "information-state" in message


def test_mean_field_game_is_rejected():
    assert _registered("mfg_crowd_modelling").dynamics == pyspiel.GameType.Dynamics.MEAN_FIELD
    message = _assert_one_line_game_error("mfg_crowd_modelling")
    assert "sequential" in message


def test_sampled_chance_game_is_rejected():
    game_type = _registered("tarok")
    assert game_type.provides_information_state_string
    assert game_type.chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC
    message = _assert_one_line_game_error("tarok")
    assert "sampled" in message


def test_simultaneous_game_is_converted_to_turn_based():
    game = load_game("goofspiel(num_cards=3)")
    assert game.get_type().dynamics == pyspiel.GameType.Dynamics.SEQUENTIAL
    assert pyspiel.load_game("goofspiel(num_cards=3)").get_type().dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS


def test_too_large_game_is_a_one_line_game_error():
    with pytest.raises(GameError) as info:
        build_tree("leduc_poker", max_histories=1000)
    assert "\n" not in str(info.value)
    assert "leduc_poker" in str(info.value)
