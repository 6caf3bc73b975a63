"""What a scenario is: the one declaration PSRO, MARL training, leagues and PBT each make once.

A scenario says what is particular to it: its config and the flags that set it, its initial
state and how a committed checkpoint loads back, the actors its run keeps (`open`), one step (an
iteration, round or generation: `step`, run inside a Prefect subflow over the one rollout
engine), what happens between two steps, what a step commits, and how a finished run is
exported. Everything else is the runtime's (`flows.runtime.run`), the same for every scenario:
services, preflight, progress, the MLflow run and its commits, resume and retry-as-resume,
Ctrl-C and SIGTERM, the `psro` command's shape (`flows.cli.app`) and deployments
(`flows.deployments.serve`).

This module imports neither Prefect nor Ray nor torch: the command line reads the declarations
(names, flags, config checks) before anything slow is imported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The settings every scenario has, wherever its config keeps them (PBT: in `marl`).
    `environment`: what Ray's workers warm up on while the run starts."""

    tracking_uri: str
    experiment: str
    ray_address: str | None
    num_cpus: int | None
    environment: str
    export: Path | None = None


@dataclasses.dataclass(frozen=True)
class Flag:
    """A command-line flag of one scenario's `run`: `--name` sets the config's `key` (default the
    name with dashes as underscores). `help` may be a function, so that a list of choices is
    read from a registry when the help is shown, never written out by hand."""

    name: str
    type: type
    help: str | Callable[[], str]
    key: str | None = None

    @property
    def setting(self) -> str:
        return self.key or self.name.replace("-", "_")

    def help_text(self) -> str:
        return self.help() if callable(self.help) else self.help


SEED = Flag("seed", int, "random seed")


def one_of(names) -> str:
    """The choices of a flag, as every help that lists them words them: from the registry that
    decides them (`tests/test_help.py` compares each help with its registry)."""
    return "one of: " + ", ".join(sorted(names))


def environment_help(what: str) -> Callable[[], str]:
    """The help of a flag that names an environment: its sources from their registry."""

    def help_text() -> str:
        from marl_core.envs import accepted_forms

        return f"{what}: {accepted_forms()} (see `psro environments`)"

    return help_text


@dataclasses.dataclass
class Step:
    """What one step returns: its record (what was measured, for the tracker and the command's
    line) and the state the next step starts from."""

    record: Any
    state: Any


class Scenario:
    """One scenario's declaration; subclasses set the class attributes and the methods below
    that raise NotImplementedError, and may override the others."""

    name: ClassVar[str]  # the flow's name in Prefect, the command (`psro NAME run`), the registry key
    summary: ClassVar[str]  # one line, for `psro --help` and the deployment
    step_noun: ClassVar[str]  # "iteration", "round", "generation": the subflows are "{name}-{step_noun}"
    steps_setting: ClassVar[str]  # the setting that says how many steps to run ("iterations", ...)
    commit_tag: ClassVar[str]  # the MLflow run tag that says which step was committed last
    flags: ClassVar[tuple[Flag, ...]] = ()  # `run`'s flags beyond the common ones
    exports: ClassVar[bool] = False  # whether `--export DIR` means something
    settings_section: ClassVar[str | None] = None  # the config section that holds the common settings
    config_file_required: ClassVar[bool] = False
    # Settings that say how or how long to run, not what is computed: `--resume` finds an
    # unfinished run whose other settings are equal.
    operational: ClassVar[frozenset[str]] = frozenset({"ray_address", "num_cpus", "export", "tracking_uri"})

    # --- the config ---------------------------------------------------------------------------

    def build_config(self, values: dict) -> Any:
        """The typed config of `values`, every check made; a ConfigError in one line if bad."""
        raise NotImplementedError

    def settings(self, config) -> RunSettings:
        section = getattr(config, self.settings_section) if self.settings_section else config
        return RunSettings(
            section.tracking_uri,
            section.experiment,
            section.ray_address,
            section.num_cpus,
            self.environment(config),
            getattr(section, "export", None),
        )

    def environment(self, config) -> str:
        """The game or environment the run plays (its `game`, unless the scenario says otherwise)."""
        return config.game

    def with_common(self, values: dict, common: dict) -> dict:
        """`values` with the common settings `common` (tracking_uri, ...) put where this
        scenario's config keeps them."""
        if not common:
            return values
        if self.settings_section is None:
            return {**values, **common}
        section = values.get(self.settings_section)
        if not isinstance(section, dict):
            return values  # no section to put them in: `build_config` says so
        return {**values, self.settings_section: {**section, **common}}

    def describe(self, config) -> str:
        """The command's first line: what will run, where it is tracked."""
        raise NotImplementedError

    # --- the run ------------------------------------------------------------------------------

    def initial_state(self, config) -> Any:
        raise NotImplementedError

    def load(self, config, client, run_id: str, committed: int) -> Any:
        """The state step `committed` of MLflow run `run_id` committed (nothing unpickled)."""
        raise NotImplementedError

    def steps(self, config, committed: int | None) -> range:
        """The steps still to run, in order, after step `committed` (None: a new run)."""
        raise NotImplementedError

    def open(self, config, state, steps: range, stack) -> Any:
        """Start what the run keeps for the `steps` it runs (rollout workers, learner actors),
        each stopped by `stack`; returns the session the steps are given. Its `progress()`, if
        any, lists the work in progress."""
        raise NotImplementedError

    def step(self, config, session, state, index: int) -> Step:
        """Step `index` from `state`: the body of one subflow, whose tasks run on Ray."""
        raise NotImplementedError

    def should_stop(self, config, session, record) -> bool:
        """Whether the run ends after this step, before its last one."""
        return False

    def between(self, config, session, step: Step) -> Step:
        """Driver-side work after a step and before the next one starts (PBT's exploit and
        explore, Pipeline PSRO's new levels); returns the step as it is tracked and handed on."""
        return step

    def checkpoint(self, config, session, index: int, step: Step) -> Any:
        """What the tracker commits for this step (taken before the next step starts), or None
        when no commit is due."""
        return step.state

    def tracker(self, config, resume: Any | None, tags: dict[str, str]):
        """The scenario's `flows.tracking.scenario_tracker.ScenarioTracker`."""
        raise NotImplementedError

    def export(self, config, state, record, seconds: float) -> None:
        """Write the export of a finished run; `record` is None when a resumed run had nothing
        left to do."""

    # --- the command's lines ------------------------------------------------------------------

    def line(self, record, state) -> str:
        raise NotImplementedError

    def done(self, config, state, record, seconds: float) -> str:
        raise NotImplementedError
