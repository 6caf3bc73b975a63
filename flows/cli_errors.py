"""Bad input on any `psro` command (`flows.cli`, `flows.scenario_cli`): one `error:` line naming
the value, exit code 2; and the start-up every scenario's run command shares."""

from __future__ import annotations

import typer
from rich.console import Console

err = Console(stderr=True)


def fail(message: str) -> None:
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


class OneLineErrors(typer.core.TyperCommand):
    """A flag of the wrong type or an unknown flag is bad input like any other: one `error:`
    line naming the value, exit code 2 (typer would print a usage box)."""

    def make_context(self, info_name, args, parent=None, **extra):
        from typer._click.exceptions import BadParameter, UsageError  # the click typer bundles

        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except BadParameter as error:
            cause = error.__cause__
            if hasattr(cause, "errors") and error.param is not None:  # pydantic's ValidationError
                first = cause.errors()[0]
                fail(f"{error.param.name}={first['input']!r}: {first['msg']}")
            fail(error.format_message())
        except UsageError as error:
            fail(error.format_message())


def with_services(settings, console: Console, body) -> None:
    """What every scenario's run command does once its settings are checked: check the progress
    lines' setting, start the Prefect server and Ray (before the slow imports, so they overlap),
    print where the Prefect UI is, and call `body(services)`; SIGTERM stops it as Ctrl-C does."""
    import os

    from flows.progress import plain_interval

    try:
        plain_interval()  # the progress lines' setting, checked before anything starts
    except ValueError as error:
        fail(str(error))
    from flows.services import services_starting, stop_on_sigterm  # standard library only

    # Prefect's console shows warnings only: its INFO lines would bury the progress lines; its
    # API handler keeps every level, so the UI still has all logs.
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    starting = services_starting(settings.ray_address, settings.num_cpus, settings.environment)
    with stop_on_sigterm(), starting as services:
        console.print(services.ui_line, highlight=False, soft_wrap=True)
        from flows.patches import driver_keeps_sigterm

        driver_keeps_sigterm()  # Prefect's own SIGTERM handler would not end a wait on Ray
        body(services)
