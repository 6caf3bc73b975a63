"""prefect-ray's RayTaskRunner, minus the set-up it repeats for every task.

Profiles (prefect 3.8.8, prefect-ray 0.6.0) showed work that is the same for every task:

- driver side, each submit serializes the whole Prefect settings model, and wraps the task
  body in a new `ray.remote` function, which Ray pickles and exports again on its first call;
- worker side, each task rebuilds that settings model from the dict (pydantic-settings re-reads
  every source) and opens a new HTTP client with a fresh SSL context.

So settings are serialized once per settings context and rebuilt once per worker process, the
remote function is built once per set of Ray options, and each worker keeps one API client.
Task semantics (states, retries, logs, events) are untouched: the task still runs through
Prefect's own engine. `tests/test_patch_canaries.py` fails if an upgrade moves what this relies on.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from prefect.context import SettingsContext
from prefect_ray import RayTaskRunner

_settings_cache: dict[str, Any] = {}
_client_context = None


def _memoize_settings_serialization() -> None:
    """SettingsContext is an immutable model whose serialization depends only on its fields."""
    original = SettingsContext.serialize
    if getattr(original, "_memoized", False):
        return
    cache: dict[int, tuple[SettingsContext, dict[str, Any]]] = {}

    @functools.wraps(original)  # __wrapped__: tests/test_patch_canaries.py checks Prefect's signature
    def serialize(self: SettingsContext, include_secrets: bool = True) -> dict[str, Any]:
        key = hash((id(self), include_secrets))
        hit = cache.get(key)
        if hit is None or hit[0] is not self:  # the stored instance keeps its id unique
            if len(cache) >= 16:  # settings contexts are few; keep the newest
                cache.pop(next(iter(cache)))
            hit = cache[key] = (self, original(self, include_secrets=include_secrets))
        return hit[1]

    serialize._memoized = True
    SettingsContext.serialize = serialize


_memoize_settings_serialization()


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
    def duplicate(self) -> "FastRayTaskRunner":
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
            asset_ctx_kwargs={"task": task, "task_run_id": task_run_id, "task_inputs": task_inputs, "copy_to_child_ctx": True}
        )
        parameters, upstream_ray_obj_refs = self._exchange_prefect_for_ray_futures(parameters)
        remote = _remote_task_body(RemoteOptionsContext.get().current_remote_options)
        object_ref = remote.options(name=task.name).remote(
            *upstream_ray_obj_refs, task=task, task_run_id=task_run_id, parameters=parameters,
            wait_for=wait_for, dependencies=dependencies, context=context,
        )
        return PrefectRayFuture(task_run_id=task_run_id, wrapped_future=object_ref)

    @staticmethod
    def _run_prefect_task(*upstream_ray_obj_refs: Any, context: dict[str, Any], **kwargs: Any) -> Any:
        from prefect.context import SyncClientContext

        client_context = _worker_client_context()
        token = SyncClientContext.__var__.set(client_context)
        try:
            return RayTaskRunner._run_prefect_task(
                *upstream_ray_obj_refs, context=_with_cached_settings(context), **kwargs
            )
        finally:
            SyncClientContext.__var__.reset(token)
