"""Prefect's subflow engine, minus two reads that a run's own iteration subflows never need.

Prefect (3.8.8) makes six API calls to run a subflow: create its tracking task run, look for an
earlier flow run under that task run (to reattach one after a restart), create the flow run,
read it back, propose Running and propose Completed. A PSRO iteration or a MARL round is always a
new subflow: a retried or resumed run continues from MLflow's last committed iteration in fresh
subflows, so there is nothing to reattach to, and the read returns the flow run the create call
has just returned. On a one-run server each call takes tens of milliseconds, once per iteration.

Flows marked with `fresh_every_call` skip both reads; every other flow runs as Prefect wrote it.
`tests/test_patch_canaries.py` fails if an upgrade moves what this relies on.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any, Optional, TypeVar

F = TypeVar("F")
_FRESH = "_fresh_every_call"

# The flow run this context's engine has just created; the read that follows is answered from it.
_just_created: contextvars.ContextVar[Optional[Any]] = contextvars.ContextVar("just_created_flow_run", default=None)


def fresh_every_call(flow: F) -> F:
    """Mark a flow whose every call as a subflow is a new run (see the module docstring)."""
    setattr(flow, _FRESH, True)
    return flow


def _is_fresh(engine) -> bool:
    return bool(getattr(engine.flow, _FRESH, False))


def _skip_reads_for_fresh_subflows() -> None:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.flow_engine import FlowRunEngine

    load_subflow_run = FlowRunEngine.load_subflow_run
    if getattr(load_subflow_run, "_fresh_aware", False):
        return

    @functools.wraps(load_subflow_run)
    def load_unless_fresh(self, parent_task_run, client, context):
        return None if _is_fresh(self) else load_subflow_run(self, parent_task_run, client, context)

    create_flow_run = FlowRunEngine.create_flow_run

    @functools.wraps(create_flow_run)
    def create_and_remember(self, client):
        flow_run = create_flow_run(self, client)
        if _is_fresh(self):
            _just_created.set(flow_run)
        return flow_run

    read_flow_run = SyncPrefectClient.read_flow_run

    @functools.wraps(read_flow_run)
    def read_unless_just_created(self, flow_run_id):
        created = _just_created.get()
        if created is not None and created.id == flow_run_id:
            _just_created.set(None)  # once: any later read asks the server
            return created
        return read_flow_run(self, flow_run_id)

    for function in (load_unless_fresh, create_and_remember, read_unless_just_created):
        function._fresh_aware = True
    FlowRunEngine.load_subflow_run = load_unless_fresh
    FlowRunEngine.create_flow_run = create_and_remember
    SyncPrefectClient.read_flow_run = read_unless_just_created


_skip_reads_for_fresh_subflows()
