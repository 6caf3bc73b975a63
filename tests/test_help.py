"""Every `--help` that lists choices lists exactly what the registry that decides them holds.

A help written by hand drifts: `psro marl run --help` once named two environment sources of
four. Each such help is made from its registry (`flows.runtime.scenario.one_of`), and these
tests compare every one with its registry, find any list of choices the table below misses,
and add an entry to every registry to see each help name it.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli.app import app

ROOT = Path(__file__).resolve().parents[1]

# (the command, the option or argument, the registry ("module:NAME") whose names it lists)
HELP_CHOICES = [
    (["run"], "--game", "marl_core.envs:ENVIRONMENT_SOURCES"),
    (["run"], "--oracle", "marl_core.psro.oracles:ORACLES"),
    (["run"], "--meta-solver", "marl_core.empirical_game.meta_solvers:META_SOLVERS"),
    (["run"], "--eval", "marl_core.empirical_game.evaluation:EVALUATORS"),
    (["marl", "run"], "--env", "marl_core.envs:ENVIRONMENT_SOURCES"),
    (["marl", "run"], "--algorithm", "marl_core.marl:MARL_ALGORITHMS"),
    (["league", "run"], "--game", "marl_core.envs:ENVIRONMENT_SOURCES"),
    (["league", "run"], "--algorithm", "marl_core.rl:ALGORITHMS"),
    (["evaluate"], "--eval", "marl_core.empirical_game.evaluation:EVALUATORS"),
    (["stack", "start"], "services...", "flows.services.stack:SERVICES"),
    (["stack", "stop"], "services...", "flows.services.stack:SERVICES"),
]
# the listings: a command that prints a registry's entries as a table
LISTINGS = [
    (["environments"], "marl_core.envs:ENVIRONMENT_SOURCES"),
    (["oracles"], "marl_core.psro.oracles:ORACLES"),
    (["solvers"], "marl_core.empirical_game.meta_solvers:META_SOLVERS"),
    (["marl", "algorithms"], "marl_core.marl:MARL_ALGORITHMS"),
]
CHOICES = re.compile(r"one of: ([\w-]+(?:, [\w-]+)*)")


def _registry(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _help(command: list[str]) -> str:
    """The command's help on one line: no box drawing, no wrapping."""
    shown = CliRunner().invoke(app, [*command, "--help"], terminal_width=1000)
    assert shown.exit_code == 0, shown.output
    return " ".join(shown.output.replace("│", " ").split())


def _listed(help_text: str, option: str) -> list[str]:
    """The choices the help of `option` lists."""
    after = help_text.split(f" {option} ", 1)[1]
    return CHOICES.search(after).group(1).split(", ")


@pytest.mark.parametrize(
    "command, option, registry", HELP_CHOICES, ids=[f"{' '.join(c)} {o}" for c, o, _ in HELP_CHOICES]
)
def test_each_help_lists_its_registry(command, option, registry):
    assert _listed(_help(command), option) == sorted(_registry(registry))


@pytest.mark.parametrize("command, registry", LISTINGS, ids=[" ".join(c) for c, _ in LISTINGS])
def test_each_listing_shows_its_registry(command, registry):
    shown = CliRunner().invoke(app, command, terminal_width=400)
    assert shown.exit_code == 0, shown.output
    names = [line.split("│")[1].strip() for line in shown.output.splitlines() if line.startswith("│")]
    assert [name for name in names if name] == sorted(_registry(registry))


def _commands(group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command of the `psro` app, by the words that call it."""
    import typer

    found = []
    command = typer.main.get_command(group) if not path else group
    for name, child in getattr(command, "commands", {}).items():
        if getattr(child, "commands", None) is not None:
            found.extend(_commands(child, (*path, name)))
        else:
            found.append((*path, name))
    return found


def test_no_help_lists_choices_the_table_does_not_compare():
    covered = {tuple(command) for command, _, _ in HELP_CHOICES}
    listing = [command for command in _commands(app) if CHOICES.search(_help(list(command)))]
    assert listing and set(listing) <= covered, set(listing) - covered
    for command in covered:  # and every list in such a help is in the table
        options = {option for c, option, _ in HELP_CHOICES if tuple(c) == command}
        assert len(CHOICES.findall(_help(list(command)))) == len(options), command


ADDED = """
import importlib, sys
from marl_core.registry import _Entry

for path in sys.argv[1:]:
    module, _, name = path.partition(":")
    registry = getattr(importlib.import_module(module), name)
    if isinstance(registry, tuple):  # the stack's services
        setattr(sys.modules[module], name, (*registry, "zz-added"))
    else:
        registry._entries["zz-added"] = _Entry("nowhere:nothing", "an entry added by the test", None)

from typer.testing import CliRunner
from flows.cli.app import app

for command in {commands!r}:
    print(" ".join(CliRunner().invoke(app, [*command, "--help"], terminal_width=1000).output.replace("│", " ").split()))
"""


def test_an_entry_added_to_a_registry_shows_in_every_help_that_lists_it():
    """In a fresh interpreter, where the registries gain an entry before the command is made:
    a help written by hand (or made once, before the entry) would not name it."""
    commands = [command for command, _, _ in HELP_CHOICES]
    registries = sorted({registry for _, _, registry in HELP_CHOICES})
    result = subprocess.run(
        [sys.executable, "-c", ADDED.format(commands=commands), *registries],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    shown = result.stdout.splitlines()
    for (command, option, _), help_text in zip(HELP_CHOICES, shown, strict=True):
        assert "zz-added" in _listed(help_text, option), (command, option)
