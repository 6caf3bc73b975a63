"""Bad input on any `psro` command: one `error:` line naming the value, exit code 2."""

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
