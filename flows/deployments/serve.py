"""`psro serve`: prefect.yaml's deployments served from one process, no work pool or worker.

prefect.yaml is the one source of truth: `prefect deploy --all` reads it for the work-pool route,
and this module reads the same entries (name, entrypoint, description, parameters, schedules)
and hands them to `prefect.serve`. Triggered runs (`prefect deployment run 'psro/kuhn-smoke'`)
and scheduled ones then execute here, each in a child process that starts its own Ray session.

A deployment's entrypoint names a scenario's flow, as `flows.deployments.entrypoints` makes them
(`flows.deployments.entrypoints.psro`, `flows.deployments.entrypoints.marl`, ...; a test's own scenario's flow too): its
config is checked by that scenario before anything is served. The flows are imported only once
PREFECT_API_URL is set, because Prefect fixes its settings when it is first imported.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import yaml

SCHEDULE_KINDS = ("cron", "interval", "rrule")
SERVER_WAIT_SECONDS = 60.0


class DeploymentError(ValueError):
    """prefect.yaml or the Prefect server is not usable: one line for the user."""


@dataclasses.dataclass(frozen=True)
class Definition:
    name: str
    entrypoint: str
    description: str
    parameters: dict
    schedules: list[dict]
    tags: list[str]


def read_deployments(path: Path, only: list[str] | None = None) -> list[Definition]:
    """The deployments of prefect.yaml (all, or those named in ``only``), with their configs
    checked now rather than when the schedule fires at night."""
    from marl_core.psro.config import ConfigError

    try:
        document = yaml.safe_load(Path(path).read_text()) or {}
    except OSError:
        raise DeploymentError(
            f"no deployment file at {str(path)!r}; run from the repository root or pass --prefect-yaml"
        ) from None
    except yaml.YAMLError as error:
        raise DeploymentError(f"{str(path)!r} is not valid YAML: {str(error).splitlines()[0]}") from None
    entries = document.get("deployments") if isinstance(document, dict) else None
    if not entries:
        raise DeploymentError(f"{str(path)!r} declares no deployments")
    names = [entry.get("name") for entry in entries]
    for name in only or []:
        if name not in names:
            raise DeploymentError(
                f"no deployment {name!r} in {str(path)!r}; choose from: {', '.join(sorted(map(str, names)))}"
            )
    definitions = []
    for entry in entries:
        if only and entry.get("name") not in only:
            continue
        name = entry.get("name")
        scenario = scenario_of(name, entry.get("entrypoint"))
        parameters = entry.get("parameters") or {}
        try:
            scenario.build_config(parameters.get("config") or {})
        except ConfigError as error:
            raise DeploymentError(f"deployment {name!r}: config: {error}") from None
        schedules = entry.get("schedules") or []
        for schedule in schedules:
            if sum(kind in schedule for kind in SCHEDULE_KINDS) != 1:
                raise DeploymentError(
                    f"deployment {name!r}: a schedule needs exactly one of "
                    f"{', '.join(SCHEDULE_KINDS)}, got {schedule!r}"
                )
        tags = entry.get("tags") or []
        definitions.append(
            Definition(name, entry["entrypoint"], entry.get("description", ""), parameters, schedules, tags)
        )
    return definitions


def scenario_of(name: str, entrypoint) -> object:
    """The scenario whose flow a deployment's entrypoint (a module path, `package.module.flow`)
    names: a registered scenario's is known by name, without importing Prefect; a flow defined
    elsewhere (a test's scenario) is imported to find out."""
    from flows.scenarios import SCENARIOS

    if not isinstance(entrypoint, str) or ":" in entrypoint or "." not in entrypoint:
        raise DeploymentError(
            f"deployment {name!r} has entrypoint {entrypoint!r}; expected a scenario's flow by module path, "
            f"one of: {', '.join(f'flows.deployments.entrypoints.{s}' for s in SCENARIOS)}"
        )
    module, _, attribute = entrypoint.rpartition(".")
    if module == "flows.deployments.entrypoints" and attribute in SCENARIOS:
        return SCENARIOS[attribute]
    flow = _import(name, module, attribute)
    scenario = getattr(flow, "scenario", None)
    if scenario is None:
        raise DeploymentError(
            f"deployment {name!r}: {entrypoint} is not a scenario's flow "
            "(see flows.deployments.entrypoints.scenario_flows)"
        )
    return scenario


def _import(name: str, module: str, attribute: str):
    import importlib

    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        raise DeploymentError(f"deployment {name!r}: cannot import {module}.{attribute}: {error}") from None


def _schedule(entry: dict):
    from prefect.schedules import Cron, Interval, RRule

    options = {key: value for key, value in entry.items() if key not in SCHEDULE_KINDS}
    if "cron" in entry:
        return Cron(entry["cron"], **options)
    if "interval" in entry:
        return Interval(entry["interval"], **options)
    return RRule(entry["rrule"], **options)


def _wait_for_server(api_url: str) -> None:
    from flows.services.prefect_server import healthy

    deadline = time.monotonic() + SERVER_WAIT_SECONDS
    while not healthy(api_url):
        if time.monotonic() > deadline:
            raise DeploymentError(
                f"no Prefect server answers at PREFECT_API_URL={api_url}; start one with "
                "`prefect server start --host 127.0.0.1`, or unset PREFECT_API_URL to have psro serve start one"
            )
        time.sleep(0.5)


def serve(definitions: list[Definition], console, limit: int | None = None) -> None:
    """Serve until interrupted, against PREFECT_API_URL or a server started here on 127.0.0.1."""
    from flows.services.prefect_server import prefect_api

    # SIGTERM (a service manager, `kill`) stops serving like Ctrl-C, so a server started here stops too
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    configured = os.environ.get("PREFECT_API_URL")
    if configured:
        _wait_for_server(configured)
    with prefect_api() as (api_url, wait_for_api):
        wait_for_api()
        console.print(f"Prefect UI: {api_url.removesuffix('/api')}", highlight=False)
        if not configured:
            console.print(
                f"trigger from another shell with PREFECT_API_URL={api_url} set", highlight=False, soft_wrap=True
            )
        _serve(definitions, limit)


def _serve(definitions: list[Definition], limit: int | None) -> None:
    import prefect  # after PREFECT_API_URL is set: Prefect reads its settings at import
    from prefect.deployments.runner import EntrypointType

    deployments = [
        _import(definition.name, *definition.entrypoint.rsplit(".", 1)).to_deployment(
            name=definition.name,
            description=definition.description,
            parameters=definition.parameters,
            schedules=[_schedule(entry) for entry in definition.schedules],
            tags=definition.tags,
            enforce_parameter_schema=False,
            entrypoint_type=EntrypointType.MODULE_PATH,  # importable from any working directory
        )
        for definition in definitions
    ]
    prefect.serve(*deployments, limit=limit)  # runs beyond the limit wait for a slot
