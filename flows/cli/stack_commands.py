"""`psro stack up|join|status|down|start|stop`: the command line of the team's services
(`flows.services.stack`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import typer

from flows.cli.errors import OneLineErrors, fail
from flows.runtime.scenario import one_of
from flows.services.stack import (
    DATABASES,
    DB_USER,
    LOOPBACK,
    MLFLOW_PASSWORD,
    MLFLOW_USER,
    POOL,
    PREFECT_AUTH,
    RAY_AUTH,
    RAY_TOKEN,
    SERVICES,
    Credentials,
    Stack,
    StackError,
    default_directory,
    down,
    hosts,
    join,
    start,
    status,
    stop,
    up,
)

app = typer.Typer(
    no_args_is_help=True,
    help="The team's services: PostgreSQL, Prefect, MLflow and Ray on a head host; Ray and Prefect workers on others.",
)
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
        f"{MLFLOW_PASSWORD} from the environment (with --host, Ray's token in {RAY_TOKEN} too)",
    ),
    host: str = typer.Option(
        LOOPBACK,
        help="the address the servers and the Ray head listen on, for worker hosts and laptops to reach "
        "(beyond loopback only with --auth; PostgreSQL stays on loopback)",
    ),
) -> None:
    """Start PostgreSQL, a Prefect server, an MLflow server, Ray (a head and worker nodes) and a
    Prefect worker; print every address and what a run needs to use them."""
    try:
        stack = up(_directory(directory), workers, auth, host)
    except StackError as error:
        fail(str(error))
    lines = [
        f"postgres        {LOOPBACK}:{stack.ports.postgres} (databases {', '.join(DATABASES)}, user {DB_USER})",
        f"prefect server  {stack.prefect_api_url} (UI {stack.prefect_api_url.removesuffix('/api')})",
        f"mlflow          {stack.tracking_uri} (artifacts in {stack.path('artifacts')})",
        f"ray head        {stack.ray_address} ({workers} worker node{'' if workers == 1 else 's'}; "
        f"Ray Client {stack.ray_client_address})",
        f"prefect worker  pool {POOL}",
        f"logs            {stack.path('logs')} (the Prefect server's: {stack.path('prefect', 'server.log')})",
        *(["worker hosts join with:", f"  psro stack join {host}"] if host != LOOPBACK else []),
        "a run uses the stack with:",
        "  export " + " ".join(f"{key}={value}" for key, value in stack.run_env.items()),
        "  psro run " + " ".join(stack.run_flags) + " ...",
    ]
    if auth:
        secrets = f"{PREFECT_AUTH}, {MLFLOW_USER}, {MLFLOW_PASSWORD}" + (f", {RAY_TOKEN}" if host != LOOPBACK else "")
        lines.insert(-1, f"  (and {secrets} as for `up`)")
    for line in lines:
        typer.echo(line)


@app.command("join", cls=OneLineErrors)
def join_command(
    head: str = typer.Argument(..., help="the head host's address, as its `psro stack up --host` gave it"),
    host: str | None = typer.Option(
        None, help="this host's address as the head reaches it (default: the one it sends from towards the head)"
    ),
    cpus: int | None = typer.Option(None, help="CPUs this host's Ray node offers (default: all of them)"),
    directory: Path | None = typer.Option(None, "--dir", help=DIR_HELP),
) -> None:
    """On a worker host: start a Ray node joined to the head and a Prefect worker on its pool, with
    the head's credentials from the environment; `down` here stops them and nothing else."""
    try:
        stack = join(_directory(directory), head, host, cpus)
    except StackError as error:
        fail(str(error))
    typer.echo(f"ray node        {stack.host} ({stack.cpus} CPUs) joined {stack.ray_address}")
    typer.echo(f"prefect worker  {stack.host} on pool {POOL} of {stack.prefect_api_url}")
    typer.echo(f"logs            {stack.path('logs')}")


@app.command("status", cls=OneLineErrors)
def status_command(directory: Path | None = typer.Option(None, "--dir", help=DIR_HELP)) -> None:
    """Each service of the stack, up or down (exit code 1 unless all are up)."""
    stack = Stack.load(_directory(directory))
    if stack is None:
        fail(f"no stack in {_directory(directory)}; `psro stack up` starts one")
    rows = status(stack)
    for name, running in rows:
        typer.echo(f"{name:16}{'up' if running else 'down'}")
    if stack.host != LOOPBACK and not stack.head and dict(rows).get("ray-head"):
        _print_hosts(stack)
    if not all(running for _, running in rows):
        raise typer.Exit(code=1)


def _print_hosts(stack: Stack) -> None:
    """On a head serving other hosts: each host's Ray nodes and Prefect workers."""
    os.environ.update(RAY_AUTH)  # this command's own process: its GCS client asks with Ray's token
    try:
        listed = hosts(stack, Credentials.from_environment(ray_token=True) if stack.auth else None)
    except StackError as error:
        fail(str(error))
    typer.echo("hosts:")
    for host in listed:
        nodes = ", ".join(f"{cpus:g} CPUs" for cpus in host.ray_cpus) or "none"
        typer.echo(f"  {host.address:15} ray nodes: {nodes}; prefect workers: {len(host.prefect_workers)}")


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
