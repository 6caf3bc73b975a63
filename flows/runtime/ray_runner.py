"""prefect-ray's RayTaskRunner, minus the set-up it repeats for every task.

Profiles (prefect 3.8.8, prefect-ray 0.6.0) showed work that is the same for every task:

- driver side, each submit serializes the whole Prefect settings model, wraps the task body in
  a new `ray.remote` function, which Ray pickles and exports again on its first call, and
  pickles the task's and its flow's functions by value: a `@task` or `@flow` function's module
  name is bound to the Task or Flow, not to the function, so cloudpickle cannot refer to it and
  scans every loaded module (thousands in a driver that imported MLflow and Ray) per function;
- worker side, each task rebuilds that settings model from the dict (pydantic-settings re-reads
  every source) and opens a new HTTP client with a fresh SSL context;
- every Prefect API client builds its own SSL context from certifi's bundle (tens of
  milliseconds of CPU), even for an http:// server; the flow engine makes a new client for the
  tracking task of every subflow, so a PSRO run paid that once per iteration in the driver.

So settings are serialized once per settings context and clients share one SSL context per TLS
setting (both patches of Prefect in `flows.services.patches`, applied on import of this module); here,
settings are rebuilt once per worker process, the remote function is built once per set of Ray
options, tasks and flows that a module defines travel as that module's name and attribute, and
each worker keeps one API client. Parameters marked with Prefect's `opaque` (which Ray would
flatten into plain tuples) keep the mark on the way to the worker.

Task semantics (states, retries, logs, events) are untouched: the task still runs through
Prefect's own engine. `tests/test_patch_canaries.py` fails if an upgrade moves what this relies on.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

from prefect_ray import RayTaskRunner

from flows.services.patches import apply_patches

apply_patches()  # this module is imported wherever a flow or its tasks run: driver, `psro serve`, Ray workers

_settings_cache: dict[str, Any] = {}
_client_context = None


def _with_cached_settings(context: dict[str, Any]) -> dict[str, Any]:
    """Swap the serialized settings for a Settings instance built once per distinct value."""
    from prefect.settings import Settings

    settings_context = context.get("settings_context")
    if not settings_context or not isinstance(settings_context.get("settings"), dict):
        return context
    key = json.dumps(settings_context["settings"], sort_keys=True, default=str)
    settings = _settings_cache.get(key)
    if settings is None:
        settings = _settings_cache[key] = Settings(**settings_context["settings"])
    return {**context, "settings_context": {**settings_context, "settings": settings}}


def _worker_client_context():
    """One Prefect API client per worker process, kept open for the worker's lifetime."""
    global _client_context
    from prefect.context import SyncClientContext

    if _client_context is None:
        _client_context = SyncClientContext()
        _client_context.__enter__()
    return _client_context


class _ModuleAttribute:
    """A task or flow sent as the module attribute it is: the worker imports it instead of
    unpickling its function."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def load(self) -> Any:
        return getattr(importlib.import_module(self.module), self.name)


def _by_reference(task_or_flow: Any) -> Any:
    """A `_ModuleAttribute` when an importable module binds the object under its function's
    name (as `@task` and `@flow` at module level do); otherwise the object itself."""
    function = getattr(task_or_flow, "fn", None)
    module_name, name = getattr(function, "__module__", None), getattr(function, "__name__", None)
    module = sys.modules.get(module_name) if module_name != "__main__" else None
    if module is not None and name and getattr(module, name, None) is task_or_flow:
        return _ModuleAttribute(module_name, name)
    return task_or_flow


def _loaded(value: Any) -> Any:
    return value.load() if isinstance(value, _ModuleAttribute) else value


def _with_flow(context: dict[str, Any], change) -> dict[str, Any]:
    """The serialized context with `change` applied to its flow run's flow, if it has one."""
    flow_run_context = context.get("flow_run_context")
    if not flow_run_context or "flow" not in flow_run_context:
        return context
    return {**context, "flow_run_context": {**flow_run_context, "flow": change(flow_run_context["flow"])}}


class _Opaque:
    """A parameter marked `opaque` on its way to a worker. Ray sends tuples, and so Prefect's
    annotations (tuple subclasses), as plain tuples: the mark would be lost on the way."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def _each_item(value: Any, change) -> Any:
    """`change` applied to a parameter, or to each item of a parameter that is a list."""
    return [change(item) for item in value] if isinstance(value, list) else change(value)


def _carry_opaque(parameters: dict[str, Any]) -> dict[str, Any]:
    from prefect.utilities.annotations import opaque

    def carry(value: Any) -> Any:
        return _Opaque(value.unwrap()) if isinstance(value, opaque) else value

    return {name: _each_item(value, carry) for name, value in parameters.items()}


def _restore_opaque(parameters: dict[str, Any]) -> dict[str, Any]:
    from prefect.utilities.annotations import opaque

    def restore(value: Any) -> Any:
        return opaque(value.value) if isinstance(value, _Opaque) else value

    return {name: _each_item(value, restore) for name, value in parameters.items()}


_remote_functions: dict[str, Any] = {}


def _remote_task_body(remote_options: dict[str, Any]):
    """One Ray remote function per distinct set of options, exported to the cluster once."""
    import ray

    key = json.dumps(remote_options, sort_keys=True, default=repr)
    remote = _remote_functions.get(key)
    if remote is None:
        body = FastRayTaskRunner._run_prefect_task
        remote = _remote_functions[key] = ray.remote(**remote_options)(body) if remote_options else ray.remote(body)
    return remote


class FastRayTaskRunner(RayTaskRunner):
    def __enter__(self) -> FastRayTaskRunner:
        """Runs on the Ray its run started before the first subflow (`flows.services`, or
        a scenario's flow under a deployment). prefect-ray starts a default local Ray where none is
        running; here that can only be a subflow thread of a failed run starting after the run
        stopped Ray, and the Ray it started would outlive the run, so it fails instead."""
        import ray

        if not ray.is_initialized():
            raise RuntimeError("Ray is not running: the run started none, or has already stopped it")
        return super().__enter__()

    def duplicate(self) -> FastRayTaskRunner:
        return type(self)(address=self.address, init_kwargs=self.init_kwargs)

    def submit(self, task, parameters, wait_for=None, dependencies=None):
        """prefect-ray's `submit`, with the remote function built once instead of per call."""
        from uuid import uuid4

        from prefect.context import serialize_context
        from prefect.utilities.engine import collect_task_run_inputs_sync
        from prefect_ray.context import RemoteOptionsContext
        from prefect_ray.task_runners import PrefectRayFuture

        if not self._started:
            raise RuntimeError("The task runner must be started before submitting work.")
        task_run_id = uuid4()
        task_inputs = {k: collect_task_run_inputs_sync(v, future_cls=PrefectRayFuture) for k, v in parameters.items()}
        context = serialize_context(
            asset_ctx_kwargs={
                "task": task,
                "task_run_id": task_run_id,
                "task_inputs": task_inputs,
                "copy_to_child_ctx": True,
            }
        )
        parameters, upstream_ray_obj_refs = self._exchange_prefect_for_ray_futures(parameters)
        remote = _remote_task_body(RemoteOptionsContext.get().current_remote_options)
        object_ref = remote.options(name=task.name).remote(
            *upstream_ray_obj_refs,
            task=_by_reference(task),
            task_run_id=task_run_id,
            parameters=_carry_opaque(parameters),
            wait_for=wait_for,
            dependencies=dependencies,
            context=_with_flow(context, _by_reference),
        )
        return PrefectRayFuture(task_run_id=task_run_id, wrapped_future=object_ref)

    @staticmethod
    def _run_prefect_task(
        *upstream_ray_obj_refs: Any, task: Any, parameters: dict[str, Any], context: dict[str, Any], **kwargs: Any
    ) -> Any:
        from prefect.context import SyncClientContext

        client_context = _worker_client_context()
        token = SyncClientContext.__var__.set(client_context)
        try:
            return RayTaskRunner._run_prefect_task(
                *upstream_ray_obj_refs,
                task=_loaded(task),
                parameters=_restore_opaque(parameters),
                context=_with_cached_settings(_with_flow(context, _loaded)),
                **kwargs,
            )
        finally:
            SyncClientContext.__var__.reset(token)
