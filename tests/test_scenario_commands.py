"""Every scenario's commands have one shape: the same common flags, refused the same way; a run
checks its settings once; and a scenario defined only in the tests gets the same commands.

The registry of scenarios (`flows.scenarios.SCENARIOS`) is what these iterate over, so a new
scenario is covered the day it is registered.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from processes import killed_at_commit
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
GOOD = {"psro": [], "marl": ["--env", SPREAD], "league": [], "pbt": ["--config", "pbt.yaml"]}
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


def test_the_help_lists_what_the_registries_hold():
    from marl_core.marl import MARL_ALGORITHMS
    from marl_core.psro.oracles import ORACLES

    marl = " ".join(CliRunner().invoke(app, ["marl", "run", "--help"], terminal_width=400).output.split())
    assert all(name in marl for name in MARL_ALGORITHMS), marl
    psro = " ".join(CliRunner().invoke(app, ["run", "--help"], terminal_width=400).output.split())
    assert all(name in psro for name in ORACLES), psro


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


# --- a scenario the project does not know: the toy ----------------------------------------------


def _toy(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_"))}
    base.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(TESTS))
    return subprocess.run(
        [sys.executable, str(TESTS / "toy_command.py"), "toy", *args],
        cwd=tmp_path,
        env=env(base) if env else base,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_a_scenario_defined_only_in_a_test_runs_resumes_and_checks_its_settings_once(tmp_path):
    from processes import assert_all_exited, prefect_home
    from toy_scenario import TOY, ToyConfig, expected_total

    from flows.tracking.resume import find_resumable

    prefect_home(tmp_path / "prefect-home")
    refused = _toy(tmp_path, "run", "--num-cpus", "0")
    assert (refused.returncode, refused.stderr.strip()) == (2, "error: num_cpus=0: Input should be greater than 0")

    killed = _toy(
        tmp_path, "run", "--rounds", "4", "--seed", "3", "--num-cpus", "2", env=lambda base: killed_at_commit(base, 2)
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
    store = "sqlite:///" + str(tmp_path / "mlflow.db")
    client = mlflow.MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("toy").experiment_id])
    assert run.data.tags["toy.committed_round"] == "1"
    # the run's Prefect server stops itself once its driver is gone, and the reaper stops its Ray
    assert_all_exited(f"PREFECT_HOME={tmp_path / 'prefect-home'}", timeout=60)
    config = TOY.build_config({"rounds": 4, "seed": 3, "tracking_uri": store})
    assert find_resumable(TOY, config) == run.info.run_id  # what `toy run ... --resume` continues

    resumed = _toy(tmp_path, "resume", run.info.run_id, "--num-cpus", "2")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    lines = resumed.stdout.splitlines()
    assert lines[-1] == "preflight calls: 1", resumed.stdout  # the command's; the flow trusts it
    total = expected_total(ToyConfig(rounds=4, seed=3))
    assert f"done: 4 rounds, total {total:.6f}" in resumed.stdout
    assert "round   2" in resumed.stdout and "round   1 " not in resumed.stdout
    assert client.get_run(run.info.run_id).data.tags["toy.committed_round"] == "3"
