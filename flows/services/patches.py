"""Every change this project makes to Prefect's and Ray's private code, in one place.

None of it is public API, so pyproject.toml pins those packages and `tests/test_patch_canaries.py`
fails, naming the patch, when an upgrade moves what a patch relies on (a patch that stops
applying fails silently: runs just get slower, or chattier). Each patch is idempotent. Eleven
calls apply them, each in the processes that need its part, so that none pays for another's
imports (the server's database layer alone is some 270 modules a Ray worker never uses):

- `apply_patches()`: Prefect's client and engine, wherever a flow or its tasks run. It runs on
  import of `flows/runtime/ray_runner.py`, which the driver, `psro serve` and every Ray worker import.
- `apply_server_patches()`: Prefect's server, in the server process
  (`flows/services/patched_prefect_server.py`).
- `quiet_ray_notices()`: Ray's loggers, before Ray starts (`flows.services.ray_session.start_ray`); it imports
  nothing, so the processes that start Ray before (or without) importing Prefect can call it.
- `ray_on_loopback()`: around the `ray.init` that starts a local Ray or joins one on 127.0.0.1
  (`flows.services.ray_session.start_ray`).
- `ray_without_cluster_services()`: around the `ray.init` that starts a run's own local Ray
  (`flows.services.ray_session.start_ray`).
- `ray_agents_on_chosen_ports()`: around the `ray.init` that starts any local Ray (a run's own or
  a `psro server`'s, `flows.services.ray_session.start_ray`).
- `ray_start_keeps_loopback()`: in the process that runs `ray start` for a node of the team's
  stack (`python -m flows.services.stack ray start ...`, `flows/services/stack.py`).
- `ray_start_runs_this_client_proxy()`: there too, for a head node; the proxy it starts calls
  `ray_client_proxy_spawns_without_fork()` (`python -m flows.services.stack ray-client-proxy ...`).
- `no_ray_auto_init()`: in a run's driver, before it starts or joins Ray (`flows.services.ray_session.start_ray`).
- `driver_keeps_sigterm()`: in a run's driver started from the command line
  (`flows.cli.scenario_commands.with_services`), before its flow runs.

What is patched, and why (found by profiles of prefect 3.8.8 and prefect-ray 0.6.0):

- `SettingsContext.serialize`: prefect-ray's submit serializes the whole settings model for every
  task. The context is an immutable model whose serialization depends only on its fields, so it
  is serialized once per context.
- `PrefectClient.__init__`, `SyncPrefectClient.__init__`: every API client builds its own SSL
  context from certifi's bundle, even for an http:// server, and the flow engine makes a new
  client for the tracking task of every subflow. Clients given no `verify` share one context
  per TLS setting.
- `PrefectHttpxAsyncClient._has_connected`, `PrefectHttpxSyncClient._has_connected`: Prefect's
  HTTP clients retry a refused connection (with its back-off, `PREFECT_CLIENT_MAX_RETRIES`
  times) only once that same client has had an answer, so that a wrong URL fails at once. The
  flow engine opens a new client for each subflow, so a step begun while the server restarted
  failed at its first request, and the run with it (found by `tests/test_stack.py`'s Prefect
  fault once its run met the outage with a step to begin). The flag is made the process's, per
  API URL: a new client of a server this process has reached retries as the first one would.
- `FlowRunEngine.load_subflow_run`, `FlowRunEngine.create_flow_run`,
  `SyncPrefectClient.read_flow_run`: Prefect makes six API calls to run a subflow: create its
  tracking task run, look for an earlier flow run under that task run (to reattach one after a
  restart), create the flow run, read it back, propose Running and propose Completed. A PSRO
  iteration or a MARL round is always a new subflow: a retried or resumed run continues from
  MLflow's last committed iteration in fresh subflows, so there is nothing to reattach to, and
  the read returns the flow run the create call has just returned. Flows marked with
  `fresh_every_call` skip both reads; every other flow runs as Prefect wrote it.
- `AioSqliteConfiguration.begin_transaction` (the server's): on SQLite, Prefect's API opens
  write transactions DEFERRED. One that reads before it writes (creating a task run reads the
  flow run's labels first) fails at once with "database is locked" when the task-run recorder
  commits in between; the API answers 503 and the client backs off 2 s. Under RayTaskRunner that
  hit every other PSRO iteration (Prefect issues #7277, #18934). Beginning write transactions
  IMMEDIATE takes SQLite's write lock up front, so writers queue on the busy timeout instead of
  failing. PostgreSQL-backed servers do not need this.
- `prefect.server.api.server.is_client_retryable_exception` (the server's): the API answers 503,
  which Prefect's clients retry with their back-off, for the database errors a client can wait
  out (a dropped connection, a database starting up), and 500, which they do not retry, for the
  rest. A PostgreSQL that is down refuses the connection itself, a `ConnectionRefusedError` no
  driver wraps, so every request made while the team's database restarted got 500, which could
  fail its run. An error reaching the database (`ConnectionError`, `TimeoutError`, a name that
  does not resolve) is made retryable too: a run waits out a database restart as it waits out
  the server's own.
- `prefect.server.services.task_run_recorder.record_bulk_task_run_events` (the server's): the
  task-run recorder writes the task runs' events (their creation and every state) in batches,
  flushed each second here (`flows.services.prefect_server.TASK_RUN_RECORDER_BATCHING`), and drops an event
  after 5 failed writes: a database down for more than about 5 s erased from Prefect every task
  run of the outage (the UI never showed them). A write that failed while the database does not
  answer now waits until it does (for up to `flows.tracking.patient.PATIENCE_S`, as long as the
  run's MLflow clients wait for their server) and is made again; a failure while it answers is
  Prefect's to count, as before, and so is one in the last flush of a server that stops
  (`consumer`, wrapped to mark it), which would otherwise wait out its stop's grace.
- `ray._private.ray_constants.ENABLE_RAY_CLUSTER` (`ray_on_loopback`), around starting or
  joining a Ray on 127.0.0.1: with it on (Linux's default) Ray resolves 127.0.0.1 to the
  machine's network address, so a local instance's servers listen on every interface and a
  driver joining 127.0.0.1 calls the network address; off, both stay on loopback.
- `ray._private.services.start_ray_process` (`ray_start_runs_this_client_proxy`), in `ray start`
  for the stack's head, and `ray._private.services.ConsolePopen`
  (`ray_client_proxy_spawns_without_fork`), in its Ray Client proxy: the proxy started a process
  for each client by fork with a Python function to run before exec, and that fork of a process
  with gRPC's threads running sometimes died (Ray issue #63202; it refused a laptop run of
  `tests/test_hosts.py` in CI through three tries). The proxy now runs from this project's entry,
  which starts those processes without the function (vfork, then exec).
- `ray._private.services.resolve_ip_for_localhost` (`ray_start_keeps_loopback`), in `ray start`
  for the stack's nodes: it turns 127.0.0.1 into the network address where clusters are on, and
  with clusters off `ray start` adds no worker node; kept as given, every node stays on loopback.
- `ray._private.node.Node.__init__`, `Node.start_api_server` (`ray_without_cluster_services`),
  around starting a run's own Ray: a head node always starts three Python processes a run of
  its own never uses: the autoscaler's monitor, the log monitor (it forwards worker output to a
  driver that asked for it; runs pass `log_to_driver=False`) and the dashboard's API server
  (started even with `include_dashboard=False`, and polled until it answers). Ray treats a
  dashboard that failed to start as optional. Without them the run's Ray starts on less CPU
  and stops sooner (figures in docs/performance.md). A `psro server`'s shared Ray keeps them.
- `Node.__init__` again (`ray_agents_on_chosen_ports`), around starting any local Ray: a node
  whose agents' ports are left to the agents (Ray's default) has its raylet wait for each agent
  to write its port to a file, and abort after a fixed 15 s (no setting changes it: "Check
  failed ... Timed out waiting for file .../metrics_agent_port_..."; `ray.init` then says "The
  current node timed out during startup"). The agents are Python processes whose imports took
  longer than that on a loaded machine: it failed a fresh-clone CI run 17 times. Ports chosen
  free before the start are handed to the agents and the raylet, which then waits for no file;
  an agent that comes up late only delays metrics. `ray._private.services.start_ray_process`
  is wrapped for that start too: Ray leaves the dashboard agent's listening port out of the
  raylet's command line, so the raylet waited for that file even with the port chosen.
- `ray._private.auto_init_hook.enable_auto_connect` (`no_ray_auto_init`): Ray's public calls
  (`ray.get`, `ray.put`, `ray.remote(...).remote`) start a default local Ray when none is
  running, with every cluster service and none of the run's settings. In a driver that has
  stopped its Ray, a thread still finishing a failed run's work would start one that outlives
  the run (found left behind by a failed run in CI). Off, those calls raise instead. Ray reads
  `RAY_ENABLE_AUTO_CONNECT` once, at import, so the module's flag is turned off.
- `prefect.flow_engine.capture_sigterm` (`driver_keeps_sigterm`): every flow run, each subflow
  included, swaps SIGTERM's handler for Prefect's, which raises `TerminationSignal`. A driver
  spends its time in `ray.get`, and raised there, inside Ray, that exception became a
  SystemError (`psro marl run` exited with status 1) or was lost (`psro league run` went on
  waiting for minutes): SIGTERM did not stop a run as Ctrl-C does. With the swap off, the
  driver's own handler (`flows.services.run_services.stop_on_sigterm`) stays; it raises KeyboardInterrupt,
  which ends Ray's wait as Ctrl-C does, and Prefect marks the flow runs crashed as on Ctrl-C.
  Prefect's swap serves a runner that cancels a flow run it started (a deployment's run), so
  only drivers started from the command line turn it off.
- Ray's loggers (`quiet_ray_notices`): the notice that token authentication is on, and the one
  that Ray set no SIGTERM handler when it starts off the main thread (`psro run` starts it on a
  thread; its main thread handles signals, `flows.services.run_services.stop_on_sigterm`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import Iterator
from typing import Any, TypeVar

F = TypeVar("F")

RAY_TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
RAY_WORKER_LOGGER = "ray._private.worker"
RAY_SIGTERM_NOTICE = "SIGTERM handler is not set"


def apply_patches() -> None:
    """Patch Prefect's client and engine (each patch at most once)."""
    _memoize_settings_serialization()
    _share_client_tls_contexts()
    _retry_refused_connections_once_the_process_connected()
    _skip_reads_for_fresh_subflows()


def apply_server_patches() -> None:
    """Patch Prefect's server (each patch at most once)."""
    _begin_write_transactions_immediate()
    _retry_an_unreachable_database()
    _record_task_runs_through_a_database_outage()


# --- Ray's notices --------------------------------------------------------------------------


class _NoSigtermNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(RAY_SIGTERM_NOTICE)


def quiet_ray_notices() -> None:
    """Token authentication stays on; its start-up notice is not news worth a console line
    between the run's own lines (`ray get-auth-token` prints the token). Off the main thread Ray
    installs no SIGTERM handler and says so; the caller's main thread handles signals."""
    logging.getLogger(RAY_TOKEN_NOTICE_LOGGER).setLevel(logging.ERROR)
    worker_logger = logging.getLogger(RAY_WORKER_LOGGER)
    if not any(isinstance(existing, _NoSigtermNotice) for existing in worker_logger.filters):
        worker_logger.addFilter(_NoSigtermNotice())


def no_ray_auto_init() -> None:
    """A run starts and stops its Ray explicitly; a Ray call after the stop raises rather than
    starting another (see the module docstring)."""
    from ray._private import auto_init_hook

    auto_init_hook.enable_auto_connect = False


def driver_keeps_sigterm() -> None:
    """Prefect's flow runs leave SIGTERM's handler as the driver set it (see the module
    docstring): call it in a command-line driver, before its flow runs."""
    from prefect import flow_engine

    if getattr(flow_engine.capture_sigterm, "_leaves_sigterm", False):
        return

    @contextlib.contextmanager
    def leave_sigterm() -> Iterator[None]:
        yield

    leave_sigterm._leaves_sigterm = True
    flow_engine.capture_sigterm = leave_sigterm


@contextlib.contextmanager
def ray_on_loopback() -> Iterator[None]:
    """Around a `ray.init` that starts a local instance, or joins one on 127.0.0.1: Ray gives a
    new node the machine's network address, and replaces a loopback address it is given (even
    ray.init's private `_node_ip_address`, or the address to join) with it, so that other
    machines could join. A local instance's GCS, raylet and workers then listen on every
    interface, and a driver joining 127.0.0.1 calls the network address, where a loopback
    instance does not answer. Where clusters are off (Ray's
    Windows and macOS default, `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`) Ray keeps loopback and
    hands 127.0.0.1 to every process it starts. Ray reads that switch once, at import, so it is
    turned off here for the start alone: joining another machine's cluster later is unchanged."""
    from ray._private import ray_constants

    previous = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = previous


RAY_CLIENT_SERVER_MODULE = "ray.util.client.server"


def ray_start_runs_this_client_proxy(entry: tuple[str, ...]) -> None:
    """In a process that runs `ray start --head` (`flows.services.stack`): the node's Ray Client
    server, the proxy that starts a process for each client, is started as ``python ENTRY ARGS``
    instead of ``python -m ray.util.client.server ARGS``, so that it runs
    `ray_client_proxy_spawns_without_fork` before Ray's own server (see that function)."""
    from ray._private import ray_constants, services

    start = services.start_ray_process
    if getattr(start, "_runs_this_client_proxy", False):
        return

    def start_this_proxy(command, process_type, *args, **kwargs):
        if process_type == ray_constants.PROCESS_TYPE_RAY_CLIENT_SERVER and "--mode=proxy" in command:
            at = command.index(RAY_CLIENT_SERVER_MODULE)  # after its "-m"
            command = [*command[: at - 1], *entry, *command[at + 1 :]]
        return start(command, process_type, *args, **kwargs)

    start_this_proxy._runs_this_client_proxy = True
    services.start_ray_process = start_this_proxy


def ray_client_proxy_spawns_without_fork() -> None:
    """In a Ray Client proxy (`ray_start_runs_this_client_proxy`): the process it starts for each
    client connecting is started without a function run between fork and exec. Ray passes one
    (it blocks SIGINT and asks the kernel to kill the child with its parent), which makes Python
    fork the proxy (a process with gRPC's threads running) and run Python code in the copy; that
    copy sometimes died before it reached exec (Ray issue #63202, in about one connection of 15
    on this project's machines), and the client was refused with "Starting Ray client server
    failed". Without the function Python uses vfork and goes straight to exec. The client's
    process then lives in the node's process group, which `psro stack down` and a lost host end
    with the proxy; the proxy also stops it when its client leaves."""
    from ray._private import services

    popen = services.ConsolePopen
    if getattr(popen, "_spawns_without_fork", False):
        return

    class PopenWithoutPreexec(popen):
        _spawns_without_fork = True

        def __init__(self, *args, **kwargs):
            kwargs["preexec_fn"] = None
            super().__init__(*args, **kwargs)

    services.ConsolePopen = PopenWithoutPreexec


def ray_start_keeps_loopback() -> None:
    """In a process that runs Ray's `ray start` command (`flows.services.stack`): a node given
    ``--node-ip-address 127.0.0.1`` (and a worker given ``--address 127.0.0.1:PORT``) stays on
    loopback. Ray replaces a loopback address with the machine's network address so that other
    machines could join; with clusters off instead (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`,
    `ray_on_loopback`) `ray start` refuses every node but the head. Only the replacement is
    turned off, so a head and its worker nodes all start, and all listen on 127.0.0.1."""
    from ray._private import services

    resolve = services.resolve_ip_for_localhost
    if getattr(resolve, "_keeps_loopback", False):
        return

    def keep_loopback(host: str) -> str:
        return host if host == "127.0.0.1" else resolve(host)

    keep_loopback._keeps_loopback = True
    services.resolve_ip_for_localhost = keep_loopback


@contextlib.contextmanager
def ray_without_cluster_services() -> Iterator[None]:
    """Around a `ray.init` that starts a local head node with ``include_dashboard=False``: the
    node starts without the autoscaler's monitor, the log monitor and the dashboard's API server
    (see the module docstring). Any other node, and every node started outside this context, is
    started as Ray starts it."""
    from ray._private.node import Node

    init, start_api_server = Node.__init__, Node.start_api_server

    def lean_init(self, ray_params, head: bool = False, *args, **kwargs):
        if head and ray_params.include_dashboard is False:
            ray_params.no_monitor = True
            ray_params.include_log_monitor = False
        init(self, ray_params, head, *args, **kwargs)

    def no_api_server(self, *, include_dashboard, raise_on_failure):
        if include_dashboard is not False:
            return start_api_server(self, include_dashboard=include_dashboard, raise_on_failure=raise_on_failure)
        self._webui_url = None  # what Ray records when the dashboard fails to start

    Node.__init__, Node.start_api_server = lean_init, no_api_server
    try:
        yield
    finally:
        Node.__init__, Node.start_api_server = init, start_api_server


# The ports of a node's dashboard agent (gRPC, metrics export, HTTP) and runtime-env agent.
RAY_AGENT_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port")


@contextlib.contextmanager
def ray_agents_on_chosen_ports() -> Iterator[None]:
    """Around a `ray.init` that starts a local head node: its dashboard agent's three ports and
    its runtime-env agent's port are chosen free here (on loopback, where `ray_on_loopback` keeps
    the node), so the raylet does not wait for their port files (see the module docstring).
    Ports the caller set are kept. Ray hands the raylet every port but the dashboard agent's
    listening one, which the raylet takes as a flag too; it is added to the raylet's command."""
    from ray._private import ray_constants, services
    from ray._private.node import Node

    init, start_ray_process = Node.__init__, services.start_ray_process
    listen_port: list[int] = []  # the head node's, once chosen

    def init_with_agent_ports(self, ray_params, head: bool = False, *args, **kwargs):
        if head and not kwargs.get("connect_only", False):
            unset = [field for field in RAY_AGENT_PORTS if not getattr(ray_params, field, None)]
            for field, port in zip(unset, _free_loopback_ports(len(unset)), strict=True):
                setattr(ray_params, field, port)
            listen_port[:] = [ray_params.dashboard_agent_listen_port]
        init(self, ray_params, head, *args, **kwargs)

    def start_with_listen_port(command, process_type, *args, **kwargs):
        if process_type == ray_constants.PROCESS_TYPE_RAYLET and listen_port:
            command = [*command, f"--dashboard_agent_listen_port={listen_port[0]}"]
        return start_ray_process(command, process_type, *args, **kwargs)

    Node.__init__, services.start_ray_process = init_with_agent_ports, start_with_listen_port
    try:
        yield
    finally:
        Node.__init__, services.start_ray_process = init, start_ray_process


def _free_loopback_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now (held open together, so none repeats)."""
    import socket

    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


# --- Prefect's settings serialization -------------------------------------------------------


def _memoize_settings_serialization() -> None:
    from prefect.context import SettingsContext

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


# --- Prefect's API clients ------------------------------------------------------------------

_tls_contexts: dict[tuple[bool, str], Any] = {}


def _shared_tls_context():
    """The SSL context Prefect's client would build for the current TLS settings, built once.

    Clients only read it (httpx wraps each connection's socket with it), so sharing is safe.
    """
    import ssl

    import certifi
    from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY

    insecure = bool(PREFECT_API_TLS_INSECURE_SKIP_VERIFY.value())
    cert_file = "" if insecure else (PREFECT_API_SSL_CERT_FILE.value() or certifi.where())
    context = _tls_contexts.get((insecure, cert_file))
    if context is None:
        if insecure:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context = ssl.create_default_context(cafile=cert_file)
        _tls_contexts[(insecure, cert_file)] = context
    return context


def _share_client_tls_contexts() -> None:
    """Hand every Prefect client that is given no `verify` the shared context (the client then
    skips building its own: it only builds one when `verify` is not an SSLContext)."""
    from prefect.client.orchestration import PrefectClient, SyncPrefectClient

    for client_class in (PrefectClient, SyncPrefectClient):
        original = client_class.__init__
        if getattr(original, "_shared_tls", False):
            continue

        @functools.wraps(original)  # __wrapped__: tests/test_patch_canaries.py checks Prefect's signature
        def __init__(self, api, *args, httpx_settings: dict[str, Any] | None = None, _original=original, **kwargs):
            if not httpx_settings or "verify" not in httpx_settings:
                httpx_settings = {**(httpx_settings or {}), "verify": _shared_tls_context()}
            _original(self, api, *args, httpx_settings=httpx_settings, **kwargs)

        __init__._shared_tls = True
        client_class.__init__ = __init__


# --- Prefect's client through a server restart ----------------------------------------------

_answered_urls: set[str] = set()  # the API URLs some client of this process has had an answer from


def _retry_refused_connections_once_the_process_connected() -> None:
    """Make Prefect's "has this client connected" flag the process's, per API URL: a client of a
    URL that any client here has reached retries a refused connection. The flag itself lives in
    the instance's `__dict__` under another name, so Prefect's own reads and writes go through."""
    from prefect.client.base import PrefectHttpxAsyncClient, PrefectHttpxSyncClient

    def has_connected(client) -> bool:
        return client.__dict__.get("_answered", False) or str(client.base_url) in _answered_urls

    def set_connected(client, value: bool) -> None:
        client.__dict__["_answered"] = value
        if value:
            _answered_urls.add(str(client.base_url))

    for client_class in (PrefectHttpxAsyncClient, PrefectHttpxSyncClient):
        if not isinstance(client_class.__dict__.get("_has_connected"), property):
            client_class._has_connected = property(has_connected, set_connected)


# --- Prefect's subflow engine ---------------------------------------------------------------

_FRESH = "_fresh_every_call"

# The flow run this context's engine has just created; the read that follows is answered from it.
_just_created: contextvars.ContextVar[Any | None] = contextvars.ContextVar("just_created_flow_run", default=None)


def fresh_every_call(flow: F) -> F:
    """Mark a flow whose every call as a subflow is a new run: Prefect's engine then skips the
    lookup of an earlier run to reattach and the read-back of the run it has just created."""
    apply_patches()  # the mark means nothing to an engine that is not patched
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


# --- Prefect's server on SQLite -------------------------------------------------------------


def _begin_write_transactions_immediate() -> None:
    from prefect.server.database import configurations

    sqlite = configurations.AioSqliteConfiguration
    original = sqlite.begin_transaction
    if getattr(original, "_immediate", False):
        return

    @functools.wraps(original)  # __wrapped__: tests/test_patch_canaries.py starts from Prefect's own
    def begin_transaction(self, session, with_for_update: bool = False):
        return original(self, session, with_for_update=True)

    begin_transaction._immediate = True
    sqlite.begin_transaction = begin_transaction


# --- Prefect's server on PostgreSQL ---------------------------------------------------------


def _retry_an_unreachable_database() -> None:
    import socket

    from prefect.server.api import server

    original = server.is_client_retryable_exception
    if getattr(original, "_unreachable_database", False):
        return

    @functools.wraps(original)  # the API's handler and the orchestration rules look it up by name
    def is_client_retryable_exception(exc: Exception) -> bool:
        return isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror)) or original(exc)

    is_client_retryable_exception._unreachable_database = True
    server.is_client_retryable_exception = is_client_retryable_exception


# Set in the task that closes a task-run recorder, for its last flush: a server that stops while
# its database is down stops at once, as it did before, instead of waiting for the database.
_closing_recorder: contextvars.ContextVar[bool] = contextvars.ContextVar("closing_task_run_recorder", default=False)


def _record_task_runs_through_a_database_outage() -> None:
    from prefect.server.services import task_run_recorder as recorder

    from flows.tracking.patient import PATIENCE_S

    original = recorder.record_bulk_task_run_events
    if getattr(original, "_patient", False):
        return
    original_consumer = recorder.consumer

    @functools.wraps(original)  # the recorder's flush looks it up by name
    async def record_bulk_task_run_events(events) -> None:
        deadline = time.monotonic() + PATIENCE_S
        while True:
            try:
                return await original(events)
            except Exception:
                if _closing_recorder.get() or time.monotonic() > deadline or await _database_answers():
                    raise  # not an outage, or the server is stopping: Prefect's recorder counts it
            recorder.logger.warning("The database does not answer: %d task-run events wait for it", len(events))
            while not await _database_answers() and time.monotonic() < deadline:
                await asyncio.sleep(1.0)

    @functools.wraps(original_consumer)  # `TaskRunRecorder.start` enters it by name
    @contextlib.asynccontextmanager
    async def consumer(*args, **kwargs):
        async with original_consumer(*args, **kwargs) as handler:
            try:
                yield handler
            finally:
                _closing_recorder.set(True)  # seen by the last flush, which runs in this task

    record_bulk_task_run_events._patient = True
    consumer._patient = True
    recorder.record_bulk_task_run_events = record_bulk_task_run_events
    recorder.consumer = consumer


async def _database_answers() -> bool:
    """Prefect's own check, the one its `/ready` answers with (a pre-pinged connection)."""
    from prefect.server.database import provide_database_interface

    return await provide_database_interface().is_db_connectable()
