"""Every scenario's commands have one shape: the same common flags, refused the same way. (A run
that checks its settings once, and a scenario defined only in the tests that gets the same
commands: `test_stopping.py`, whose toy is stopped and continued through them.)

The registry of scenarios (`flows.scenarios.SCENARIOS`) is what these iterate over, so a new
scenario is covered the day it is registered.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from flows.scenarios import SCENARIOS

TESTS = Path(__file__).resolve().parent
SPREAD = "pettingzoo:mpe2.simple_spread_v3"
PBT_CONFIG = """\
marl: {env: "pettingzoo:mpe2.simple_spread_v3", algorithm: mappo}
pbt: {perturbation_interval: 2, hyperparam_mutations: {lr: [1.0e-4, 1.0e-3]}}
"""
# What each scenario's `run` needs besides the flag under test, to be a run that would start.
GOOD = {"psro": [], "marl": ["--env", SPREAD], "league": [], "pbt": ["--config", "pbt.yaml"], "cfr": []}
BAD_COMMON_FLAGS = [
    (("--num-cpus", "0"), "num_cpus=0: Input should be greater than 0"),
    (("--experiment", ""), "experiment='': String should have at least 1 character"),
    (
        ("--tracking-uri", "sqlite:///missing/mlflow.db"),
        "tracking_uri='sqlite:///missing/mlflow.db': directory 'missing' does not exist; expected sqlite:///FILE.db "
        "in an existing writable directory, http(s)://HOST:PORT of an MLflow server, or a database URL "
        "(postgresql://, mysql://, mssql://)",
    ),
    (("--ray-address", "nowhere"), "ray_address='nowhere': not an address; expected HOST:PORT"),
    (("--num-cpus", "two"), "num_cpus='two': Input should be a valid integer"),
]


def test_every_registered_scenario_has_its_commands():
    assert set(GOOD) == set(SCENARIOS), "a scenario without a row here: give it one"
    for name in SCENARIOS:
        command = ["run", "--help"] if name == "psro" else [name, "run", "--help"]
        shown = CliRunner().invoke(app, command, terminal_width=200)
        assert shown.exit_code == 0, shown.output
        for flag in ("--config", "--tracking-uri", "--experiment", "--ray-address", "--num-cpus", "--resume"):
            assert flag in shown.output, (name, flag)


@pytest.mark.parametrize("flag, message", BAD_COMMON_FLAGS, ids=[f[0][0] + "=" + f[0][1] for f in BAD_COMMON_FLAGS])
def test_every_scenario_refuses_a_bad_common_flag_with_the_same_line_and_writes_nothing(
    flag, message, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pbt.yaml").write_text(PBT_CONFIG)
    lines = {}
    for name in SCENARIOS:
        command = ["run"] if name == "psro" else [name, "run"]
        result = CliRunner().invoke(app, [*command, *GOOD[name], *flag], terminal_width=400)
        assert (result.exit_code, result.stdout) == (2, ""), (name, result.output)
        lines[name] = result.stderr.strip()
    assert len(set(lines.values())) == 1, lines
    assert next(iter(lines.values())).startswith(f"error: {message}"), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pbt.yaml"]


CFR_FILE = "scenario: cfr\ngame: kuhn_poker\nrounds: 2\n"
WRONG_FILES = [
    (["run", "--config", "cfr.yaml", "--iterations", "3"], "No such option: --iterations (Possible options: "),
    (["run", "--config", "cfr.yaml", "--rounds", "0"], "rounds=0: Input should be greater than 0"),
    (["run", "--config", "cfr.yaml", "--game", "tic_tac_toe"], "neural CFR acts on information-state tensors"),
    (["run", "--config", "cfr.yaml", "--rouds", "3"], "No such option: --rouds (Possible options: --rounds"),
    (["run", "--iteratons", "3"], "No such option: --iteratons (Possible options: --iterations"),
    (["marl", "run", "--config", "cfr.yaml"], "cfr.yaml is a cfr config (scenario: cfr); run it with psro cfr run"),
    (["run", "--config", "other.yaml"], "other.yaml: scenario='chess': unknown scenario 'chess'; choose one of: "),
]


@pytest.mark.parametrize("command, message", WRONG_FILES, ids=[" ".join(c) for c, _ in WRONG_FILES])
def test_psro_run_runs_another_scenarios_file_with_its_flags_and_refuses_what_does_not_fit(
    command, message, tmp_path, monkeypatch
):
    """`psro run --config FILE` where FILE says `scenario: cfr` is `psro cfr run --config FILE`:
    the cfr flags it is given are checked by that command, and every refusal is one line that
    writes nothing."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfr.yaml").write_text(CFR_FILE)
    (tmp_path / "other.yaml").write_text("scenario: chess\n")
    result = CliRunner().invoke(app, command, terminal_width=400)
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr.strip().startswith(f"error: {message}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfr.yaml", "other.yaml"]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_resuming_a_run_that_is_not_there_says_so_in_one_line_and_makes_no_store(name, tmp_path, monkeypatch):
    """In a directory without a store: no `mlflow.db` is created to find that out."""
    monkeypatch.chdir(tmp_path)
    command = ["resume"] if name == "psro" else [name, "resume"]
    result = CliRunner().invoke(app, [*command, "NO_SUCH_RUN"], terminal_width=400)
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    store = tmp_path / "mlflow.db"
    assert result.stderr.strip() == "error: no MLflow store at sqlite:///mlflow.db (no file 'mlflow.db')"
    assert not store.exists() and list(tmp_path.iterdir()) == []


def test_ratings_of_a_run_that_is_not_there_make_no_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["ratings", "--run", "NO_SUCH_RUN"], terminal_width=400)
    assert result.exit_code == 2 and "no MLflow store" in result.stderr, result.output
    assert list(tmp_path.iterdir()) == []
