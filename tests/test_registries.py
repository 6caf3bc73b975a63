"""One way to add an algorithm: a registry line is all an RL algorithm needs to be a learned PSRO
oracle (with its settings under its name in a PSRO config), and every registry lists what it
holds with a one-line summary, without importing torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from marl_core.empirical_game.evaluation import EVALUATORS
from marl_core.empirical_game.meta_solvers import META_SOLVERS
from marl_core.envs import BATCHED_SOURCES, ENVIRONMENT_SOURCES
from marl_core.league.pfsp import WEIGHTINGS
from marl_core.league.players import MATCHMAKING
from marl_core.marl import MARL_ALGORITHMS
from marl_core.policies.neural import NeuralPolicy
from marl_core.psro.config import GAME_DEFAULTS, ConfigError, build_config
from marl_core.psro.oracles import ORACLES
from marl_core.rl import ALGORITHMS

REGISTRIES = [
    ALGORITHMS,
    MARL_ALGORITHMS,
    ORACLES,
    META_SOLVERS,
    EVALUATORS,
    ENVIRONMENT_SOURCES,
    BATCHED_SOURCES,
    WEIGHTINGS,
    MATCHMAKING,
]


@pytest.mark.parametrize("registry", REGISTRIES, ids=lambda registry: registry.kind)
def test_every_entry_has_a_one_line_summary_and_loads(registry):
    for name in registry:
        summary = registry.summary(name)
        assert summary and "\n" not in summary, name
        assert registry[name] is not None


@pytest.mark.parametrize("registry", [ALGORITHMS, MARL_ALGORITHMS], ids=lambda registry: registry.kind)
def test_an_algorithms_registry_line_names_the_settings_its_module_uses(registry):
    for name in registry:
        assert registry.settings(name) is registry[name].config, name


def test_every_rl_algorithm_is_a_learned_oracle_and_exact_the_only_other():
    assert set(ORACLES) == {"exact", *ALGORITHMS}
    assert [name for name, oracle in ORACLES.items() if not oracle.learns] == ["exact"]
    for name in ALGORITHMS:
        assert ORACLES[name].name == name and ALGORITHMS.summary(name) in ORACLES.summary(name)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_a_config_takes_an_algorithms_settings_under_its_name_over_the_game_defaults(name):
    config = build_config({"oracle": name, name: {"seed": 5}})
    settings = config.oracle_settings
    assert type(settings) is ALGORITHMS.settings(name)
    defaults = GAME_DEFAULTS[name] if name in GAME_DEFAULTS else ALGORITHMS.settings(name)()
    assert settings == defaults.model_copy(update={"seed": 5})
    assert build_config(config.model_dump(mode="json")) == config  # as a resumed run rebuilds it


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_a_bad_setting_of_an_algorithm_is_one_line_naming_it_and_what_is_allowed(name):
    fields = ", ".join(ALGORITHMS.settings(name).model_fields)
    with pytest.raises(ConfigError) as misspelt:
        build_config({"oracle": name, name: {"sed": 5}})
    assert str(misspelt.value) == f"{name}.sed=5: Extra inputs are not permitted; {name} takes: {fields}"
    with pytest.raises(ConfigError) as wrong_type:
        build_config({"oracle": name, name: {"seed": "five"}})
    assert (
        str(wrong_type.value)
        == f"{name}.seed='five': Input should be a valid integer, unable to parse string as an integer"
    )


def test_exact_has_no_settings():
    with pytest.raises(ValueError, match="oracle 'exact' is not learned and has no settings"):
        _ = build_config({"oracle": "exact"}).oracle_settings


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_rl_algorithm_is_a_working_oracle_on_kuhn(name):
    """One PSRO iteration in this process (the local runner):
    each role gains a network of the algorithm, trained on the whole budget with the settings of
    the config's section, that took gradient steps and is evaluated exactly."""
    from marl_core.psro import steps

    torch.set_num_threads(1)
    config = build_config(
        {
            "oracle": name,
            "iterations": 1,
            "seed": 1,
            "best_response": {"episodes": 1500, "episodes_per_round": 500},
            "rollout": {"workers": 1, "envs_per_worker": 16},
        }
    )
    iterations = list(steps.iterate_psro_local(config))
    last_record, state = iterations[-1]
    assert len(iterations) == 2 and np.isfinite(last_record.exploitability)
    expected = {key: value for key, value in config.oracle_settings.model_dump(mode="json").items() if key != "seed"}
    for role, population in enumerate(state.populations):
        assert len(population.members) == 2
        member = population.members[1]
        assert isinstance(member, NeuralPolicy) and member.algorithm == name
        assert isinstance(member.network, ALGORITHMS[name].policy)
        assert {key: value for key, value in member.config.items() if key != "seed"} == expected
        assert last_record.oracle_metrics[f"player_{role}/oracle_episodes"] == 1500
        assert last_record.oracle_metrics[f"player_{role}/oracle_gap_to_exact"] >= -1e-9
        # its parameters moved from where the response's seed started them (buffers such as
        # DQN's epsilon move without a gradient step)
        untrained = ALGORITHMS[name].trainer(
            member.obs_size, member.num_actions, ALGORITHMS.settings(name)(**member.config)
        )
        start = dict(untrained.policy.named_parameters())
        assert any(not torch.equal(start[key], value) for key, value in member.network.named_parameters())


def test_listing_and_checking_names_and_settings_imports_no_torch():
    """Registries load torch-backed entries on first use: listing them or checking a config does not."""
    check = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from flows.cli.app import app\n"
        "from marl_core.psro.config import build_config\n"
        "from marl_core.marl.config import MARLConfig\n"
        "for name in ('dqn', 'ppo', 'a2c'):\n"
        "    build_config({'oracle': name, name: {'lr': 0.01}})\n"
        "MARLConfig(env='pettingzoo:mpe2.simple_spread_v3', algorithm='mappo', settings={'lr': 0.01})\n"
        "for command in (['oracles'], ['marl', 'algorithms'], ['solvers']):\n"
        "    assert CliRunner().invoke(app, command).exit_code == 0\n"
        "print(sorted(m for m in ('torch', 'marl_core.rl.dqn', 'marl_core.marl.mappo') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
