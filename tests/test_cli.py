"""Bad input fails at once: one line, exit code 2, and nothing written to MLflow or Prefect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli.app import app

CASES = [
    (["--game", "no_such_game"], "unknown game 'no_such_game'; run `psro games` to list games"),
    (["--game", "kuhn_poker(players=)"], "cannot load game 'kuhn_poker(players=)'"),
    (
        ["--meta-solver", "best"],
        "unknown meta-solver 'best'; choose one of: alpharank, fictitious_play, last, nash, prd, "
        "regret_matching, uniform",
    ),
    (["--oracle", "sarsa"], "unknown oracle 'sarsa'; choose one of: a2c, appo, dqn, exact, impala, ppo, tabular_q"),
    (["--iterations", "0"], "iterations=0: Input should be greater than 0"),
    (["--iterations", "-5"], "iterations=-5: Input should be greater than 0"),
    (["--episodes", "1"], "episodes=1: Input should be greater than or equal to 2"),
    (["--eval", "approximate"], "eval='approximate': Input should be 'exact' or 'sampled'"),
    (
        ["--game", "kuhn_poker(players=3)", "--meta-solver", "nash"],
        "meta-solver 'nash' needs a two-player zero-sum game",
    ),
    (["--stop-exploitability", "-1"], "stop_exploitability=-1.0: Input should be greater than or equal to 0"),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    return tmp_path


def _run(args):
    return CliRunner().invoke(app, ["run", *args])


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_flag_fails_with_one_line_and_writes_nothing(workdir, args, message):
    result = _run([*args, "--tracking-uri", f"sqlite:///{workdir}/mlflow.db"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert message in lines[0]
    assert sorted(p.name for p in workdir.iterdir()) == []  # no MLflow store, no Prefect home


@pytest.mark.parametrize(
    "text,message",
    [
        ("game: [kuhn_poker\n", "is not valid YAML"),
        ("- kuhn_poker\n", "must hold a mapping of settings, got list"),
        ("game: kuhn_poker\nlearning_rate: 0.1\n", "learning_rate=0.1: Extra inputs are not permitted"),
        ("iterations: many\n", "iterations='many': Input should be a valid integer"),
    ],
)
def test_bad_config_file_fails_with_one_line(workdir, text, message):
    config = workdir / "run.yaml"
    config.write_text(text)
    result = _run(["--config", str(config)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert message in result.output
    assert sorted(p.name for p in workdir.iterdir()) == ["run.yaml"]


def test_missing_config_file(workdir):
    result = _run(["--config", "absent.yaml"])
    assert result.exit_code == 2
    assert "cannot read config file 'absent.yaml'" in result.output


def test_listings_name_every_registered_entry(monkeypatch):
    from flows.cli import app as cli
    from flows.cli import scenario_commands as scenario_cli
    from marl_core.empirical_game.meta_solvers import META_SOLVERS
    from marl_core.marl import MARL_ALGORITHMS
    from marl_core.psro.oracles import ORACLES

    # The commands' consoles took their width when the modules were imported (80 columns where no
    # terminal was there); wide enough here that no summary wraps onto a second line.
    for module in (cli, scenario_cli):
        monkeypatch.setattr(module.console, "width", 300)

    for command, registry in (
        (["solvers"], META_SOLVERS),
        (["oracles"], ORACLES),
        (["marl", "algorithms"], MARL_ALGORITHMS),
    ):
        listing = CliRunner().invoke(app, command, env={"COLUMNS": "300"})
        assert listing.exit_code == 0, listing.output
        rows = {
            line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in listing.output.splitlines()
            if line.count("│") == 3
        }
        assert rows == {name: registry.summary(name) for name in registry}, command
    games = CliRunner().invoke(app, ["games"], terminal_width=200)
    assert games.exit_code == 0 and "leduc_poker" in games.output and "kuhn_poker" in games.output


def test_a_real_terminal_sees_exactly_one_line(workdir):
    """OpenSpiel's C++ writes its game list straight to file descriptor 2; none of it may leak."""
    psro = str(Path(sys.executable).with_name("psro"))
    for game in ("no_such_game", "kuhn_poker(playerz=3)"):
        result = subprocess.run([psro, "run", "--game", game], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2
        assert result.stdout == ""
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert sorted(p.name for p in workdir.iterdir()) == []
