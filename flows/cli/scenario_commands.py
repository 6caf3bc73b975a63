"""The commands of every scenario, derived from its declaration: `run` and `resume`, the same shape
for all.

    psro run --config configs/leduc_tabular_q.yaml       (PSRO, the project's first scenario)
    psro marl run --config configs/marl/simple_spread/mappo.yaml
    psro league resume RUN_ID --generations 8

`run` takes `--config FILE.yaml`, the scenario's own flags (`Scenario.flags`, whose help lists
what its registries hold), and the common ones: `--tracking-uri`, `--experiment`,
`--ray-address`, `--num-cpus`, `--resume`, and `--export` where the scenario exports. `resume`
takes the run's id and the common flags that say where and how long it runs. Every setting is
checked before anything starts (no server, no Ray, no MLflow run): bad input costs one
`error:` line and exit code 2, and writes nothing.
"""

from __future__ import annotations

import inspect
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from rich.console import Console

from flows.cli.errors import OneLineErrors, fail
from flows.runtime.scenario import Flag, Scenario
from flows.runtime.stopping import CommandStop, stop_on_signals

console = Console()

COMMON_FLAGS = (
    Flag("tracking-uri", str, "MLflow tracking URI (default sqlite:///mlflow.db)"),
    Flag("experiment", str, "MLflow experiment name"),
    Flag("ray-address", str, "join this Ray cluster instead of starting one (or set RAY_ADDRESS)"),
    Flag("num-cpus", int, "CPUs for the local Ray instance"),
)
EXPORT_FLAG = Flag("export", Path, "write an OpenSpiel-checkable export to this directory")
ROOT_SCENARIO = "psro"  # its commands are the program's own (`psro run`); the others' are `psro NAME run`


def add_scenario_commands(app: typer.Typer, scenario: Scenario) -> None:
    """`run` and `resume` of `scenario` on `app`."""
    # `psro run` also runs another scenario's config file, whose flags it passes on
    extra = {"ignore_unknown_options": True, "allow_extra_args": True} if scenario.name == ROOT_SCENARIO else {}
    app.command("run", cls=OneLineErrors, help=_run_help(scenario), context_settings=extra)(run_command(scenario))
    app.command("resume", cls=OneLineErrors, help=_resume_help(scenario))(resume_command(scenario))


def scenario_app(scenario: Scenario) -> typer.Typer:
    """A command group `psro NAME` holding the scenario's `run` and `resume`."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, help=scenario.summary)
    add_scenario_commands(app, scenario)
    return app


def _run_help(scenario: Scenario) -> str:
    return (
        f"{scenario.summary}. One line per {scenario.step_noun}; each {scenario.step_noun} is a Prefect "
        "flow run whose tasks run on Ray."
    )


def _resume_help(scenario: Scenario) -> str:
    return f"Continue a run after its last committed {scenario.step_noun} (e.g. after a crash)."


def _option(flag: Flag, *, envvar: str | None = None) -> inspect.Parameter:
    declaration = f"--{flag.name}/--no-{flag.name}" if flag.type is bool else f"--{flag.name}"
    default = typer.Option(None, declaration, help=flag.help_text(), envvar=envvar, show_default=False)
    name = flag.name.replace("-", "_")
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Optional[flag.type])  # noqa: UP045 (typer reads it)


def _command(function, parameters: list[inspect.Parameter]):
    """`function(context, **flags)` as typer sees a command of these parameters (and its context)."""
    parameters = [inspect.Parameter("context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context), *parameters]
    function.__signature__ = inspect.Signature(parameters)
    function.__annotations__ = {p.name: p.annotation for p in parameters}
    return function


def _common_flags(scenario: Scenario) -> tuple[Flag, ...]:
    return COMMON_FLAGS + ((EXPORT_FLAG,) if scenario.exports else ())


def run_command(scenario: Scenario):
    required = scenario.config_file_required
    config_option = typer.Option(
        ... if required else None, "--config", help="YAML file of settings; flags override it", show_default=False
    )
    parameters = [
        inspect.Parameter(
            "config_file",
            inspect.Parameter.KEYWORD_ONLY,
            default=config_option,
            annotation=Path if required else Optional[Path],  # noqa: UP045
        ),
        *(_option(flag) for flag in scenario.flags),
        *(
            _option(flag, envvar="RAY_ADDRESS" if flag.name == "ray-address" else None)
            for flag in _common_flags(scenario)
        ),
        inspect.Parameter(
            "resume",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=bool,
            default=typer.Option(
                False, "--resume", help="continue the newest unfinished run with these settings, if any"
            ),
        ),
    ]

    def run(context: typer.Context, **given) -> None:
        from marl_core.psro.config import ConfigError, load_config_file

        config_file, resume = given.pop("config_file"), given.pop("resume")
        try:
            values = load_config_file(config_file) if config_file else {}
            chosen = _chosen_scenario(scenario, values.pop("scenario", scenario.name), config_file)
        except ConfigError as error:
            fail(str(error))
        if chosen is not scenario:
            return _delegate(context, chosen, config_file, given, resume)
        _no_extra_flags(scenario, context)
        with stop_on_signals(_stop_of(scenario, context), console) as stop:
            try:
                for flag in scenario.flags:
                    value = given.get(flag.name.replace("-", "_"))
                    if value is not None:
                        values = _set(values, flag.setting, value)
                common = {
                    f.setting: given[f.name.replace("-", "_")] for f in _common_flags(scenario) if _given(f, given)
                }
                common = checked_common(common)
                config = _checked(scenario, scenario.with_common(values, common))
            except ConfigError as error:
                fail(str(error))
            resume_run_id = None
            if resume:
                from flows.tracking.resume import find_resumable, resumed_step

                resume_run_id = find_resumable(scenario, config)
                if resume_run_id:
                    stop.committed = resumed_step(scenario, config, resume_run_id)
                console.print(
                    f"resuming run {resume_run_id}" if resume_run_id else "nothing to resume: starting a new run",
                    highlight=False,
                )
            stop.tracking_uri, stop.run_id = scenario.settings(config).tracking_uri, resume_run_id
            start(scenario, config, resume_run_id)

    return _command(run, parameters)


def resume_command(scenario: Scenario):
    steps = Flag(scenario.steps_setting, int, f"run to this many {scenario.steps_setting} (default: the run's own)")
    parameters = [
        inspect.Parameter(
            "run_id",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=str,
            default=typer.Argument(..., help="MLflow run id of the run to continue"),
        ),
        inspect.Parameter(
            "tracking_uri",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=str,
            default=typer.Option("sqlite:///mlflow.db", help="MLflow tracking URI the run is in"),
        ),
        _option(steps),
        *(_option(f, envvar="RAY_ADDRESS" if f.name == "ray-address" else None) for f in _common_flags(scenario)[2:]),
    ]

    def resume(context: typer.Context, **given) -> None:
        from flows.runtime.run import resume_values
        from flows.tracking.resume import ResumeError
        from marl_core.psro.config import ConfigError

        run_id = given.pop("run_id")
        with stop_on_signals(_stop_of(scenario, context), console) as stop:
            try:
                values, stop.committed = resume_values(scenario, given["tracking_uri"], run_id)
                if given.get(scenario.steps_setting) is not None:
                    values = _set(values, _steps_key(scenario), given[scenario.steps_setting])
                # the run's own settings, but for where it is now and what the flags change
                common = {"tracking_uri": given["tracking_uri"]}
                common.update({k: given[k] for k in ("ray_address", "num_cpus", "export") if given.get(k) is not None})
                config = _checked(scenario, scenario.with_common(values, checked_common(common)))
            except (ResumeError, ConfigError) as error:
                fail(str(error))
            stop.tracking_uri, stop.run_id = given["tracking_uri"], run_id
            console.print(f"resuming run {run_id}", highlight=False)
            start(scenario, config, run_id)

    return _command(resume, parameters)


def _given(flag: Flag, given: dict) -> bool:
    return given.get(flag.name.replace("-", "_")) is not None


def _chosen_scenario(scenario: Scenario, named, config_file: Path | None) -> Scenario:
    """The scenario a config file's `scenario:` names. `psro run` runs any scenario's file;
    `psro NAME run` runs only its own."""
    from flows.scenarios import SCENARIOS
    from marl_core.psro.config import ConfigError
    from marl_core.registry import UnknownName

    if named == scenario.name:
        return scenario
    try:
        chosen = SCENARIOS[named]
    except UnknownName as error:
        raise ConfigError(f"{config_file}: scenario={named!r}: {error}") from None
    if scenario.name != ROOT_SCENARIO:
        raise ConfigError(
            f"{config_file} is a {named} config (scenario: {named}); run it with psro {named} run or psro run"
        )
    return chosen


def _delegate(context: typer.Context, chosen: Scenario, config_file: Path, given: dict, resume: bool) -> None:
    """`psro run --config FILE` on a file that says `scenario: NAME`: exactly what
    `psro NAME run --config FILE` with the same flags does (its own flags are checked there)."""
    args = ["run", "--config", str(config_file)]
    for name, value in given.items():  # the flags `psro run` knew
        if value is not None:
            flag = name.replace("_", "-")
            args += [f"--{flag}" if value else f"--no-{flag}"] if isinstance(value, bool) else [f"--{flag}", str(value)]
    args += context.args  # the ones it did not: the chosen scenario's
    if resume:
        args.append("--resume")
    typer.main.get_command(scenario_app(chosen)).main(args=args, prog_name=context.find_root().info_name)


def _no_extra_flags(scenario: Scenario, context: typer.Context) -> None:
    """`psro run` takes flags it does not know (another scenario's file may need them): for its
    own runs they are refused here, as any command refuses an unknown flag."""
    import difflib

    if context.args:
        known = [f"--{f.name}" for f in (*scenario.flags, *_common_flags(scenario))]
        close = difflib.get_close_matches(context.args[0], known, n=3)
        fail(f"No such option: {context.args[0]}" + (f" (Possible options: {', '.join(close)})" if close else ""))


def _stop_of(scenario: Scenario, context: typer.Context) -> CommandStop:
    """What this command says if a signal stops it: `psro [NAME] resume` continues its run (the
    run's own scenario's, whichever command started it), the command as typed starts it again."""
    typed = [context.find_root().info_name, *sys.argv[1:]]
    resume = f"{context.find_root().info_name} {'' if scenario.name == ROOT_SCENARIO else scenario.name + ' '}resume"
    return CommandStop(scenario.step_noun, resume, shlex.join(typed))


class CommonFlags(BaseModel):
    """The common flags, checked alike for every scenario before its own config is built, so
    that a bad one gets the same line whichever scenario it was given to."""

    model_config = ConfigDict(extra="forbid")
    tracking_uri: str | None = Field(None, min_length=1)
    experiment: str | None = Field(None, min_length=1)
    ray_address: str | None = Field(None, min_length=1)
    num_cpus: PositiveInt | None = None
    export: Path | None = None


def checked_common(values: dict) -> dict:
    from marl_core.psro.config import build_config

    build_config(values, CommonFlags)
    return values


def _steps_key(scenario: Scenario) -> str:
    section = scenario.settings_section
    return f"{section}.{scenario.steps_setting}" if section else scenario.steps_setting


def _set(values: dict, key: str, value) -> dict:
    """`values` with the setting `key` (dotted: a section's) set to `value`."""
    head, _, rest = key.partition(".")
    if not rest:
        return {**values, head: value}
    section = values.get(head)
    return {**values, head: _set(section if isinstance(section, dict) else {}, rest, value)}


def _checked(scenario: Scenario, values: dict):
    """The scenario's config of `values`, and what it points at checked (Ray, the MLflow store,
    the export directory): the one place a command checks settings, before anything starts."""
    from flows.services.preflight import preflight

    config = scenario.build_config(values)
    preflight(scenario.settings(config))
    return config


def with_services(settings, console: Console, body) -> None:
    """What every scenario's run command does once its settings are checked: check the progress
    lines' setting, start the Prefect server and Ray (before the slow imports, so they overlap),
    print where the Prefect UI is, and call `body(services)`."""
    import os

    from flows.runtime.progress import plain_interval

    try:
        plain_interval()  # the progress lines' setting, checked before anything starts
    except ValueError as error:
        fail(str(error))
    from flows.services.run_services import services_starting  # standard library only

    # Prefect's console shows warnings only: its INFO lines would bury the progress lines; its
    # API handler keeps every level, so the UI still has all logs.
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    starting = services_starting(settings.ray_address, settings.num_cpus, settings.environment)
    with starting as services:
        console.print(services.ui_line, highlight=False, soft_wrap=True)
        from flows.services.patches import driver_keeps_sigterm

        driver_keeps_sigterm()  # Prefect's own SIGTERM handler would not end a wait on Ray
        body(services)


def start(scenario: Scenario, config, resume_run_id: str | None) -> None:
    """Run `config`: the services start before the slow imports, one line per step."""
    with_services(scenario.settings(config), console, lambda services: _run(scenario, config, resume_run_id, services))


def _run(scenario: Scenario, config, resume_run_id: str | None, services) -> None:
    from flows.deployments.entrypoints import run_scenario  # slow imports (Prefect, Ray) while the server boots
    from flows.runtime.progress import progress_bars, view_for

    console.print(scenario.describe(config), highlight=False, soft_wrap=True)
    started = time.perf_counter()
    last = {}
    progress = progress_bars(console)  # one row per piece of work in progress, above which the lines print
    with progress:

        def observer(record, state) -> None:
            last["record"] = record
            progress.console.print(scenario.line(record, state), highlight=False, soft_wrap=True)

        state = run_scenario(scenario, config, resume_run_id, observer, services, view_for(console, progress))
    seconds = time.perf_counter() - started
    if "record" not in last:
        total = getattr(
            scenario.settings_section and getattr(config, scenario.settings_section) or config, scenario.steps_setting
        )
        console.print(f"nothing to do: the run already completed {total} {scenario.steps_setting}", highlight=False)
        return
    console.print(scenario.done(config, state, last["record"], seconds), highlight=False, soft_wrap=True)
