"""Tests for scripts/verify_export.py, the OpenSpiel-only checker of exported PSRO results.

Most exports here are written by hand (not by the framework), and the expected NashConv of
every case comes from a source independent of the script: a known closed-form value, or
OpenSpiel's exploitability.nash_conv on a mixture built here without PolicyAggregator. The
framework's own exports of simultaneous-move games are checked with OpenSpiel alone, from
summary.json's game string as written.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import numpy as np
import pyspiel
import pytest
from open_spiel.python import policy as policy_lib
from open_spiel.python.algorithms import exploitability

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "verify_export.py"
_spec = importlib.util.spec_from_file_location("verify_export", SCRIPT)
verify_export = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(verify_export)

KUHN_UNIFORM_NASH_CONV = 11 / 12  # 2-player Kuhn, both players uniform: exploitability 0.458333


# --------------------------------------------------------------------------------------------
# Building exports and reference values
# --------------------------------------------------------------------------------------------


TURN_BASED_RPS = "turn_based_simultaneous_game(game=matrix_rps())"


def load_turn_based(game_string: str) -> pyspiel.Game:
    game = pyspiel.load_game(game_string)
    if game.get_type().dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
        game = pyspiel.convert_to_turn_based(game)
    return game


def member_table(tabular: policy_lib.TabularPolicy, player: int) -> dict:
    """The export format of one member: info state string -> full action probability row."""
    return {
        key: tabular.action_probability_array[tabular.state_lookup[key]].tolist()
        for key in tabular.states_per_player[player]
    }


def deterministic_policy(game, seed: int) -> policy_lib.TabularPolicy:
    """A random pure policy (one legal action per information state) for every player."""
    rng = np.random.default_rng(seed)
    tabular = policy_lib.TabularPolicy(game)
    tabular.action_probability_array[:] = 0.0
    for row, mask in enumerate(tabular.legal_actions_mask):
        tabular.action_probability_array[row, rng.choice(np.flatnonzero(mask))] = 1.0
    return tabular


def write_export(directory: pathlib.Path, game_string: str, populations, weights, nash_conv):
    """Write the framework's export layout; populations[p] is a list of TabularPolicy."""
    num_players = len(populations)
    (directory / "summary.json").write_text(
        json.dumps(
            {
                "game": game_string,
                "num_players": num_players,
                "iterations": 1,
                "nash_conv": nash_conv,
                "exploitability": nash_conv / num_players,
                "meta_solver": "test",
                "oracle": "test",
                "wall_seconds": 0.0,
            }
        )
    )
    (directory / "meta_strategy.json").write_text(
        json.dumps({str(p): list(map(float, w)) for p, w in enumerate(weights)})
    )
    for player, members in enumerate(populations):
        folder = directory / "policies" / f"player_{player}"
        folder.mkdir(parents=True)
        for k, member in enumerate(members):
            (folder / f"member_{k}.json").write_text(json.dumps(member_table(member, player)))
    return directory


def hand_mixture(game, populations, weights) -> policy_lib.TabularPolicy:
    """The behavioural policy equivalent to each player mixing its members, built directly.

    At information state I of player p the mixture plays
        sum_k w_k * reach_k(I) * pi_k(I)  /  sum_k w_k * reach_k(I),
    where reach_k(I) is the product of member k's own probabilities on the way to I
    (perfect recall makes it the same for every history in I). Written independently of
    PolicyAggregator so the test does not check the script against itself.
    """
    mixture = policy_lib.TabularPolicy(game)
    numerators = np.zeros_like(mixture.action_probability_array)

    def walk(state, own_reach):  # own_reach[p][k]
        if state.is_terminal():
            return
        if state.is_chance_node():
            for action, _ in state.chance_outcomes():
                walk(state.child(action), own_reach)
            return
        player = state.current_player()
        key = state.information_state_string(player)
        members = populations[player]
        rows = np.array([m.action_probability_array[m.state_lookup[key]] for m in members])
        weighted_reach = np.asarray(weights[player]) * own_reach[player]
        numerators[mixture.state_lookup[key]] += weighted_reach @ rows  # once per history
        for action in state.legal_actions():
            child_reach = list(own_reach)
            child_reach[player] = own_reach[player] * rows[:, action]
            walk(state.child(action), child_reach)

    walk(game.new_initial_state(), [np.ones(len(m)) for m in populations])
    for row, numerator in enumerate(numerators):
        if numerator.sum() > 0:  # unreachable states keep the uniform row
            mixture.action_probability_array[row] = numerator / numerator.sum()
    return mixture


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


def test_uniform_kuhn_matches_known_nash_conv(tmp_path):
    game = load_turn_based("kuhn_poker")
    uniform = policy_lib.TabularPolicy(game)
    write_export(tmp_path, "kuhn_poker", [[uniform, uniform], [uniform]], [[0.3, 0.7], [1.0]], KUHN_UNIFORM_NASH_CONV)
    result = verify_export.verify(tmp_path, 1e-9)
    assert result["openspiel_nash_conv"] == pytest.approx(KUHN_UNIFORM_NASH_CONV, abs=1e-12)
    assert result["openspiel_exploitability"] == pytest.approx(KUHN_UNIFORM_NASH_CONV / 2)
    assert result["passed"]


def test_mixture_of_deterministic_kuhn_policies(tmp_path):
    game = load_turn_based("kuhn_poker")
    populations = [
        [deterministic_policy(game, 1), deterministic_policy(game, 2)],
        [deterministic_policy(game, 3), deterministic_policy(game, 4)],
    ]
    weights = [[0.25, 0.75], [0.6, 0.4]]
    expected = exploitability.nash_conv(game, hand_mixture(game, populations, weights))
    write_export(tmp_path, "kuhn_poker", populations, weights, expected)
    result = verify_export.verify(tmp_path, 1e-9)
    assert result["openspiel_nash_conv"] == pytest.approx(expected, abs=1e-9)
    assert result["passed"]


def test_three_player_kuhn(tmp_path):
    game_string = "kuhn_poker(players=3)"
    game = load_turn_based(game_string)
    uniform = policy_lib.TabularPolicy(game)
    populations = [[deterministic_policy(game, 10 + p), uniform] for p in range(3)]
    weights = [[0.5, 0.5], [0.2, 0.8], [0.9, 0.1]]
    expected = exploitability.nash_conv(game, hand_mixture(game, populations, weights))
    write_export(tmp_path, game_string, populations, weights, expected)
    result = verify_export.verify(tmp_path, 1e-9)
    assert result["num_players"] == 3
    assert result["openspiel_nash_conv"] == pytest.approx(expected, abs=1e-9)
    assert result["passed"]


def pure_rps_members(game, player):
    """Rock, paper and scissors as three pure policies of ``player`` in turn-based RPS."""
    members = []
    for action in range(3):
        member = policy_lib.TabularPolicy(game)
        row = member.state_lookup[member.states_per_player[player][0]]
        member.action_probability_array[row] = np.eye(3)[action]
        members.append(member)
    return members


@pytest.mark.parametrize(
    "weights, expected",
    [
        ([[1 / 3, 1 / 3, 1 / 3], [1 / 3, 1 / 3, 1 / 3]], 0.0),  # the equilibrium
        ([[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]], 1.0),  # player 1 gains 1 by playing paper
    ],
)
def test_turn_based_conversion_of_a_simultaneous_game(tmp_path, weights, expected):
    game = pyspiel.load_game(TURN_BASED_RPS)
    populations = [pure_rps_members(game, 0), pure_rps_members(game, 1)]
    write_export(tmp_path, TURN_BASED_RPS, populations, weights, expected)
    result = verify_export.verify(tmp_path, 1e-9)
    assert result["openspiel_nash_conv"] == pytest.approx(expected, abs=1e-9)
    assert result["passed"]


def test_a_simultaneous_game_string_is_refused_naming_its_conversion(tmp_path):
    """Turn-based policies under a simultaneous game's name: the script does not guess the
    conversion, it says which string the export should have named."""
    game = pyspiel.load_game(TURN_BASED_RPS)
    write_export(
        tmp_path, "matrix_rps", [pure_rps_members(game, 0), pure_rps_members(game, 1)], [[1 / 3] * 3, [1 / 3] * 3], 0.0
    )
    with pytest.raises(
        verify_export.ExportError,
        match=r"'matrix_rps' is a simultaneous-move game; .* "
        r"turn_based_simultaneous_game\(game=matrix_rps\(\)\)",
    ):
        verify_export.verify(tmp_path)


@pytest.mark.parametrize("game_string", ["matrix_rps", "goofspiel(num_cards=4,imp_info=True)"])
def test_psro_export_of_a_simultaneous_game_checks_with_openspiel_alone(tmp_path, game_string):
    """summary.json's game string, loaded by OpenSpiel alone, is the game the exported policies
    are keyed by: every member is a full TabularPolicy of it, and the mixture's NashConv is the
    one PSRO reported."""
    from marl_core.psro.config import PSROConfig
    from marl_core.psro.export import write_export as psro_export
    from marl_core.psro.steps import run_psro_local

    config = PSROConfig(game=game_string, iterations=2)
    records = []
    state = run_psro_local(config, on_iteration=lambda record, _: records.append(record))
    psro_export(
        tmp_path, config, state.populations, state.meta_strategy, records[-1].report, records[-1].iteration, 0.0
    )

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["configured_game"] == game_string
    game = pyspiel.load_game(summary["game"])
    assert game.get_type().dynamics == pyspiel.GameType.Dynamics.SEQUENTIAL, (
        f"summary.json names {summary['game']!r}, a simultaneous-move game; "
        "the policies are keyed by its turn-based conversion"
    )
    weights = json.loads((tmp_path / "meta_strategy.json").read_text())
    populations = []
    for player in range(game.num_players()):
        members = []
        for k in range(len(weights[str(player)])):
            table = json.loads((tmp_path / "policies" / f"player_{player}" / f"member_{k}.json").read_text())
            member = policy_lib.TabularPolicy(game)
            assert sorted(table) == sorted(member.states_per_player[player])
            for key, row in table.items():
                member.action_probability_array[member.state_lookup[key]] = row
            members.append(member)
        populations.append(members)
    mixture = hand_mixture(game, populations, [weights[str(p)] for p in range(game.num_players())])
    assert exploitability.nash_conv(game, mixture) == pytest.approx(summary["nash_conv"], abs=1e-9)
    assert verify_export.verify(tmp_path, 1e-9)["passed"]


# --------------------------------------------------------------------------------------------
# Command line and errors
# --------------------------------------------------------------------------------------------


def uniform_kuhn_export(directory, reported):
    game = load_turn_based("kuhn_poker")
    uniform = policy_lib.TabularPolicy(game)
    return write_export(directory, "kuhn_poker", [[uniform], [uniform]], [[1.0], [1.0]], reported)


def test_cli_exits_0_when_reported_value_matches(tmp_path, capsys):
    uniform_kuhn_export(tmp_path, KUHN_UNIFORM_NASH_CONV)
    assert verify_export.main([str(tmp_path)]) == 0
    assert "OK" in capsys.readouterr().out


def test_cli_exits_1_on_wrong_reported_nash_conv(tmp_path, capsys):
    uniform_kuhn_export(tmp_path, KUHN_UNIFORM_NASH_CONV + 1e-3)
    assert verify_export.main([str(tmp_path), "--tolerance", "1e-6"]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    # A loose enough tolerance accepts the same export.
    assert verify_export.main([str(tmp_path), "--tolerance", "1e-2"]) == 0


def test_missing_information_state_is_a_clear_error(tmp_path, capsys):
    uniform_kuhn_export(tmp_path, KUHN_UNIFORM_NASH_CONV)
    member_path = tmp_path / "policies" / "player_1" / "member_0.json"
    table = json.loads(member_path.read_text())
    dropped = sorted(table)[0]
    del table[dropped]
    member_path.write_text(json.dumps(table))

    with pytest.raises(verify_export.ExportError, match="missing 1 of 6 information states") as exc:
        verify_export.verify(tmp_path)
    assert repr(dropped) in str(exc.value) and "member_0.json" in str(exc.value)
    assert verify_export.main([str(tmp_path)]) == 2
    assert "malformed export" in capsys.readouterr().err


def test_weights_must_match_population(tmp_path):
    uniform_kuhn_export(tmp_path, KUHN_UNIFORM_NASH_CONV)
    (tmp_path / "meta_strategy.json").write_text(json.dumps({"0": [0.5, 0.5], "1": [1.0]}))
    with pytest.raises(verify_export.ExportError, match="1 member files but 2"):
        verify_export.verify(tmp_path)
