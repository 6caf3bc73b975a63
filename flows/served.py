"""The `psro` flow as `psro serve` runs it: `psro_flow`'s body with subflow heartbeats off.

Prefect gives every flow run a heartbeat thread; for a `psro-iteration` subflow, starting and
stopping it costs ~1.2 s, more than a Kuhn iteration itself. `run_psro` turns heartbeats off
around the whole run, and a served run gets the same here. The outer `psro` run keeps its own
heartbeat, so a crashed run is still detected. The flow has the same name and parameter as
`psro_flow`, so the deployments are `psro/<name>` either way, and it lives in its own module
because the runner imports served flows by module path in each run's child process.
"""

from __future__ import annotations

from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows.psro_flow import psro_flow


@flow(name=psro_flow.name, description=psro_flow.description, validate_parameters=False, persist_result=False)
def psro(config: dict) -> None:
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        psro_flow.fn(config)
