"""PSROConfig validation: good defaults, and one-line ConfigErrors that name the bad value."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from marl_core.empirical_game.meta_solvers import META_SOLVERS
from marl_core.psro.config import ConfigError, PSROConfig, build_config, load_config_file
from marl_core.psro.oracles import ORACLES


def test_defaults_are_valid():
    config = build_config({})
    assert isinstance(config, PSROConfig)
    assert config.game == "kuhn_poker"
    assert config.meta_solver in META_SOLVERS
    assert config.oracle in ORACLES
    assert config.eval in ("exact", "sampled")
    assert config.iterations > 0 and config.episodes > 0
    assert config.stop_exploitability is None
    assert config.num_players == 2


def test_good_values_are_kept():
    config = build_config(
        {
            "game": "kuhn_poker(players=3)",
            "meta_solver": "prd",
            "iterations": 4,
            "eval": "sampled",
            "episodes": 10,
            "seed": 7,
            "stop_exploitability": 0.0,
        }
    )
    assert config.num_players == 3
    assert (config.meta_solver, config.iterations, config.eval, config.episodes, config.seed) == (
        "prd",
        4,
        "sampled",
        10,
        7,
    )
    assert config.stop_exploitability == 0.0


def test_every_general_meta_solver_is_accepted_for_three_players():
    for name, solver in META_SOLVERS.items():
        if not solver.two_player_zero_sum_only:
            assert build_config({"game": "kuhn_poker(players=3)", "meta_solver": name}).meta_solver == name
        assert build_config({"game": "kuhn_poker", "meta_solver": name}).meta_solver == name


def test_config_is_frozen():
    config = build_config({})
    with pytest.raises(pydantic.ValidationError):
        config.iterations = 5


BAD = [
    # (values, text the message must contain)
    ({"game": "no_such_game"}, "no_such_game"),
    ({"game": "kuhn_poker(players=x)"}, "kuhn_poker(players=x)"),
    ({"game": "catch"}, "catch"),
    ({"meta_solver": "bogus_solver"}, "bogus_solver"),
    ({"oracle": "bogus_oracle"}, "bogus_oracle"),
    ({"iterations": 0}, "iterations=0"),
    ({"iterations": -3}, "iterations=-3"),
    ({"episodes": 0}, "episodes=0"),
    ({"eval": "bogus"}, "bogus"),
    ({"game": "kuhn_poker(players=3)", "meta_solver": "nash"}, "nash"),
    ({"bogus_key": 1}, "bogus_key"),
    ({"iterations": "abc"}, "abc"),
    ({"iterations": 2.5}, "2.5"),
    ({"stop_exploitability": -0.5}, "-0.5"),
    ({"stop_exploitability": float("nan")}, "nan"),
    ({"num_cpus": 0}, "num_cpus"),
    ({"experiment": ""}, "experiment"),
    ({"best_response": {"opponent_epsilon": 1.5}}, "opponent_epsilon"),
    ({"oracle": "dqn", "dqn": {"epsilon_eval": -0.1}}, "epsilon_eval"),
    ({"oracle": "a2c", "a2c": {"entropy_coef": -1}}, "a2c.entropy_coef=-1"),
    ({"a2c": {"hidden": []}}, "a2c.hidden=[]"),
]


@pytest.mark.parametrize("values, named", BAD, ids=[str(v) for v, _ in BAD])
def test_bad_value_is_a_one_line_config_error_naming_it(values, named):
    with pytest.raises(ConfigError) as info:
        build_config(values)
    message = str(info.value)
    assert message and "\n" not in message
    assert named in message
    assert isinstance(info.value, ValueError)
    assert info.value.__cause__ is None  # raised "from None": no pydantic traceback dump


def test_unknown_meta_solver_message_lists_the_choices():
    with pytest.raises(ConfigError) as info:
        build_config({"meta_solver": "bogus_solver"})
    for name in META_SOLVERS:
        assert name in str(info.value)


def test_two_player_only_solver_on_three_players_suggests_general_solvers():
    with pytest.raises(ConfigError) as info:
        build_config({"game": "kuhn_poker(players=3)", "meta_solver": "nash"})
    message = str(info.value)
    assert "3 players" in message
    for name, solver in META_SOLVERS.items():
        if not solver.two_player_zero_sum_only:
            assert name in message


def test_numeric_strings_are_coerced():
    assert build_config({"iterations": "7"}).iterations == 7


# --------------------------------------------------------------------------------------------
# load_config_file
# --------------------------------------------------------------------------------------------


def _one_line_config_error(path):
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    message = str(info.value)
    assert message and "\n" not in message
    assert str(path) in message
    return message


def test_malformed_yaml_is_a_one_line_config_error(tmp_path):
    for text in ["game: [kuhn\n  x: : y\n", "game:\tkuhn\n\tfoo: 1\n", "a: b\n  c: d\n"]:
        path = tmp_path / "bad.yaml"
        path.write_text(text)
        assert "YAML" in _one_line_config_error(path)


def test_yaml_list_is_a_config_error(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- game\n- kuhn_poker\n")
    assert "list" in _one_line_config_error(path)


def test_yaml_scalar_is_a_config_error(tmp_path):
    path = tmp_path / "scalar.yaml"
    path.write_text("kuhn_poker\n")
    _one_line_config_error(path)


def test_missing_file_is_a_config_error(tmp_path):
    _one_line_config_error(tmp_path / "missing.yaml")


def test_directory_is_a_config_error(tmp_path):
    _one_line_config_error(tmp_path)


def test_empty_file_is_an_empty_mapping(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config_file(path) == {}
    path.write_text("# only a comment\n")
    assert load_config_file(path) == {}


def test_dashes_in_keys_map_to_underscores(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("game: kuhn_poker(players=3)\nmeta-solver: prd\nstop-exploitability: 0.05\niterations: 3\n")
    values = load_config_file(path)
    assert values == {
        "game": "kuhn_poker(players=3)",
        "meta_solver": "prd",
        "stop_exploitability": 0.05,
        "iterations": 3,
    }
    config = build_config(values)
    assert config.meta_solver == "prd" and config.stop_exploitability == 0.05 and config.num_players == 3


def test_bad_value_from_a_file_still_names_it(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("meta-solver: nope\n")
    with pytest.raises(ConfigError, match="nope"):
        build_config(load_config_file(path))


@pytest.mark.parametrize("text", ["1: 2\n", "? null\n: 3\n"])
def test_non_string_yaml_key_is_a_config_error(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_config_file(path)


CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


def test_the_shipped_example_configs_exist():
    assert {path.name for path in CONFIGS} >= {
        "simple_adversary_ppo.yaml",
        "connect_four_dqn.yaml",
        "leduc_dqn.yaml",
        "leduc_tabular_q.yaml",
    }


PSRO_CONFIGS = [path for path in CONFIGS if "scenario" not in load_config_file(path)]


def test_the_neural_config_runs_the_neural_cfr_scenario_with_its_defaults():
    """`psro run --config configs/leduc_neural.yaml` runs neural CFR (the file says so); the
    solver's settings it writes out are the defaults, so the file and the code cannot drift."""
    from flows.scenarios import SCENARIOS
    from marl_core.neural_cfr.settings import NeuralCFRSettings

    values = load_config_file(Path(__file__).parent.parent / "configs" / "leduc_neural.yaml")
    assert values.pop("scenario") == "cfr"
    config = SCENARIOS["cfr"].build_config(values)
    assert config.game == "leduc_poker" and config.exact
    assert config.neural_cfr == NeuralCFRSettings()


@pytest.mark.parametrize("path", PSRO_CONFIGS, ids=[path.stem for path in PSRO_CONFIGS])
def test_every_shipped_example_config_is_valid(path):
    config = build_config(load_config_file(path))
    if config.psro_game.has_tree:  # exact payoffs and NashConv where the tree fits
        assert config.eval == "exact" and config.approx_exploitability.every == 0
    else:  # the rest measure approximately
        assert config.eval == "sampled" and config.approx_exploitability.every > 0


MARL_CONFIGS = sorted((Path(__file__).parent.parent / "configs" / "marl").glob("*/*.yaml"))


@pytest.mark.parametrize("path", MARL_CONFIGS, ids=[f"{path.parent.name}/{path.stem}" for path in MARL_CONFIGS])
def test_every_shipped_marl_config_is_valid(path):
    """`psro marl run --config` examples, `configs/marl/<task>/<algorithm>.yaml`: each loads as
    MARL settings, its algorithm's included, and is the algorithm its name says."""
    import yaml

    from marl_core.marl.config import MARLConfig

    config = MARLConfig(**yaml.safe_load(path.read_text()))
    assert config.algorithm_settings is not None and path.stem == config.algorithm
    assert MARL_CONFIGS and not list(path.parent.parent.glob("*.yaml")), "MARL configs go in configs/marl/<task>/"


LEAGUE_CONFIGS = sorted((Path(__file__).parent.parent / "configs" / "league").glob("*.yaml"))
PBT_CONFIGS = sorted((Path(__file__).parent.parent / "configs" / "pbt").glob("*.yaml"))


@pytest.mark.parametrize("path", LEAGUE_CONFIGS, ids=[path.stem for path in LEAGUE_CONFIGS])
def test_every_shipped_league_config_is_valid(path):
    """`psro league run --config` examples, PBT among a league's players included."""
    from marl_core.league.config import build_league_config

    config = build_league_config(load_config_file(path))
    assert path.stem.split("_")[-1] in (config.algorithm, "pbt") and (config.pbt is not None) == path.stem.endswith(
        "pbt"
    )


@pytest.mark.parametrize("path", PBT_CONFIGS, ids=[path.stem for path in PBT_CONFIGS])
def test_every_shipped_pbt_config_is_valid(path):
    """`psro pbt run --config` examples."""
    from marl_core.pbt.marl import PBTConfig

    config = PBTConfig(**load_config_file(path))
    assert path.stem.endswith(config.marl.algorithm) and config.marl.experiment == "pbt"
