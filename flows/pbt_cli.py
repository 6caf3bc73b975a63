"""`psro pbt`: population-based training of MARL learners (Ray Tune's PBT, one learner per member).

    psro pbt run --config configs/pbt/simple_spread_mappo.yaml
    psro pbt run --config configs/pbt/simple_spread_mappo.yaml --no-exploit   # the baseline
    psro pbt resume RUN_ID

As with `psro run`, every setting is checked before anything starts; one line per round.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console

from flows.cli_errors import OneLineErrors, build_or_fail, fail, with_services

pbt_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Population-based training: exploit and explore over a population of learners.",
)
console = Console()


def _config(values: dict):
    from marl_core.pbt.marl import PBTConfig

    return build_or_fail(PBTConfig, values)


@pbt_app.command("run", cls=OneLineErrors)
def run(
    config_file: Path = typer.Option(
        ..., "--config", help="YAML file of settings (marl, population, members, pbt); flags override it"
    ),
    rounds: int | None = typer.Option(None, help="training rounds of every member"),
    population: int | None = typer.Option(None, help="members"),
    seed: int | None = typer.Option(None, help="random seed (member i's is seed + i)"),
    exploit: bool = typer.Option(
        True, "--exploit/--no-exploit", help="--no-exploit: train the population untouched, the baseline"
    ),
    num_cpus: int | None = typer.Option(None, help="CPUs for the local Ray instance"),
    tracking_uri: str | None = typer.Option(None, help="MLflow tracking URI (default sqlite:///mlflow.db)"),
    experiment: str | None = typer.Option(None, help="MLflow experiment name (default pbt)"),
) -> None:
    """Train a population round by round, each round a Prefect flow run whose tasks run on Ray;
    at every perturbation point the bottom members copy a top one and explore."""
    from marl_core.psro.config import ConfigError, load_config_file

    try:
        values = load_config_file(config_file)
    except ConfigError as error:
        fail(str(error))
    if not isinstance(values.get("marl"), dict):
        fail(f"--config {config_file}: no marl section (the learners' settings: env, algorithm, rounds, ...)")
    marl = {
        key: value
        for key, value in dict(
            rounds=rounds, seed=seed, num_cpus=num_cpus, tracking_uri=tracking_uri, experiment=experiment
        ).items()
        if value is not None
    }
    values = {**values, "marl": {**values["marl"], **marl}, "exploit": exploit}
    if population is not None:
        values["population"] = population
    config = _config(values)
    from marl_core.marl.training import check

    try:
        check(config.marl)
    except ValueError as error:
        fail(str(error))
    except KeyError as error:  # an agent no `policies` prefix matches
        fail(str(error.args[0]))
    _train(config)


@pbt_app.command("resume", cls=OneLineErrors)
def resume(
    run_id: str = typer.Argument(..., help="MLflow run id of the PBT run to continue"),
    tracking_uri: str = typer.Option("sqlite:///mlflow.db", help="MLflow tracking URI the run is in"),
) -> None:
    """Continue a PBT run after its last committed round (e.g. after a crash)."""
    from flows.tracking.pbt_tracker import load_pbt_checkpoint
    from flows.tracking.resume import ResumeError

    try:
        checkpoint = load_pbt_checkpoint(tracking_uri, run_id)
    except ResumeError as error:
        fail(str(error))
    config = _config({**checkpoint.config, "marl": {**checkpoint.config["marl"], "tracking_uri": tracking_uri}})
    console.print(f"resuming run {run_id} after round {checkpoint.state.round - 1}", highlight=False)
    _train(config, run_id)


def _train(config, resume_run_id: str | None = None) -> None:
    with_services(config.marl, config.marl.env, console, lambda services: _train_with(config, services, resume_run_id))


def _train_with(config, services, resume_run_id: str | None) -> None:
    from flows.pbt_flow import run_pbt  # slow imports (Prefect, Ray) while the server boots
    from flows.progress import progress_bars, view_for

    marl = config.marl
    console.print(
        f"PBT on [bold]{marl.env}[/]: {config.population} {marl.algorithm} members, {marl.rounds} rounds, "
        f"exploit/explore every {config.pbt.perturbation_interval} rounds over {sorted(config.pbt.hyperparam_mutations)}"
        f"{'' if config.exploit else ' (off: --no-exploit)'}; MLflow at {marl.tracking_uri}",
        highlight=False,
        soft_wrap=True,
    )
    started = time.perf_counter()

    def on_round(record) -> None:
        console.print(f"round {record.round:4d}  {record.summary()}", highlight=False, soft_wrap=True)
        for entry in record.lineage:
            changed = "  ".join(
                f"{k} {entry.before[k]:.3g} -> {v:.3g}" if isinstance(v, float) else f"{k} {entry.before[k]} -> {v}"
                for k, v in entry.after.items()
            )
            console.print(
                f"    member {entry.member} ({entry.member_score:.2f}) copies member {entry.source} ({entry.source_score:.2f}): {changed}",
                highlight=False,
                soft_wrap=True,
            )

    progress = progress_bars(console)  # a row per member at work, above which the rounds' lines print
    with progress:
        state = run_pbt(config, on_round, resume_run_id, services, progress=view_for(console, progress))
    console.print(
        f"done: {state.round} rounds, {len(state.lineage)} copies in {time.perf_counter() - started:.1f}s",
        highlight=False,
    )
