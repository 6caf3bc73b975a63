"""The `psro` command: every scenario's `run` and `resume` (`flows.cli.scenario_commands`), the listings
(games, meta-solvers, oracles, algorithms), evaluation, ratings, export, and the servers.

Every setting is checked before anything starts (no server, no Ray, no MLflow run), so a typo
costs one line and exit code 2 rather than a half-made run.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from flows.cli import stack_commands
from flows.cli.errors import OneLineErrors, fail
from flows.cli.scenario_commands import ROOT_SCENARIO, add_scenario_commands, scenario_app
from flows.runtime.scenario import one_of
from flows.scenarios import SCENARIOS
from marl_core.empirical_game.evaluation import EVALUATORS

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Population-based MARL: PSRO on Prefect, Ray and MLflow."
)
console = Console()


@app.command()
def games() -> None:
    """OpenSpiel games PSRO accepts (parameters go in parentheses: kuhn_poker(players=3))."""
    from marl_core.games.openspiel import supported_games

    table = Table("game", "players", "dynamics", "utility")
    for game_type in supported_games():
        players = f"{game_type.min_num_players}-{game_type.max_num_players}"
        table.add_row(game_type.short_name, players, game_type.dynamics.name.lower(), game_type.utility.name.lower())
    console.print(table)


def _print_registry(registry) -> None:
    """A registry's entries as a table: the name a flag takes, and what the entry is."""
    table = Table("name", "summary")
    for name in sorted(registry):
        table.add_row(name, registry.summary(name))
    console.print(table)


@app.command()
def environments() -> None:
    """Where environments come from, by the SOURCE of a SOURCE:NAME name (--game, --env); a name
    without one is an OpenSpiel game string (`psro games`)."""
    from marl_core.envs import ENVIRONMENT_SOURCES

    _print_registry(ENVIRONMENT_SOURCES)


@app.command()
def solvers() -> None:
    """Meta-solvers, by the name --meta-solver takes."""
    from marl_core.empirical_game.meta_solvers import META_SOLVERS

    _print_registry(META_SOLVERS)


@app.command()
def oracles() -> None:
    """Best-response oracles, by the name --oracle takes."""
    from marl_core.psro.oracles import ORACLES

    _print_registry(ORACLES)


@app.command()
def evaluate(
    members: list[str] = typer.Option(
        ..., "--member", help="registry member NAME@ALIAS or NAME/VERSION; repeat, several per player make a population"
    ),
    eval: str = typer.Option("exact", "--eval", help=f"payoff evaluator, {one_of(EVALUATORS)}"),
    episodes: int = typer.Option(1000, help="episodes per profile when --eval sampled"),
    seed: int = typer.Option(0, help="seed for sampled evaluation"),
    tracking_uri: str = typer.Option("sqlite:///mlflow.db", help="MLflow store holding the registry"),
    experiment: str = typer.Option("psro-evaluate", help="MLflow experiment of the evaluation run"),
) -> None:
    """Play registry members against each other; print the payoff table and log it to MLflow."""
    from flows.tracking import registry_members

    if eval not in EVALUATORS:
        fail(f"unknown evaluator {eval!r}; choose one of: {', '.join(sorted(EVALUATORS))}")
    if eval == "sampled" and episodes < 2:
        fail(f"episodes={episodes}: sampled evaluation needs 2 or more (one episode has no standard error)")
    try:
        specs = [registry_members.parse_member(text) for text in members]
        client = registry_members.open_store(tracking_uri)
        loaded = [registry_members.load_member(client, spec) for spec in specs]
        game, groups = registry_members.populations_of(loaded)
        registry_members.check_evaluable(game.name, groups, eval)
    except registry_members.PopulationError as error:
        fail(str(error))
    table = registry_members.evaluate(game, groups, eval, episodes, seed)
    settings = {
        "eval": eval,
        "episodes": episodes if eval == "sampled" else 0,
        "seed": seed,
        "members": " ".join(members),
    }
    run_id = registry_members.log_evaluation(client, experiment, game, groups, table, settings)
    for group in groups:
        listed = ", ".join(
            f"#{k} {m.label}" + ("" if m.label == m.spec.text else f" ({m.spec.text})") for k, m in enumerate(group)
        )
        console.print(f"{group[0].role}: {listed}", highlight=False, soft_wrap=True)
    console.print(_payoff_table(game.name, groups, table, eval))
    console.print(
        f"logged to MLflow run {run_id} (experiment {experiment!r}) at {tracking_uri}", highlight=False, soft_wrap=True
    )


@app.command("ratings", cls=OneLineErrors)
def ratings_command(
    run_id: str | None = typer.Option(
        None, "--run", help="a league run: its players' and snapshots' ratings at its last committed generation"
    ),
    members: list[str] = typer.Option(
        [],
        "--member",
        help="registry member NAME@ALIAS or NAME/VERSION; repeat: "
        "every member of one role plays every member of the other",
    ),
    episodes: int = typer.Option(200, help="greedy games per pairing of members"),
    games_per_match: int = typer.Option(
        1, help="consecutive games of a pairing rated as one match, won on summed returns (poker: 50 or more)"
    ),
    seed: int = typer.Option(0, help="seed of the members' games"),
    elo_k: float = typer.Option(32.0, help="Elo's K: points one game can move a rating"),
    tracking_uri: str = typer.Option("sqlite:///mlflow.db", help="MLflow store holding the run or the registry"),
) -> None:
    """Ratings (Elo, and a skill mu with its uncertainty sigma) of a league run's snapshots, or of
    registry members after they play each other."""
    if (run_id is None) == (not members):
        fail("give either --run RUN_ID (a league run) or --member (two or more registry members), not both or neither")
    if episodes < 1:
        fail(f"episodes={episodes}: needs 1 or more")
    if elo_k <= 0:
        fail(f"elo_k={elo_k}: needs to be above 0")
    if not 1 <= games_per_match <= episodes:
        fail(
            f"games_per_match={games_per_match}: needs 1 to episodes ({episodes}), "
            "so that a pairing plays at least one match"
        )
    if run_id is not None:
        rows, title = _league_ratings(run_id, tracking_uri)
    else:
        rows, title = _member_ratings(members, episodes, games_per_match, seed, elo_k, tracking_uri)
    view = Table(title=title, title_justify="left")
    view.add_column("#", justify="right", no_wrap=True, min_width=2)
    for column in ("player", "skill mu ± sigma", "mu - 3 sigma", "Elo", "games"):
        view.add_column(column, justify="left" if column == "player" else "right", no_wrap=True)
    for rank, row in enumerate(rows, 1):
        view.add_row(
            str(rank),
            row["player"],
            f"{row['mu']:.2f} ± {row['sigma']:.2f}",
            f"{row['ordinal']:.2f}",
            f"{row['elo']:.0f}",
            str(int(row["games"])),
        )
    # Never cut a name short, however narrow the terminal or pipe: it is what a user looks up next.
    needed = max(len(title), max((len(row["player"]) for row in rows), default=6) + 64)
    Console(width=max(console.width, needed)).print(view)


def _league_ratings(run_id: str, tracking_uri: str) -> tuple[list[dict], str]:
    import tempfile

    import pandas as pd

    from flows.scenarios.league import LEAGUE
    from flows.tracking import layout
    from flows.tracking.resume import ResumeError, committed_step, logged_config, open_client

    try:  # a store that does not exist is not made here
        client = open_client(tracking_uri)
        generation = committed_step(client, run_id, LEAGUE)
    except ResumeError as error:
        fail(str(error))
    game = logged_config(client, run_id)["game"]
    with tempfile.TemporaryDirectory() as directory:
        folder = client.download_artifacts(run_id, layout.league_generation_path(generation), directory)
        rows = pd.read_csv(Path(folder) / "ratings.csv").to_dict("records")
    return rows, f"league run {run_id} on {game}: ratings after generation {generation}"


def _member_ratings(
    members: list[str], episodes: int, games_per_match: int, seed: int, elo_k: float, tracking_uri: str
) -> tuple[list[dict], str]:
    from flows.tracking import registry_members
    from marl_core.league.ratings import RatingSettings
    from marl_core.league.tournament import rate, round_robin

    try:
        specs = [registry_members.parse_member(text) for text in members]
        client = registry_members.open_store(tracking_uri)
        loaded = [registry_members.load_member(client, spec) for spec in specs]
        game, groups = registry_members.populations_of(loaded)
        if game.num_roles != 2:
            raise registry_members.PopulationError(
                f"ratings need a two-sided game; {game.name} has roles {', '.join(game.roles)}"
            )
    except registry_members.PopulationError as error:
        fail(str(error))
    players = [[(m.label, m.policy) for m in group] for group in groups]
    games = round_robin(game, players, episodes, seed)
    ratings = rate(games, RatingSettings(elo_k=elo_k, games_per_match=games_per_match))
    matches = f", rated as matches of {games_per_match}" if games_per_match > 1 else ""
    return (
        ratings.table(),
        f"{game.name}: {len(games)} greedy games, {episodes} per pairing of "
        f"{game.roles[0]} and {game.roles[1]} members{matches}",
    )


def _payoff_table(game: str, groups, table, evaluator: str) -> Table:
    """One row per profile; members by their position in each role's population (#k), listed
    above the table, so long registry names do not crowd out the payoffs."""
    players = range(len(groups))
    sampled = evaluator == "sampled"
    view = Table(title=f"{game}: payoffs by {evaluator} evaluation", title_justify="left")
    for group in groups:
        view.add_column(group[0].role, justify="right")
    for p in players:
        view.add_column(f"payoff {p}", justify="right", no_wrap=True)
        if sampled:
            view.add_column(f"stderr {p}", justify="right", no_wrap=True)
    for row in table.to_frame().to_dict("records"):
        cells = [f"#{row[f'member_{p}']}" for p in players]
        for p in players:
            cells.append(f"{row[f'payoff_{p}']:+.6f}")
            if sampled:
                cells.append(f"{row[f'stderr_{p}']:.4f}")
        view.add_row(*cells)
    return view


@app.command("export")
def export_command(
    directory: Path = typer.Argument(..., help="directory to write the export to"),
    run_id: str = typer.Option(..., "--run", help="id of a finished `psro run` MLflow run"),
    tracking_uri: str = typer.Option("sqlite:///mlflow.db", help="MLflow store holding the run"),
) -> None:
    """Write a finished run's final population and meta-strategy in the export format."""
    from flows.services.preflight import check_export_dir  # as for `psro run --export`: never overwrite
    from flows.tracking import registry_members
    from marl_core.psro.config import ConfigError

    try:
        check_export_dir(directory)
        client = registry_members.open_store(tracking_uri)
        result = registry_members.export_run(client, run_id, directory)
    except (registry_members.PopulationError, ConfigError) as error:
        fail(str(error))
    measured = []
    if result["logged"]:
        recomputed = result["recomputed"]
        measured.append(
            f"exploitability logged {result['logged'].exploitability:.9g}"
            + (f", recomputed from the artifacts {recomputed.exploitability:.9g}" if recomputed else "")
        )
    if result["approx"]:
        measured.append(
            f"approximate exploitability logged {result['approx'].exploitability:.6g} "
            f"± {result['approx'].exploitability_stderr:.2g}"
        )
    console.print(
        f"exported run {run_id} ({result['game']}, iteration {result['iterations']}, populations "
        f"{'x'.join(map(str, result['population_sizes']))}) to {directory}\n"
        f"{'; '.join(measured)}; check it with: python scripts/verify_export.py {directory}",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def serve(
    deployments: list[str] | None = typer.Option(
        None, "--deployment", help="serve only this deployment of prefect.yaml; repeatable"
    ),
    prefect_yaml: Path = typer.Option(Path("prefect.yaml"), help="the deployment definitions"),
    limit: int | None = typer.Option(None, help="run at most this many flow runs at once (default: no limit)"),
) -> None:
    """Serve prefect.yaml's deployments from this process: triggered and scheduled runs execute here, no work pool."""
    from flows.deployments import serve as serving

    if limit is not None and limit < 1:
        fail(f"limit={limit}: needs 1 or more")
    try:
        serving.serve(serving.read_deployments(prefect_yaml, deployments), console, limit)
    except serving.DeploymentError as error:
        fail(str(error))


@app.command("server", cls=OneLineErrors)
def server_command(
    port: int = typer.Option(4200, help="port of the Prefect server and its UI, on 127.0.0.1 (0: a free one)"),
    num_cpus: int | None = typer.Option(None, help="CPUs for the Ray instance (default: all of this machine's)"),
) -> None:
    """Keep a Prefect server and a Ray instance up: later runs reuse both (Ctrl-C stops them)."""
    import socket

    from flows.services.prefect_server import find_running_server, prefect_home
    from flows.services.psro_server import serve

    if port != 0 and not 1024 <= port <= 65535:
        fail(f"port={port}: choose a port from 1024 to 65535, or 0 for a free one")
    if num_cpus is not None and num_cpus < 1:
        fail(f"num_cpus={num_cpus}: needs 1 or more")
    running = find_running_server()
    if running:
        fail(
            f"a psro server already runs for {prefect_home()} (pid {running.pid}, Prefect at {running.prefect_api_url})"
        )
    with socket.socket() as probe:
        if port and probe.connect_ex(("127.0.0.1", port)) == 0:
            fail(f"port={port}: something already listens on 127.0.0.1:{port}; choose another with --port")

    def ready(server) -> None:
        console.print(
            f"Prefect UI: {server.prefect_api_url.removesuffix('/api')}   Ray: {server.ray_address}", highlight=False
        )
        console.print("`psro run` in another terminal reuses both; Ctrl-C stops them.", highlight=False)

    serve(port, num_cpus, ready)


def add_every_scenario(app: typer.Typer, scenarios=SCENARIOS) -> dict[str, typer.Typer]:
    """Every scenario's `run` and `resume` on `app`: PSRO's at the top (`psro run`), the
    others' under their names (`psro marl run`); returns the groups by name."""
    groups = {}
    for name in scenarios:
        scenario = scenarios[name]
        if name == ROOT_SCENARIO:
            add_scenario_commands(app, scenario)
        else:
            groups[name] = scenario_app(scenario)
            app.add_typer(groups[name], name=name)
    return groups


groups = add_every_scenario(app)
app.add_typer(stack_commands.app, name="stack")  # psro stack up|status|down: the team's services


@groups["marl"].command("algorithms")
def marl_algorithms() -> None:
    """MARL algorithms, by the name --algorithm takes."""
    from marl_core.marl import MARL_ALGORITHMS

    _print_registry(MARL_ALGORITHMS)


if __name__ == "__main__":
    app()
