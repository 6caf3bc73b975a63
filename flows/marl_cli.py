"""`psro marl`: train a fixed set of multi-agent learners on one environment (MALib's MARL scenario).

    psro marl run --config configs/marl/simple_spread/mappo.yaml
    psro marl run --env pettingzoo:mpe2.simple_spread_v3 --algorithm ippo --rounds 50
    psro marl resume RUN_ID

As with `psro run`, every setting is checked before anything starts.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console

from flows.cli_errors import OneLineErrors, build_or_fail, fail, with_services

marl_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="MARL training: MAPPO, QMIX, MADDPG, IPPO, ... on one environment."
)
console = Console()


def _config(values: dict):
    from marl_core.marl.training import MARLConfig

    return build_or_fail(MARLConfig, values)


@marl_app.command("run", cls=OneLineErrors)
def run(
    config_file: Path | None = typer.Option(None, "--config", help="YAML file of settings; flags override it"),
    env: str | None = typer.Option(
        None, help="simultaneous environment: pettingzoo:<module with parallel_env()> or atari:<game>"
    ),
    algorithm: str | None = typer.Option(None, help="MARL algorithm: mappo, qmix, vdn, maddpg, ippo, iql, a2c"),
    rounds: int | None = typer.Option(None, help="training rounds"),
    seed: int | None = typer.Option(None, help="random seed"),
    num_cpus: int | None = typer.Option(None, help="CPUs for the local Ray instance"),
    tracking_uri: str | None = typer.Option(None, help="MLflow tracking URI (default sqlite:///mlflow.db)"),
) -> None:
    """Train the learners round by round: each round a Prefect flow run whose tasks run on Ray."""
    import yaml

    values = {}
    if config_file is not None:
        if not config_file.is_file():
            fail(f"--config {config_file}: no such file")
        values = yaml.safe_load(config_file.read_text()) or {}
        if not isinstance(values, dict):
            fail(f"--config {config_file}: expected a mapping of settings, got {type(values).__name__}")
    flags = dict(env=env, algorithm=algorithm, rounds=rounds, seed=seed, num_cpus=num_cpus, tracking_uri=tracking_uri)
    values.update({k: v for k, v in flags.items() if v is not None})
    if "env" not in values:
        fail("no environment: pass --env or set env in --config")
    config = _config(values)
    from marl_core.marl.training import check

    try:
        check(config)
    except ValueError as error:
        fail(str(error))
    except KeyError as error:  # an agent no `policies` prefix matches
        fail(str(error.args[0]))
    _train(config)


@marl_app.command("resume", cls=OneLineErrors)
def resume(
    run_id: str = typer.Argument(..., help="MLflow run id of the MARL run to continue"),
    tracking_uri: str = typer.Option("sqlite:///mlflow.db", help="MLflow tracking URI the run is in"),
) -> None:
    """Continue a run after its last committed round (e.g. after a crash)."""
    from flows.tracking.marl_tracker import load_marl_checkpoint
    from flows.tracking.resume import ResumeError

    try:
        checkpoint = load_marl_checkpoint(tracking_uri, run_id)
    except ResumeError as error:
        fail(str(error))
    config = _config({**checkpoint.config, "tracking_uri": tracking_uri})
    console.print(f"resuming run {run_id} after round {checkpoint.round}", highlight=False)
    _train(config, run_id)


def _train(config, resume_run_id: str | None = None) -> None:
    with_services(config, config.env, console, lambda services: _train_with(config, services, resume_run_id))


def _train_with(config, services, resume_run_id: str | None) -> None:
    from flows.marl_flow import run_marl  # slow imports (Prefect, Ray) while the server boots
    from flows.progress import progress_bars, view_for

    console.print(
        f"MARL on [bold]{config.env}[/]: {config.algorithm}, {config.rounds} rounds of "
        f"{config.steps_per_round} steps x {config.workers * config.envs_per_worker} copies; MLflow at {config.tracking_uri}",
        highlight=False,
        soft_wrap=True,
    )
    started = time.perf_counter()

    def on_round(record) -> None:
        returns = record.eval_returns or record.train_returns
        kind = "eval" if record.eval_returns else "train"
        shown = "  ".join(
            f"{k.removeprefix('policy/')} {v:8.2f}" for k, v in returns.items() if k.startswith("policy/")
        )
        console.print(
            f"round {record.round:4d}  steps {record.env_steps:8d}  {kind} return {shown}  "
            f"{record.steps_per_second:7.0f} steps/s",
            highlight=False,
            soft_wrap=True,
        )

    progress = progress_bars(console)  # the training steps' row, above which the rounds' lines print
    with progress:
        run_marl(config, on_round, resume_run_id, services, progress=view_for(console, progress))
    console.print(f"done: {config.rounds} rounds in {time.perf_counter() - started:.1f}s", highlight=False)


@marl_app.command("algorithms")
def algorithms() -> None:
    """MARL algorithms, by the name --algorithm takes."""
    from rich.table import Table

    from marl_core.marl import MARL_ALGORITHMS

    table = Table("name", "summary")
    for name in sorted(MARL_ALGORITHMS):
        table.add_row(name, MARL_ALGORITHMS.summary(name))
    console.print(table)
