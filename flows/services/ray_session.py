"""Ray for a run: a fresh local instance limited to this machine's cores (``address="local"``, so
an unrelated running cluster is never joined by accident), or the cluster at ``--ray-address``;
and the waits on Ray's tasks, which must leave Ray before it stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

from flows.services.patches import (
    no_ray_auto_init,
    quiet_ray_notices,
    ray_agents_on_chosen_ports,
    ray_on_loopback,
    ray_without_cluster_services,
)
from flows.services.prefect_server import find_running_server


@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int | None, env_vars: dict[str, str]) -> Iterator[None]:
    """Start or join Ray, with ``env_vars`` (the Prefect API URL) set in every worker.

    A local instance's workers inherit this process's environment; a cluster's workers get the
    variables through Ray's runtime environment, which costs an agent round trip per worker.
    """
    start_ray(address, num_cpus, env_vars)
    try:
        yield
    finally:
        stop_ray()


def start_ray(address: str | None, num_cpus: int | None, env_vars: dict[str, str], shared: bool = False) -> None:
    """Join the Ray at `address`, or start a local one. A run's own local Ray starts without
    the cluster services only a shared Ray needs (`flows.services.patches.ray_without_cluster_services`);
    ``shared``: a Ray that outlives the run, as a `psro server`'s, keeps them."""
    import ray

    quiet_ray_notices()
    no_ray_auto_init()
    if address:
        running = find_running_server()
        if running and running.ray_address == address:
            from ray._private.authentication.authentication_token_setup import (
                maybe_enable_token_auth_if_token_available,
            )

            # A `psro server`'s Ray was started by `ray.init()`, which turns token authentication
            # on; joining it by address needs what `ray.init(address="auto")` would do: take
            # the token Ray saved for this user. Other clusters keep Ray's own rules.
            maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        runtime_env = {"env_vars": env_vars} if env_vars else None
        # a Ray on this machine's loopback (a `psro server`'s, a test cluster's) is joined there
        on_loopback = address.rsplit(":", 1)[0] in ("127.0.0.1", "localhost")
        with ray_on_loopback() if on_loopback else contextlib.nullcontext():
            _join(address, runtime_env)
    else:
        os.environ.update(env_vars)
        lean = contextlib.nullcontext() if shared else ray_without_cluster_services()
        with ray_on_loopback(), ray_agents_on_chosen_ports(), lean:  # loopback only; a cluster is joined explicitly
            ray.init(
                address="local",
                num_cpus=num_cpus or os.cpu_count(),
                object_store_memory=512 * 1024 * 1024,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )


CLIENT_CONNECT_TRIES = 3  # connections to a Ray Client server, where its process for this client died at birth


def _join(address: str, runtime_env: dict | None) -> None:
    """`ray.init` at `address`. Ray Client's server starts a process for each client, forked
    from a process with gRPC's threads running; that child sometimes dies at once (Ray issue
    #63202; met by the multi-host test, tests/test_hosts.py), and the client is refused with
    "Initialization failure from server". Nothing was started for it, so it connects again."""
    import ray

    for attempt in range(1, CLIENT_CONNECT_TRIES + 1):
        try:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
            return
        except ConnectionAbortedError as error:
            if attempt == CLIENT_CONNECT_TRIES or "Initialization failure from server" not in str(error):
                raise
            with contextlib.suppress(Exception):
                ray.shutdown()


def ray_to_use(config_address: str | None, api_url: str) -> tuple[str | None, dict[str, str]]:
    """The Ray to start or join, and the variables its workers need: a running `psro server`'s
    Ray, when the run uses that server's Prefect API, already gives its workers the address."""
    running = None if config_address else find_running_server()
    if running and running.prefect_api_url == api_url:
        return running.ray_address, {}
    return config_address, {"PREFECT_API_URL": api_url}


def rearm_signal_handlers() -> None:
    """Set the Python handlers of SIGINT and SIGTERM again, where the operating system calls
    them. Ray's driver, started on another thread, installs its own failure handler for SIGTERM
    there: it printed a stack trace, and the process, though it unwound as on Ctrl-C, ended by
    SIGABRT (status 134). Python still reports its own handler, which setting it again
    reinstates. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    for number in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(number)
        if handler is not None:  # None: a handler not set from Python, left as it is
            signal.signal(number, handler)


@contextlib.contextmanager
def ray_in_background(
    address: str | None, num_cpus: int | None, env_vars: dict[str, str], environment: str
) -> Iterator[Callable[[], None]]:
    """`ray_session`, started on a thread, with its workers warming up: the caller goes on with
    its own slow imports meanwhile. Yields a function that waits until Ray is up."""
    from concurrent.futures import ThreadPoolExecutor

    def start() -> None:
        start_ray(address, num_cpus, env_vars)
        warm_up_workers(environment)

    # Ray's serializers (on the thread, once the warm-up exports its function) and Prefect (in
    # the caller's imports meanwhile) both import pydantic.v1. Its modules import each other, and
    # a thread that enters that cycle while another is inside it gets a half-initialised module:
    # "cannot import name 'Field' from partially initialized module 'pydantic.v1.fields'" failed
    # a run once. Imported here first, it is whole before either thread asks for it.
    import pydantic.v1.fields  # noqa: F401

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ray-start") as thread:
        started = thread.submit(start)

        def wait_for_ray() -> None:
            started.result()
            rearm_signal_handlers()

        try:
            yield wait_for_ray
        finally:
            with contextlib.suppress(Exception):
                started.result()  # never shut down under a start still in flight
            stop_ray()


def stop_ray() -> None:
    """Stop this process's Ray once no step's wait is inside it (`waits_ended`),
    and wait for its processes to exit (else it stops waiting for a slow one after about 2 s).
    Ray's driver takes its SIGTERM handler with it, leaving the signal's default (the process
    killed outright), so the Python handlers are set again (`rearm_signal_handlers`)."""
    import ray

    with waits_ended():
        ray.shutdown(wait_for_processes=True)
    rearm_signal_handlers()


def warm_up_workers(environment: str) -> list:
    """Start one worker per CPU and load what tasks need (Prefect, the environment, the game
    tree where there is one) in each. A warm-up that fails costs nothing but its time: nobody
    waits for it, and the run's own first use of the environment reports the error.

    Returns Ray object refs; the workers warm up while the Prefect server boots and the flow
    starts, and the first tasks queue behind the warm-up.
    """
    import ray

    @ray.remote(num_cpus=1)
    def warm_up(game_string: str) -> None:
        import tasks  # noqa: F401  (imports Prefect, marl_core)
        from marl_core.empirical_game.game import psro_game
        from marl_core.games.tree import build_tree

        if psro_game(game_string).has_tree:  # makes the environment once on the way
            build_tree(game_string)
        time.sleep(0.3)  # hold the CPU so the next warm-up lands on another worker

    return [warm_up.remote(environment) for _ in range(int(ray.cluster_resources().get("CPU", 1)))]


# --- waits on Ray's tasks ------------------------------------------------------------------

WAIT_SLICE = 1.0  # seconds a wait on a task blocks in Ray before it looks whether Ray still runs


class _Waits:
    """The steps' waits on their tasks that are under way in this process, and whether Ray is
    about to stop: see `waits_ended`."""

    def __init__(self):
        self.changed = threading.Condition()
        self.under_way = 0
        self.stopping = False


_WAITS = _Waits()


@contextlib.contextmanager
def waits_ended(timeout: float = 3 * WAIT_SLICE) -> Iterator[None]:
    """Around `ray.shutdown()`: every wait of a step on its task (on a subflow's thread) leaves
    Ray first, within one slice, and ends with an error instead of slicing on. A wait still inside
    `ray.wait` while Ray stopped under it could block there for ever, and the process with it."""
    with _WAITS.changed:
        _WAITS.stopping = True
        _WAITS.changed.wait_for(lambda: _WAITS.under_way == 0, timeout)
    try:
        yield
    finally:
        with _WAITS.changed:
            _WAITS.stopping = False


def result_unless_ray_stops(future):
    """A Prefect future's result (a task on Ray), waited for in short slices: a wait that began
    before the run stopped Ray (Ctrl-C, SIGTERM) ends then, where one `ray.get` would block for
    ever; and it is never inside Ray while Ray stops (`waits_ended`)."""
    import ray

    while True:
        with _WAITS.changed:
            if _WAITS.stopping or not ray.is_initialized():
                raise RuntimeError("Ray stopped while this step waited for its task")
            _WAITS.under_way += 1
        try:
            return future.result(timeout=WAIT_SLICE)
        except TimeoutError:
            continue
        finally:
            with _WAITS.changed:
                _WAITS.under_way -= 1
                _WAITS.changed.notify_all()
