"""Canaries for the private code this project patches or leans on: one per patch.

flows/services/patches.py applies every patch (`apply_patches()`): it memoizes Prefect's
SettingsContext.serialize, shares one SSL context among Prefect's API clients, lets a new client
retry a refused connection to a server this process has reached, skips two reads in
Prefect's subflow engine, begins the SQLite server's write transactions IMMEDIATE, quiets two
of Ray's private loggers, keeps a Ray on this machine on loopback, starts a run's own Ray
without Ray's cluster services, and runs a stack head's Ray Client proxy from this project's
entry, which starts each client's process without a fork. Beside that,
flows/runtime/ray_runner.py overrides prefect-ray's RayTaskRunner.submit and _run_prefect_task and
swaps the flow in Prefect's serialized context; flows/services/ drains Prefect's log and event
workers, sets the task-run recorder's batch settings, and calls Ray's private token loader;
flows/cli/errors.py catches the exceptions of the click that typer bundles (typer._click).
None of that is public API, so pyproject.toml pins those packages. An upgrade changes the pin;
these tests then say which patch no longer holds, before a PSRO run finds out the slow way (a
patch that stops applying fails silently: runs just get slower, or chattier).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from processes import assert_all_exited, command_line, pids_with_env

ROOT = Path(__file__).resolve().parents[1]
# package -> the files whose patches rely on its internals
PATCHED = {
    "prefect": "flows/services/patches.py, flows/runtime/ray_runner.py, flows/services/",
    "prefect-ray": "flows/runtime/ray_runner.py",
    "ray": "flows/services/patches.py, flows/services/",
    "typer": "flows/cli/errors.py",
}


def _pins() -> dict[str, str]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for requirement in dependencies:
        if match := re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)", requirement.strip()):
            pins[match[1].lower()] = match[2]
    return pins


@pytest.mark.parametrize("package", sorted(PATCHED))
def test_each_patched_package_is_pinned_and_installed_at_its_pin(package):
    pin = _pins().get(package)
    assert pin, f"pyproject.toml must pin {package} exactly ({PATCHED[package]} patches its private code)"
    installed = importlib.metadata.version(package)
    assert installed == pin, (
        f"{package} {installed} is installed but pyproject.toml pins {pin}: "
        f"reinstall (pip install -e '.[test]'), or, when upgrading, run these canaries and recheck {PATCHED[package]}"
    )


# --- flows/services/patches.py -------------------------------------------------------------------------


def test_applying_the_patches_again_wraps_nothing_twice():
    """The patches are applied wherever flows/runtime/ray_runner.py is imported, in every Prefect server
    and wherever Ray starts: a second call must leave each patched function wrapping Prefect's
    own, once, and Ray's logger with one filter."""
    import logging

    from prefect.client.orchestration import PrefectClient, SyncPrefectClient
    from prefect.context import SettingsContext
    from prefect.flow_engine import FlowRunEngine
    from prefect.server.api import server
    from prefect.server.database.configurations import AioSqliteConfiguration
    from prefect.server.services import task_run_recorder

    from flows.services.patches import RAY_WORKER_LOGGER, apply_patches, apply_server_patches, quiet_ray_notices

    def apply_all() -> None:
        apply_patches()
        apply_server_patches()
        quiet_ray_notices()

    apply_all()
    patched = {
        (SettingsContext, "serialize"): "_memoized",
        (PrefectClient, "__init__"): "_shared_tls",
        (SyncPrefectClient, "__init__"): "_shared_tls",
        (FlowRunEngine, "load_subflow_run"): "_fresh_aware",
        (FlowRunEngine, "create_flow_run"): "_fresh_aware",
        (SyncPrefectClient, "read_flow_run"): "_fresh_aware",
        (AioSqliteConfiguration, "begin_transaction"): "_immediate",
        (server, "is_client_retryable_exception"): "_unreachable_database",
        (task_run_recorder, "record_bulk_task_run_events"): "_patient",
        (task_run_recorder, "consumer"): "_patient",
    }
    before = {key: getattr(*key) for key in patched}
    filters = list(logging.getLogger(RAY_WORKER_LOGGER).filters)
    apply_all()
    for (owner, name), mark in patched.items():
        function = getattr(owner, name)
        assert function is before[owner, name] and getattr(function, mark, False), (
            f"{owner.__name__}.{name} was patched again"
        )
        assert not getattr(function.__wrapped__, mark, False), (
            f"{owner.__name__}.{name} wraps a patched version of itself"
        )
    assert logging.getLogger(RAY_WORKER_LOGGER).filters == filters


def test_settings_serialization_is_memoized_on_prefects_own_path():
    """The patch replaces SettingsContext.serialize(self, include_secrets=True); prefect-ray's
    submit reaches it through prefect.context.serialize_context, which must hand back the one
    memoized dict per settings context."""
    from prefect.context import SettingsContext, serialize_context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.services.patches import apply_patches

    apply_patches()

    patched = SettingsContext.serialize
    assert getattr(patched, "_memoized", False), "flows/services/patches.py no longer patches SettingsContext.serialize"
    parameters = inspect.signature(patched.__wrapped__).parameters
    assert list(parameters) == ["self", "include_secrets"] and parameters["include_secrets"].default is True, (
        f"prefect changed SettingsContext.serialize to {inspect.signature(patched.__wrapped__)}; "
        "flows/services/patches.py's memoized serialize passes (self, include_secrets) only"
    )
    first, second = serialize_context()["settings_context"], serialize_context()["settings_context"]
    assert first is second, (
        "serialize_context() no longer goes through SettingsContext.serialize: "
        "the memo in flows/services/patches.py has no effect"
    )
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:1/api"}):
        changed = serialize_context()["settings_context"]
    assert changed is not first and changed["settings"]["api"]["url"] == "http://127.0.0.1:1/api", (
        "a new settings context was served a stale serialization"
    )


def test_prefect_clients_share_one_tls_context_and_keep_one_they_are_given():
    """Prefect's client builds an SSL context from certifi's bundle unless `verify` is one
    already; the patch hands it the shared one, so two clients must hold the same context, and a
    client given its own `verify` must keep it."""
    import ssl

    from prefect.client.orchestration import PrefectClient, SyncPrefectClient

    from flows.services.patches import apply_patches

    apply_patches()

    for client_class in (PrefectClient, SyncPrefectClient):
        patched = client_class.__init__
        assert getattr(patched, "_shared_tls", False), (
            f"flows/services/patches.py no longer patches {client_class.__name__}.__init__"
        )
        assert "httpx_settings" in inspect.signature(patched.__wrapped__).parameters, (
            f"{client_class.__name__}.__init__ no longer takes httpx_settings: "
            "flows/services/patches.py passes the shared context there"
        )
        source = inspect.getsource(patched.__wrapped__)
        assert 'httpx_settings.get("verify")' in source and "isinstance(tls_verify, ssl.SSLContext)" in source, (
            f"{client_class.__name__} no longer skips building an SSL context when given one: "
            "the shared context saves nothing"
        )
    contexts = [
        client._client._transport._pool._ssl_context
        for client in (
            PrefectClient("http://127.0.0.1:1/api"),
            PrefectClient("http://127.0.0.1:1/api"),
            SyncPrefectClient("http://127.0.0.1:1/api"),
        )
    ]
    assert isinstance(contexts[0], ssl.SSLContext) and all(context is contexts[0] for context in contexts)
    own = ssl.create_default_context()
    given = PrefectClient("http://127.0.0.1:1/api", httpx_settings={"verify": own})
    assert given._client._transport._pool._ssl_context is own


def test_a_new_prefect_client_retries_a_refused_connection_to_a_server_this_process_reached():
    """Prefect's clients retry a refused connection only when `_has_connected` says they were
    answered before; the patch makes that the process's, per URL. A new client of a server that
    answered an earlier client, asking while the server restarts, waits for it (as a subflow begun
    in a Prefect outage must); a client of a server nobody here reached still fails at once."""
    import http.server
    import threading
    import time

    import httpx
    from prefect.client.base import PrefectHttpxAsyncClient, PrefectHttpxSyncClient

    from flows.services.patches import apply_patches
    from flows.services.prefect_server import free_port

    apply_patches()
    for client_class in (PrefectHttpxAsyncClient, PrefectHttpxSyncClient):
        source = inspect.getsource(client_class.send)
        assert "if self._has_connected:" in source and "self._has_connected = True" in source, (
            f"{client_class.__name__}.send no longer decides its ConnectError retries by _has_connected"
        )

    class Answers(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    def serve(port: int) -> http.server.ThreadingHTTPServer:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Answers)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    servers = [serve(0)]
    port = servers[0].server_address[1]
    restart = threading.Timer(1.0, lambda: servers.append(serve(port)))
    try:
        with PrefectHttpxSyncClient(base_url=f"http://127.0.0.1:{port}") as first:
            assert first.get("/").status_code == 200
        servers[0].shutdown()
        servers[0].server_close()
        restart.start()
        with PrefectHttpxSyncClient(base_url=f"http://127.0.0.1:{port}") as second:
            assert second.get("/").status_code == 200  # refused, retried, answered by the restarted server
    finally:
        restart.cancel()
        for server in servers[1:]:
            server.shutdown()
            server.server_close()
    started = time.monotonic()
    with PrefectHttpxSyncClient(base_url=f"http://127.0.0.1:{free_port()}") as stranger:
        with pytest.raises(httpx.ConnectError):
            stranger.get("/")
    assert time.monotonic() - started < 1.0  # no back-off for a server never reached


def test_the_patched_engine_methods_keep_prefects_signatures():
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.flow_engine import FlowRunEngine

    from flows.services.patches import apply_patches

    apply_patches()

    expected = {
        (FlowRunEngine, "load_subflow_run"): ["self", "parent_task_run", "client", "context"],
        (FlowRunEngine, "create_flow_run"): ["self", "client"],
        (SyncPrefectClient, "read_flow_run"): ["self", "flow_run_id"],
    }
    for (owner, name), parameters in expected.items():
        patched = getattr(owner, name)
        assert getattr(patched, "_fresh_aware", False), (
            f"flows/services/patches.py no longer patches {owner.__name__}.{name}"
        )
        assert list(inspect.signature(patched.__wrapped__).parameters) == parameters, (
            f"prefect changed {owner.__name__}.{name}{inspect.signature(patched.__wrapped__)}; "
            f"flows/services/patches.py passes {parameters}"
        )
    engine_source = inspect.getsource(importlib.import_module("prefect.flow_engine"))
    assert "self.flow_run = client.read_flow_run(self.flow_run.id)" in engine_source, (
        "prefect's subflow engine no longer reads back the flow run it created: "
        "flows/services/patches.py's read skip may be obsolete"
    )
    assert "if subflow_run := self.load_subflow_run(" in engine_source


@pytest.mark.end_to_end
def test_a_fresh_subflow_skips_both_reads_and_still_nests_under_its_parent(tmp_path):
    """Against a real server: a marked subflow makes no lookup of earlier runs and no read-back,
    an unmarked one makes both (so the patch is what makes the difference), and both end
    Completed under their parent's tracking task run."""
    from prefect import flow
    from prefect.client.base import PrefectHttpxSyncClient
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.services.patches import fresh_every_call
    from flows.services.prefect_server import LocalPrefectServer, _flush_prefect_clients

    calls: list[str] = []
    send = PrefectHttpxSyncClient.send

    def counted_send(self, request, *args, **kwargs):
        path = request.url.path
        if request.method == "POST" and path.endswith("/flow_runs/filter"):
            calls.append("lookup")
        elif request.method == "GET" and "/flow_runs/" in path:
            calls.append("read")
        return send(self, request, *args, **kwargs)

    @fresh_every_call
    @flow
    def fresh() -> int:
        return 1

    @flow
    def plain() -> int:
        return 2

    @flow
    def parent() -> tuple[list[str], list[str]]:
        calls.clear()
        fresh()
        during_fresh = list(calls)
        calls.clear()
        plain()
        return during_fresh, list(calls)

    server = LocalPrefectServer(tmp_path / "prefect", one_run=True)
    try:
        server.wait()
        with temporary_settings({PREFECT_API_URL: server.url}):
            PrefectHttpxSyncClient.send = counted_send
            try:
                during_fresh, during_plain = parent()
            finally:
                PrefectHttpxSyncClient.send = send
            assert during_fresh == [] and sorted(during_plain) == ["lookup", "read"], (during_fresh, during_plain)

            async def subflow_runs():
                async with get_client() as client:
                    return [run for run in await client.read_flow_runs() if run.parent_task_run_id]

            runs = asyncio.run(subflow_runs())
            _flush_prefect_clients()  # the runs' logs, while the server still listens
    finally:
        server.stop()
    assert len(runs) == 2 and all(run.state.is_completed() for run in runs)


def _sqlite_statements(tmp_path: Path) -> list[str]:
    """The SQL a Prefect write transaction sends, on a fresh SQLite database."""
    import sqlalchemy as sa
    from prefect.server.database import configurations

    tmp_path.mkdir()

    async def run() -> list[str]:
        config = configurations.AioSqliteConfiguration(connection_url=f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}")
        engine = await config.engine()
        seen: list[str] = []
        sa.event.listen(
            engine.sync_engine, "before_cursor_execute", lambda conn, cursor, statement, *_: seen.append(statement)
        )
        try:
            async with await config.session(engine) as session, config.begin_transaction(session):
                await session.execute(sa.text("select 1"))
        finally:
            await engine.dispose()
        return seen

    return asyncio.run(run())


def test_prefect_server_write_transactions_begin_immediate(tmp_path, monkeypatch):
    from prefect.server.database import configurations, interface

    from flows.services.patches import _begin_write_transactions_immediate

    sqlite = configurations.AioSqliteConfiguration
    prefects_own = sqlite.begin_transaction
    if getattr(prefects_own, "_immediate", False):  # patched by an earlier test's apply_patches()
        prefects_own = prefects_own.__wrapped__
    monkeypatch.setattr(sqlite, "begin_transaction", prefects_own)  # the patched one is restored after the test
    assert "self.database_config.begin_transaction(" in inspect.getsource(
        interface.PrefectDBInterface.session_context
    ), (
        "prefect's server no longer opens transactions through database_config.begin_transaction: "
        "flows/services/patches.py's patch is bypassed"
    )
    assert _sqlite_statements(tmp_path / "before")[0] == "BEGIN DEFERRED", (
        "prefect now begins SQLite write transactions some other way: flows/services/patches.py's patch may be obsolete"
    )
    _begin_write_transactions_immediate()
    assert _sqlite_statements(tmp_path / "after")[0] == "BEGIN IMMEDIATE", (
        "flows/services/patches.py's patch no longer makes prefect's SQLite write transactions BEGIN IMMEDIATE"
    )


def test_the_prefect_server_answers_503_when_its_database_cannot_be_reached(monkeypatch):
    """Prefect's API handler answers 503 (which clients retry) for what `is_client_retryable_exception`
    accepts, looked up by name, and 500 for the rest; Prefect's own accepts a dropped database
    connection but not a refused one, which the patch adds (tests/test_stack.py meets it on a
    real PostgreSQL)."""
    import socket

    import sqlalchemy.exc
    from prefect.server.api import server

    from flows.services.patches import _retry_an_unreachable_database

    prefects_own = server.is_client_retryable_exception
    if getattr(prefects_own, "_unreachable_database", False):  # patched by an earlier test
        prefects_own = prefects_own.__wrapped__
    monkeypatch.setattr(server, "is_client_retryable_exception", prefects_own)
    assert "is_client_retryable_exception(exc)" in inspect.getsource(server.custom_internal_exception_handler), (
        "prefect's API handler no longer asks is_client_retryable_exception: "
        "flows/services/patches.py's patch is bypassed"
    )
    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")
    unreachable = [refused, TimeoutError(), socket.gaierror(-2, "Name or service not known")]
    dropped = sqlalchemy.exc.DBAPIError("SELECT 1", {}, Exception("connection was closed"))

    def status(exc: Exception) -> int:
        return asyncio.run(server.custom_internal_exception_handler(None, exc)).status_code

    assert [status(exc) for exc in unreachable] == [500, 500, 500], (
        "prefect now retries an unreachable database itself: flows/services/patches.py's patch may be obsolete"
    )
    assert status(dropped) == 503
    _retry_an_unreachable_database()
    assert [status(exc) for exc in unreachable] == [503, 503, 503]
    assert status(dropped) == 503 and status(ValueError("a bug")) == 500


def test_the_task_run_recorder_keeps_what_it_cannot_write_while_the_database_does_not_answer(monkeypatch):
    """Prefect's recorder writes each batch through `record_bulk_task_run_events`, looked up by
    name, and drops an event after a few failed writes; patched, a write that failed while the
    database does not answer waits for it and is made again, and one that failed while it answers
    raises at once, for Prefect to count; so does one in the last flush, made as the recorder
    closes (tests/test_stack.py meets it on a real PostgreSQL)."""
    from prefect.server.services import task_run_recorder as recorder

    import flows.services.patches
    from flows.services.patches import _record_task_runs_through_a_database_outage

    assert "await record_bulk_task_run_events(" in inspect.getsource(recorder.consumer), (
        "prefect's task-run recorder no longer writes through record_bulk_task_run_events: "
        "flows/services/patches.py's patch is bypassed"
    )
    assert "async with consumer(" in inspect.getsource(recorder.TaskRunRecorder.start), (
        "prefect's task-run recorder no longer enters its consumer by name: its last flush would wait for the database"
    )
    written, answers, closing = [], [], []

    @contextlib.asynccontextmanager
    async def prefects_consumer():
        try:
            yield "handler"
        finally:  # where Prefect's consumer makes its last flush
            closing.append(flows.services.patches._closing_recorder.get())

    async def write(events) -> None:
        written.append(list(events))
        if len(written) == 1 or isinstance(failure, ValueError):
            raise failure

    async def database_answers() -> bool:
        return answers.pop(0)

    monkeypatch.setattr(recorder, "record_bulk_task_run_events", write)
    monkeypatch.setattr(recorder, "consumer", prefects_consumer)
    monkeypatch.setattr(flows.services.patches, "_database_answers", database_answers)
    _record_task_runs_through_a_database_outage()
    patient = recorder.record_bulk_task_run_events
    assert patient is not write and patient.__wrapped__ is write

    failure, answers[:] = ConnectionRefusedError(111, "Connect call failed"), [False, False, True]
    asyncio.run(patient(["event"]))  # refused, not answering (twice), answering: written again
    assert written == [["event"], ["event"]] and answers == []

    written.clear()
    failure, answers[:] = ValueError("a bug"), [True]
    with pytest.raises(ValueError):
        asyncio.run(patient(["event"]))
    assert written == [["event"]] and answers == []

    async def close_and_flush() -> None:
        async with recorder.consumer() as handler:
            assert handler == "handler" and not flows.services.patches._closing_recorder.get()
        await patient(["event"])  # the last flush, as the server stops: refused, and not waited out

    written.clear()
    failure, answers[:] = ConnectionRefusedError(111, "Connect call failed"), [False]
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(close_and_flush())
    assert closing == [True] and written == [["event"]] and answers == [False]


def test_rays_token_notice_logger_still_has_the_quieted_name():
    """Read, not imported: importing a piece of ray._private on its own upsets ray's exit hook."""
    from flows.services.patches import RAY_TOKEN_NOTICE_LOGGER

    package, *modules = RAY_TOKEN_NOTICE_LOGGER.split(".")
    source = Path(importlib.util.find_spec(package).origin).parent.joinpath(*modules).with_suffix(".py")
    assert source.is_file() and "logging.getLogger(__name__)" in source.read_text(), (
        f"{RAY_TOKEN_NOTICE_LOGGER} no longer logs under its module name: "
        "flows/services/patches.py quiets a logger nothing uses"
    )


def test_every_flow_run_enters_the_sigterm_swap_a_driver_turns_off(monkeypatch):
    """`driver_keeps_sigterm` replaces `prefect.flow_engine.capture_sigterm`: the engine must still
    look it up there around its sync and its async flow runs, and Prefect's version must still
    swap SIGTERM's handler for its own (else the patch turns off nothing, or something else)."""
    from prefect import flow_engine
    from prefect.utilities import engine

    from flows.services.patches import driver_keeps_sigterm

    assert inspect.getsource(flow_engine).count("with capture_sigterm():") == 2, (
        "prefect's flow engine no longer enters capture_sigterm() around its sync and async runs: "
        "recheck driver_keeps_sigterm"
    )
    assert (
        flow_engine.capture_sigterm is engine.capture_sigterm or flow_engine.capture_sigterm._leaves_sigterm
    )  # (a CLI test ran here)
    assert re.search(
        r"signal\.signal\(\s*signal\.SIGTERM,\s*_prefect_sigterm_handler", inspect.getsource(engine.capture_sigterm)
    )
    monkeypatch.setattr(flow_engine, "capture_sigterm", engine.capture_sigterm)  # put back after the test
    driver_keeps_sigterm()
    patched = flow_engine.capture_sigterm
    driver_keeps_sigterm()
    assert flow_engine.capture_sigterm is patched and patched._leaves_sigterm
    handler = signal.getsignal(signal.SIGTERM)
    with patched():
        assert signal.getsignal(signal.SIGTERM) is handler


def test_rays_notice_of_no_sigterm_handler_is_the_one_quieted():
    """`ray.init` off the main thread (`psro run` starts Ray on a thread) warns that it set no
    SIGTERM handler; flows/services/patches.py filters exactly that warning out of the logger it goes to."""
    import ast
    import logging
    import textwrap

    import ray

    from flows.services.patches import RAY_WORKER_LOGGER, quiet_ray_notices

    init = inspect.unwrap(ray.init)
    warnings = [
        node.args[0].value
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(init))))
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", None) == "warning"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and "SIGTERM" in str(node.args[0].value)
    ]
    assert len(warnings) == 1, (
        f"ray.init's warnings about SIGTERM are now {warnings}: flows/services/patches.py filters one that is gone"
    )
    assert init.__module__ == RAY_WORKER_LOGGER and "logger = logging.getLogger(__name__)" in inspect.getsource(
        sys.modules[init.__module__]
    ), (
        f"ray.init now lives in {init.__module__} or logs elsewhere: "
        f"flows/services/patches.py filters {RAY_WORKER_LOGGER}"
    )
    quiet_ray_notices()
    logger = logging.getLogger(RAY_WORKER_LOGGER)
    notice = logger.makeRecord(logger.name, logging.WARNING, "worker.py", 0, warnings[0], (), None)
    other = logger.makeRecord(logger.name, logging.WARNING, "worker.py", 0, "something else went wrong", (), None)
    assert not logger.filter(notice), f"flows/services/patches.py no longer filters Ray's notice {warnings[0]!r}"
    assert logger.filter(other), "flows/services/patches.py filters Ray's other warnings too"


# --- flows/runtime/ray_runner.py ----------------------------------------------------------------------


def test_a_worker_takes_a_settings_instance_where_prefect_sends_a_dict():
    """Workers swap the serialized settings for a Settings instance built once
    (_with_cached_settings); Prefect's hydrated_context must accept it as given."""
    from prefect.context import SettingsContext, hydrated_context, serialize_context
    from prefect.settings import Settings

    from flows.runtime.ray_runner import _with_cached_settings

    serialized = serialize_context()
    assert isinstance(serialized["settings_context"].get("settings"), dict), (
        "prefect's serialized context no longer carries settings as a dict under settings_context: "
        "flows/runtime/ray_runner.py's _with_cached_settings leaves it alone"
    )
    context = _with_cached_settings(serialized)
    settings = context["settings_context"]["settings"]
    assert isinstance(settings, Settings), (
        "flows/runtime/ray_runner.py's _with_cached_settings no longer builds a Settings instance"
    )
    with hydrated_context(context, client=object()):  # no flow run in the context: the client goes unused
        assert SettingsContext.get().settings is settings, (
            "prefect's hydrated_context rebuilt the settings: "
            "flows/runtime/ray_runner.py's per-worker cache no longer saves anything"
        )


def test_prefect_ray_still_calls_the_overridden_task_function():
    """FastRayTaskRunner._run_prefect_task wraps RayTaskRunner._run_prefect_task, passing
    `context` by keyword; submit must call it through self, and duplicate must carry every
    constructor argument (it rebuilds the runner from address and init_kwargs)."""
    from prefect_ray import RayTaskRunner

    from flows.runtime.ray_runner import FastRayTaskRunner

    assert isinstance(inspect.getattr_static(RayTaskRunner, "_run_prefect_task"), staticmethod), (
        "prefect-ray's RayTaskRunner._run_prefect_task is no longer a staticmethod; "
        "FastRayTaskRunner overrides it as one"
    )
    parameters = inspect.signature(RayTaskRunner._run_prefect_task).parameters
    assert next(iter(parameters.values())).kind is inspect.Parameter.VAR_POSITIONAL, (
        "prefect-ray's _run_prefect_task no longer takes upstream refs first; "
        "flows/runtime/ray_runner.py forwards them so"
    )
    assert parameters["context"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "self._run_prefect_task" in inspect.getsource(RayTaskRunner.submit), (
        "prefect-ray's submit no longer runs self._run_prefect_task: FastRayTaskRunner's override is bypassed"
    )
    assert list(inspect.signature(RayTaskRunner.__init__).parameters) == ["self", "address", "init_kwargs"], (
        f"RayTaskRunner{inspect.signature(RayTaskRunner.__init__)}: "
        "FastRayTaskRunner.duplicate passes address and init_kwargs only"
    )
    runner = FastRayTaskRunner(address="ray://head:10001", init_kwargs={"num_cpus": 1})
    copy = runner.duplicate()
    assert type(copy) is FastRayTaskRunner and (copy.address, copy.init_kwargs) == (runner.address, runner.init_kwargs)


# prefect-ray 0.6.0's RayTaskRunner.submit, which FastRayTaskRunner.submit re-states with the
# remote function built once; any change upstream must be carried over by hand.
PREFECT_RAY_SUBMIT_SHA256 = "fd5a1b4f775ef044"


def test_prefect_rays_submit_is_the_one_fast_submit_re_states():
    """FastRayTaskRunner.submit is prefect-ray's submit minus a `ray.remote` per call: it must
    change when prefect-ray's does, and the pieces it calls must keep their shapes."""
    import hashlib

    from prefect.context import serialize_context
    from prefect.utilities.engine import collect_task_run_inputs_sync
    from prefect_ray import RayTaskRunner
    from prefect_ray.task_runners import PrefectRayFuture

    digest = hashlib.sha256(inspect.getsource(RayTaskRunner.submit).encode()).hexdigest()[:16]
    assert digest == PREFECT_RAY_SUBMIT_SHA256, (
        "prefect-ray's RayTaskRunner.submit changed: carry the change into flows/runtime/ray_runner.py's "
        "FastRayTaskRunner.submit, then update PREFECT_RAY_SUBMIT_SHA256"
    )
    assert "asset_ctx_kwargs" in inspect.signature(serialize_context).parameters
    assert "future_cls" in inspect.signature(collect_task_run_inputs_sync).parameters
    assert {"task_run_id", "wrapped_future"} <= set(inspect.signature(PrefectRayFuture).parameters)
    assert callable(getattr(RayTaskRunner, "_exchange_prefect_for_ray_futures", None))


def test_the_worker_client_context_is_the_one_prefects_engine_uses():
    """Each worker sets SyncClientContext.__var__ to its long-lived client context; Prefect's
    task engine must pick that up through SyncClientContext.get_or_create()."""
    from prefect.context import SyncClientContext

    assert "SyncClientContext.get_or_create()" in inspect.getsource(importlib.import_module("prefect.task_engine")), (
        "prefect's task engine no longer gets its client from SyncClientContext.get_or_create(): "
        "the per-worker client in flows/runtime/ray_runner.py is bypassed"
    )
    mine = SyncClientContext.model_construct()
    token = SyncClientContext.__var__.set(mine)
    try:
        with SyncClientContext.get_or_create() as used:
            assert used is mine, (
                "SyncClientContext.get_or_create() ignores the context set in SyncClientContext.__var__"
            )
    finally:
        SyncClientContext.__var__.reset(token)


def test_module_level_tasks_and_flows_travel_by_name_and_others_whole():
    """A `@task` or `@flow` at module level is bound to its function's name, so the worker can
    import it; one made by `with_options` (not bound anywhere) must travel as itself."""
    import tasks
    from flows.deployments.entrypoints import psro_iteration
    from flows.runtime.ray_runner import _by_reference, _loaded, _ModuleAttribute

    for task_or_flow in (tasks.TASKS["solve-meta-game"], psro_iteration):
        reference = _by_reference(task_or_flow)
        assert isinstance(reference, _ModuleAttribute) and _loaded(reference) is task_or_flow
    renamed = tasks.TASKS["solve-meta-game"].with_options(name="renamed")
    assert _by_reference(renamed) is renamed


def test_the_serialized_context_carries_its_flow_where_the_runner_swaps_it():
    """FastRayTaskRunner sends the flow run's flow by name (`_with_flow`): Prefect's serialized
    context must hold the Flow itself under flow_run_context["flow"], and a worker's
    hydrated_context must read it from there; anywhere else, the flow would travel pickled."""
    from prefect.context import FlowRunContext, hydrated_context, serialize_context

    from flows.deployments.entrypoints import psro_iteration
    from flows.runtime.ray_runner import _by_reference, _loaded, _ModuleAttribute, _with_flow

    with FlowRunContext.model_construct(flow=psro_iteration, result_store=None):
        serialized = serialize_context()
    assert serialized["flow_run_context"].get("flow") is psro_iteration, (
        "prefect's serialized context no longer carries the flow under flow_run_context['flow']: "
        "flows/runtime/ray_runner.py's _with_flow leaves it alone and the flow travels pickled"
    )
    sent = _with_flow(serialized, _by_reference)
    assert isinstance(sent["flow_run_context"]["flow"], _ModuleAttribute), (
        "flows/runtime/ray_runner.py no longer sends the flow by name"
    )
    assert _with_flow(sent, _loaded)["flow_run_context"]["flow"] is psro_iteration
    assert 'flow_run_context["flow"]' in inspect.getsource(hydrated_context), (
        "prefect's hydrated_context no longer reads the flow from flow_run_context['flow']: "
        "the worker would get a name, not a flow"
    )


def test_opaque_parameters_survive_the_trip_to_a_worker_and_prefect_unwraps_them():
    """Ray flattens tuple subclasses such as Prefect's `opaque`, so flows/runtime/ray_runner.py carries
    the mark across in its own class; on the worker Prefect must resolve the restored mark to
    the bare value without walking into it."""
    from prefect.utilities.annotations import opaque
    from prefect.utilities.engine import resolve_inputs_sync

    from flows.runtime.ray_runner import _carry_opaque, _restore_opaque

    value = {"table": [1, 2, 3]}
    carried = _carry_opaque({"x": opaque(value), "xs": [opaque(value), 7], "plain": value})
    restored = _restore_opaque(carried)
    assert isinstance(restored["x"], opaque) and restored["x"].unwrap() is value
    assert isinstance(restored["xs"][0], opaque) and restored["xs"][1] == 7 and restored["plain"] is value
    resolved = resolve_inputs_sync(restored)
    assert resolved["x"] is value and resolved["xs"] == [value, 7], (
        "prefect no longer unwraps `opaque` when it resolves a task's parameters: "
        "flows/runtime/task_steps.py's tasks would get the wrapper"
    )


# --- flows/services/ -------------------------------------------------------------------------


def test_prefects_log_and_event_workers_still_drain_with_a_timeout():
    """flows/services/ calls drain_all(timeout=5) under contextlib.suppress: a changed method
    would lose the run's last logs without a word."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        assert "timeout" in inspect.signature(worker.drain_all).parameters, (
            f"{worker.__name__}.drain_all(timeout=...) is gone"
        )


def test_rays_token_loader_for_joining_a_cluster_is_still_there():
    """flows/services/ joins a cluster the way `ray.init(address="auto")` does, through Ray's
    private `maybe_enable_token_auth_if_token_available`; without it a `psro server` (token auth
    on) refuses every run that tries to reuse it."""
    from ray._private.authentication import authentication_token_setup

    function = getattr(authentication_token_setup, "maybe_enable_token_auth_if_token_available", None)
    assert function is not None, (
        "ray moved maybe_enable_token_auth_if_token_available: flows/services/'s ray_session must follow"
    )
    assert "warn_if_disabled" in inspect.signature(function).parameters


LOCAL_RAY = """
import sys
import ray
from flows.services.ray_session import start_ray
start_ray(None, 1, {})
ray.get(ray.remote(lambda: None).remote())  # a worker process too
print("up", flush=True)
sys.stdin.read()
ray.shutdown()
try:
    ray.put(1)  # a late call of a stopped run: no_ray_auto_init makes it raise, not start a Ray
except ray.exceptions.RaySystemError as error:
    print("late call:", error, flush=True)
print("initialized after the late call:", ray.is_initialized(), flush=True)
"""


# What a head node runs besides the GCS, the raylet and its two agents, found by command line.
RAY_CLUSTER_SERVICES = ("dashboard/dashboard.py", "autoscaler/_private/monitor.py", "_private/log_monitor.py")


def test_a_runs_local_ray_listens_on_loopback_only_and_starts_no_cluster_services(tmp_path):
    """`ray_on_loopback` (flows/services/patches.py): every socket the processes of a local Ray
    listen on, the driver's included, is on 127.0.0.1. Without the patch Ray hands its GCS,
    raylet and workers the machine's address and they listen on every interface.
    `ray_without_cluster_services`: a run's own Ray starts no autoscaler monitor, log monitor or
    dashboard API server, and still runs tasks; without the patch all three are there.
    `no_ray_auto_init`: a Ray call after the run stopped its Ray raises rather than starting a
    default Ray that would outlive the run."""
    marker = f"LOOPBACK_TEST={tmp_path}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    driver = subprocess.Popen(
        [sys.executable, "-c", LOCAL_RAY],
        env={**env, "LOOPBACK_TEST": str(tmp_path)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout.readline() == "up\n"
        pids = pids_with_env(marker)
        listening = _listening_addresses(pids)
        commands = [command for pid in pids if (command := command_line(pid)) is not None]
    finally:
        late, _ = driver.communicate("", timeout=120)
    assert_all_exited(marker)
    assert "late call: System error: Ray has not been started yet" in late, late
    assert "initialized after the late call: False" in late, late
    assert len(listening) >= 4, listening  # the GCS, the raylet, the driver's and the worker's gRPC at least
    assert {host for host, _ in listening} <= {"127.0.0.1"}, sorted(listening)
    assert any("gcs_server" in c for c in commands) and any("raylet" in c for c in commands), commands
    assert not [c for c in commands if any(service in c for service in RAY_CLUSTER_SERVICES)], commands


# Loaded by every Python process of the test's Ray: the node's two agents start 25 s late, longer
# than the raylet's fixed 15 s wait for their port files.
SLOW_AGENTS = """
import sys, time
if sys.argv and sys.argv[0].endswith(("dashboard/agent.py", "runtime_env/agent/main.py")):
    time.sleep(25)
"""


@pytest.mark.parametrize("shared", [False, True], ids=["run", "server"])
def test_a_local_ray_starts_when_its_agents_start_late(tmp_path, shared):
    """`ray_agents_on_chosen_ports` (flows/services/patches.py): a local Ray whose agents take
    longer to start than the raylet waits for them (as on a loaded machine) still starts and
    runs a task, for a run's own Ray and a `psro server`'s. Without the patch the raylet aborts
    and `ray.init` fails with "The current node timed out during startup"."""
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "sitecustomize.py").write_text(SLOW_AGENTS)
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    script = LOCAL_RAY.replace("start_ray(None, 1, {})", f"start_ray(None, 1, {{}}, shared={shared})")
    driver = subprocess.Popen(
        [sys.executable, "-c", script],
        env={**env, "PYTHONPATH": str(tmp_path / "slow"), "SLOW_AGENTS_TEST": str(tmp_path)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = driver.stdout.readline()
    finally:
        out, err = driver.communicate("", timeout=180)
    assert_all_exited(f"SLOW_AGENTS_TEST={tmp_path}")
    assert first == "up\n", err[-3000:]


def _listening_addresses(pids: list[int]) -> set[tuple[str, int]]:
    """(host, port) of every TCP socket the processes listen on, from /proc/net/tcp{,6}."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if (target := os.readlink(fd)).startswith("socket:["):
                        inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.add((_host(address), int(port, 16)))
    return found


def _host(hex_address: str) -> str:
    """/proc/net's little-endian hex address as text; an IPv4-mapped IPv6 address as its IPv4."""
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, raw[12:])
    return socket.inet_ntop(socket.AF_INET6, raw)


def test_the_task_run_recorder_writes_in_the_batches_the_server_environment_sets(monkeypatch):
    """flows/services/ starts the Prefect server with TASK_RUN_RECORDER_BATCHING in its
    environment: the variables must be Prefect settings, and the recorder must hand those
    settings to the consumer that writes the batches (else it writes one event per transaction)."""
    import contextlib

    from prefect.context import SettingsContext
    from prefect.server.services import task_run_recorder
    from prefect.settings import Settings

    from flows.services.prefect_server import TASK_RUN_RECORDER_BATCHING

    for name, value in TASK_RUN_RECORDER_BATCHING.items():
        monkeypatch.setenv(name, value)
    settings = Settings()  # as the server process builds it, from its environment
    recorder_settings = settings.server.services.task_run_recorder
    assert (recorder_settings.batch_size, recorder_settings.flush_interval) == (
        int(TASK_RUN_RECORDER_BATCHING["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"]),
        float(TASK_RUN_RECORDER_BATCHING["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL"]),
    ), f"prefect no longer reads {sorted(TASK_RUN_RECORDER_BATCHING)} into the task-run recorder's settings"

    class Started(Exception):
        pass

    given = {}

    @contextlib.asynccontextmanager
    async def consumer(**kwargs):
        given.update(kwargs)
        raise Started
        yield

    monkeypatch.setattr(task_run_recorder, "create_consumer", lambda *args, **kwargs: None)
    monkeypatch.setattr(task_run_recorder, "consumer", consumer)
    with SettingsContext(profile=SettingsContext.get().profile, settings=settings), pytest.raises(Started):
        asyncio.run(task_run_recorder.TaskRunRecorder().start())
    assert (given.get("write_batch_size"), given.get("flush_every")) == (
        recorder_settings.batch_size,
        int(recorder_settings.flush_interval),
    ), f"prefect's TaskRunRecorder no longer writes by its batch_size and flush_interval settings (it passed {given})"


# --- flows/cli/errors.py ----------------------------------------------------------------------


def test_typers_bundled_click_errors_are_what_a_bad_flag_raises():
    """flows/cli/errors.py turns typer._click's BadParameter and UsageError into one `error:` line."""
    from typer.testing import CliRunner

    from flows.cli.app import app

    runner = CliRunner()
    bad_type = runner.invoke(app, ["run", "--iterations", "many"])
    assert bad_type.exit_code == 2 and bad_type.output.strip().splitlines()[0].startswith("error: iterations='many'"), (
        "typer's bad-parameter error no longer reaches flows/cli/errors.py's handler "
        f"(typer._click.exceptions.BadParameter):\n{bad_type.output}"
    )
    unknown = runner.invoke(app, ["run", "--no-such-flag"])
    assert unknown.exit_code == 2 and unknown.output.strip().splitlines() == [
        "error: No such option: --no-such-flag"
    ], (
        "typer's usage error no longer reaches flows/cli/errors.py's handler "
        f"(typer._click.exceptions.UsageError):\n{unknown.output}"
    )


def test_ray_start_keeps_a_loopback_node_address_and_wraps_once():
    """`flows.services.patches.ray_start_keeps_loopback`, what the stack's `ray start` runs under: Ray
    still turns 127.0.0.1 into the network address through this function, which it calls from
    `ray start` for the node's address and the address it joins."""
    from ray._private import services
    from ray.scripts import scripts

    from flows.services.patches import ray_start_keeps_loopback

    assert "services.resolve_ip_for_localhost(node_ip_address)" in inspect.getsource(scripts.start.callback)
    assert "resolve_ip_for_localhost" in inspect.getsource(services.canonicalize_bootstrap_address)
    original = services.resolve_ip_for_localhost
    try:
        ray_start_keeps_loopback()
        patched = services.resolve_ip_for_localhost
        ray_start_keeps_loopback()
        assert services.resolve_ip_for_localhost is patched
        assert patched("127.0.0.1") == "127.0.0.1"
    finally:
        services.resolve_ip_for_localhost = original


SIGNAL_MASK = "print(next(line for line in open('/proc/self/status') if line.startswith('SigBlk:')).split()[1])"


def _sigint_blocked_in_a_started_process() -> bool:
    """Whether a process `ray._private.services.start_ray_process` starts has SIGINT blocked: the
    mark of Ray's function run between fork and exec, which blocks it in the child."""
    from ray._private import ray_constants, services

    started = services.start_ray_process(
        [sys.executable, "-c", SIGNAL_MASK],
        ray_constants.PROCESS_TYPE_RAY_CLIENT_SERVER,
        fate_share=False,
        stdout_file=subprocess.PIPE,
    )
    mask, _ = started.process.communicate(timeout=60)
    return bool(int(mask, 16) & 1 << (signal.SIGINT - 1))


def test_a_stack_heads_client_proxy_runs_this_projects_entry_and_starts_each_clients_process_without_fork():
    """`ray_start_runs_this_client_proxy` and `ray_client_proxy_spawns_without_fork`
    (flows/services/patches.py): Ray still starts its Ray Client proxy and each client's process
    through `start_ray_process` as ``-m ray.util.client.server``, and that function still forks
    to run a function before exec (it blocks SIGINT in the child). Patched, the proxy's command
    is the entry's, a client's process's command is Ray's (the proxy waits for that command to
    appear), and a process started carries no blocked SIGINT: nothing ran between fork and exec."""
    from ray._private import ray_constants, services
    from ray.util.client.server import proxier

    from flows.services.patches import ray_client_proxy_spawns_without_fork, ray_start_runs_this_client_proxy

    assert 'server_type="specific-server"' in inspect.getsource(proxier.ProxyManager.start_specific_server)
    assert "-m ray.util.client.server" in inspect.getsource(proxier._match_running_client_server)
    start, popen = services.start_ray_process, services.ConsolePopen
    commands = []
    services.start_ray_process = lambda command, process_type, *args, **kwargs: commands.append((command, process_type))
    try:
        ray_start_runs_this_client_proxy(("-m", "entry", "proxy"))
        wrapped = services.start_ray_process
        ray_start_runs_this_client_proxy(("-m", "entry", "proxy"))
        assert services.start_ray_process is wrapped
        services.start_ray_client_server("127.0.0.2:6379", "127.0.0.2", 10001, runtime_env_agent_address="http://x:1")
        services.start_ray_client_server("127.0.0.2:6379", "127.0.0.2", 23000, server_type="specific-server")
    finally:
        services.start_ray_process = start
    (proxy, kind), (specific, _) = commands
    assert kind == ray_constants.PROCESS_TYPE_RAY_CLIENT_SERVER
    assert proxy[2:5] == ["-m", "entry", "proxy"] and "--mode=proxy" in proxy, proxy
    assert proxier._match_running_client_server(specific), specific

    assert _sigint_blocked_in_a_started_process(), (
        "Ray's start_ray_process no longer blocks SIGINT between fork and exec: recheck "
        "flows/services/patches.py's ray_client_proxy_spawns_without_fork"
    )
    try:
        ray_client_proxy_spawns_without_fork()
        patched = services.ConsolePopen
        ray_client_proxy_spawns_without_fork()
        assert services.ConsolePopen is patched
        assert not _sigint_blocked_in_a_started_process()
    finally:
        services.ConsolePopen = popen
