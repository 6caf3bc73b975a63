"""`psro stack up|status|down|start|stop`: the command line of the team's services
(`flows.services.stack`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from flows.cli.errors import OneLineErrors, fail
from flows.runtime.scenario import one_of
from flows.services.stack import (
    DATABASES,
    DB_USER,
    MLFLOW_PASSWORD,
    MLFLOW_USER,
    POOL,
    PREFECT_AUTH,
    SERVICES,
    Stack,
    StackError,
    default_directory,
    down,
    start,
    status,
    stop,
    up,
)

app = typer.Typer(no_args_is_help=True, help="The team's services on this machine: PostgreSQL, Prefect, MLflow, Ray.")
DIR_HELP = "where the stack keeps its state, data and logs (default ~/.psro/stack; as root /var/lib/psro/stack)"


def _directory(directory: Path | None) -> Path:
    return (directory or default_directory()).expanduser().resolve()


def _say(line: str) -> None:
    typer.echo(line)


@app.command("up", cls=OneLineErrors)
def up_command(
    directory: Path | None = typer.Option(None, "--dir", help=DIR_HELP),
    workers: int = typer.Option(1, help="Ray worker nodes beside the head, one CPU each"),
    auth: bool = typer.Option(
        False,
        help=f"the Prefect and MLflow servers ask for credentials: {PREFECT_AUTH}, {MLFLOW_USER} and "
        f"{MLFLOW_PASSWORD} from the environment",
    ),
) -> None:
    """Start PostgreSQL, a Prefect server, an MLflow server, Ray (a head and worker nodes) and a
    Prefect worker; print every address and what a run needs to use them."""
    try:
        stack = up(_directory(directory), workers, auth)
    except StackError as error:
        fail(str(error))
    lines = [
        f"postgres        127.0.0.1:{stack.ports.postgres} (databases {', '.join(DATABASES)}, user {DB_USER})",
        f"prefect server  {stack.prefect_api_url} (UI http://127.0.0.1:{stack.ports.prefect})",
        f"mlflow          {stack.tracking_uri} (artifacts in {stack.path('artifacts')})",
        f"ray head        {stack.ray_address} ({workers} worker node{'s' if workers > 1 else ''})",
        f"prefect worker  pool {POOL}",
        f"logs            {stack.path('logs')} (the Prefect server's: {stack.path('prefect', 'server.log')})",
        "a run uses the stack with:",
        "  export " + " ".join(f"{key}={value}" for key, value in stack.run_env.items()),
        "  psro run " + " ".join(stack.run_flags) + " ...",
    ]
    if auth:
        lines.insert(-1, f"  (and {PREFECT_AUTH}, {MLFLOW_USER}, {MLFLOW_PASSWORD} as for `up`)")
    for line in lines:
        typer.echo(line)


@app.command("status", cls=OneLineErrors)
def status_command(directory: Path | None = typer.Option(None, "--dir", help=DIR_HELP)) -> None:
    """Each service of the stack, up or down (exit code 1 unless all are up)."""
    stack = Stack.load(_directory(directory))
    if stack is None:
        fail(f"no stack in {_directory(directory)}; `psro stack up` starts one")
    rows = status(stack)
    for name, running in rows:
        typer.echo(f"{name:16}{'up' if running else 'down'}")
    if not all(running for _, running in rows):
        raise typer.Exit(code=1)


@app.command("down", cls=OneLineErrors)
def down_command(directory: Path | None = typer.Option(None, "--dir", help=DIR_HELP)) -> None:
    """Stop every service of the stack; its data stays in the directory. Safe to repeat."""
    if not down(_directory(directory), _say):
        typer.echo("nothing was running")


SERVICE_HELP = f"services by name, as `status` lists them, {one_of(SERVICES)}"


def _each(action: Callable[[Path, list[str]], list[str]], services: list[str], directory, done: str, none: str):
    try:
        names = action(_directory(directory), services)
    except StackError as error:
        fail(str(error))
    for name in names:
        typer.echo(f"{done} {name}")
    if not names:
        typer.echo(none)


@app.command("start", cls=OneLineErrors)
def start_command(
    services: list[str] = typer.Argument(..., help=SERVICE_HELP),
    directory: Path | None = typer.Option(None, "--dir", help=DIR_HELP),
) -> None:
    """Start services of a running stack that are down (after a crash or a `stop`), on their ports."""
    _each(start, services, directory, "started", "all of them were running")


@app.command("stop", cls=OneLineErrors)
def stop_command(
    services: list[str] = typer.Argument(..., help=SERVICE_HELP),
    directory: Path | None = typer.Option(None, "--dir", help=DIR_HELP),
) -> None:
    """Stop services of the stack, leaving the others up (`start` brings them back)."""
    _each(stop, services, directory, "stopped", "none of them was running")
