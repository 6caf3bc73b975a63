"""`psro league`: league training (AlphaStar's main agents, main exploiters and league exploiters).

    psro league run --config configs/league/leduc_dqn.yaml
    psro league run --game kuhn_poker --generations 5 --episodes 2000
    psro league resume RUN_ID

As with `psro run`, every setting is checked before anything starts; one line per generation.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console

from flows.cli_errors import OneLineErrors, fail, with_services

league_app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="League training: main agents, exploiters, PFSP, ratings."
)
console = Console()


@league_app.command("run", cls=OneLineErrors)
def run(
    config_file: Path | None = typer.Option(None, "--config", help="YAML file of settings; flags override it"),
    game: str | None = typer.Option(None, help="two-sided game: OpenSpiel game string or pettingzoo:<module>"),
    algorithm: str | None = typer.Option(None, help="the learners' RL algorithm (see `psro oracles`)"),
    generations: int | None = typer.Option(None, help="generations"),
    episodes: int | None = typer.Option(None, help="training episodes per learning player and role per generation"),
    seed: int | None = typer.Option(None, help="random seed"),
    num_cpus: int | None = typer.Option(None, help="CPUs for the local Ray instance"),
    tracking_uri: str | None = typer.Option(None, help="MLflow tracking URI (default sqlite:///mlflow.db)"),
    experiment: str | None = typer.Option(None, help="MLflow experiment name"),
    export: Path | None = typer.Option(
        None, help="write the newest main agent as an OpenSpiel-checkable export here"
    ),
) -> None:
    """Train a league, generation by generation: each a Prefect flow run whose tasks run on Ray."""
    from marl_core.league.config import build_league_config
    from marl_core.psro.config import ConfigError, load_config_file

    flags = dict(
        game=game,
        algorithm=algorithm,
        generations=generations,
        episodes=episodes,
        seed=seed,
        num_cpus=num_cpus,
        tracking_uri=tracking_uri,
        experiment=experiment,
        export=export,
    )
    try:
        values = load_config_file(config_file) if config_file else {}
        values.update({key: value for key, value in flags.items() if value is not None})
        config = build_league_config(values)
        from flows.preflight import preflight

        preflight(config)
    except ConfigError as error:
        fail(str(error))
    _train(config)


@league_app.command("resume", cls=OneLineErrors)
def resume(
    run_id: str = typer.Argument(..., help="MLflow run id of the league run to continue"),
    tracking_uri: str = typer.Option("sqlite:///mlflow.db", help="MLflow tracking URI the run is in"),
    generations: int | None = typer.Option(None, help="run to this many generations (default: the run's own)"),
) -> None:
    """Continue a league run after its last committed generation (e.g. after a crash)."""
    from flows.tracking.league_tracker import committed_league
    from flows.tracking.resume import ResumeError
    from marl_core.league.config import build_league_config
    from marl_core.psro.config import ConfigError

    try:
        checkpoint = committed_league(tracking_uri, run_id)
        values = {**checkpoint.config, "tracking_uri": tracking_uri, "export": None}
        if generations is not None:
            values["generations"] = generations
        config = build_league_config(values)
    except (ResumeError, ConfigError) as error:
        fail(str(error))
    console.print(f"resuming run {run_id} after generation {checkpoint.generation}", highlight=False)
    _train(config, run_id)


def _train(config, resume_run_id: str | None = None) -> None:
    with_services(config, config.game, console, lambda services: _train_with(config, services, resume_run_id))


def _train_with(config, services, resume_run_id: str | None) -> None:
    from flows.league_flow import run_league  # slow imports (Prefect, Ray) while the server boots
    from flows.progress import progress_bars, view_for

    s = config.league
    console.print(
        f"league on [bold]{config.game}[/]: {s.main_agents} main agent(s), {s.main_exploiters} main exploiter(s), "
        f"{s.league_exploiters} league exploiter(s); {config.algorithm}, {config.generations} generations of "
        f"{config.episodes} episodes per player and role; MLflow at {config.tracking_uri}",
        highlight=False,
        soft_wrap=True,
    )
    started = time.perf_counter()
    last = {}

    def on_generation(record, state) -> None:
        last["record"] = record
        console.print(
            f"gen {record.generation:3d}  snapshots {len(state.league.snapshots):3d}  {record.summary()}  {record.seconds:6.1f}s",
            highlight=False,
            soft_wrap=True,
        )

    progress = progress_bars(console)  # one row per learner at work, above which the lines print
    with progress:
        state = run_league(config, on_generation, resume_run_id, services, progress=view_for(console, progress))
    if "record" not in last:
        console.print(f"nothing to do: the run already completed {config.generations} generations", highlight=False)
        return
    console.print(
        f"done: {state.generation} generations, {len(state.league.snapshots)} snapshots in {time.perf_counter() - started:.1f}s",
        highlight=False,
    )
    if config.export:
        console.print(
            f"exported the newest main agent to {config.export}; check it with: python scripts/verify_export.py {config.export}",
            highlight=False,
            soft_wrap=True,
        )
