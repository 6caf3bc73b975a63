"""`psro`'s command shape for the toy scenario alone (`toy run`, `toy resume`), as a test runs it in
a process of its own: `python tests/toy_command.py toy run ...`. It counts the calls of
`flows.services.preflight.preflight` and prints the count last, so a test can tell that a run checked
its settings once."""

from __future__ import annotations

import atexit
import os

# Prefect's INFO lines stay off the console, as `psro` has them (it sets this before Prefect is
# imported; the toy scenario's module imports Prefect at once)
os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")

import typer  # noqa: E402
from toy_scenario import TOY  # noqa: E402

import flows.services.preflight  # noqa: E402
from flows.cli.app import add_every_scenario  # noqa: E402

calls = []
check = flows.services.preflight.preflight


def counted(settings) -> None:
    calls.append(settings)
    check(settings)


flows.services.preflight.preflight = counted
atexit.register(lambda: print(f"preflight calls: {len(calls)}"))
app = typer.Typer(add_completion=False, no_args_is_help=True)
add_every_scenario(app, {"toy": TOY})

if __name__ == "__main__":
    app()
