"""The services one run needs (Prefect's API, Ray, the MLflow store), started together for every
scenario and stopped in order: Ray, then the flow threads still working, then the Prefect server.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

from flows.services.prefect_server import prefect_api
from flows.services.ray_session import ray_in_background, ray_to_use
from flows.services.reaper import reap_on_crash

_stragglers: list = []  # futures of flow threads that must end before the Prefect API stops
STRAGGLER_TIMEOUT = 60.0


def finish_before_prefect_stops(*futures) -> None:
    """Have the run's exit wait for these threads (a subflow that was still working when the run
    failed) after Ray stops, which ends their work, and before the Prefect API stops.

    A subflow records its end through the API. Left for after the server stopped, its thread
    retries each request for a minute, several requests in a row: the interpreter, which joins
    such threads at exit, then hung for minutes after the run had failed.
    """
    _stragglers.extend(futures)


@contextlib.contextmanager
def stragglers_finished() -> Iterator[None]:
    from concurrent.futures import wait

    try:
        yield
    finally:
        pending = list(_stragglers)
        _stragglers.clear()
        wait(pending, timeout=STRAGGLER_TIMEOUT)


@dataclasses.dataclass(frozen=True)
class StartingServices:
    """The Prefect API and Ray of a run, both still starting; ``joined_ray`` is the address of a
    running `psro server`'s Ray the run joins, else None."""

    prefect_api_url: str
    wait_for_prefect: Callable[[], None]
    wait_for_ray: Callable[[], None]
    joined_ray: str | None

    @property
    def ui_line(self) -> str:
        reuse = f" (the running psro server's; Ray at {self.joined_ray})" if self.joined_ray else ""
        return f"Prefect UI during the run: {self.prefect_api_url.removesuffix('/api')}{reuse}"


@contextlib.contextmanager
def services_starting(ray_address: str | None, num_cpus: int | None, environment: str) -> Iterator[StartingServices]:
    """Start a run's Prefect API and Ray in the background (Ray's workers warming up on
    ``environment``), for every scenario's command: it goes on with its slow imports meanwhile,
    and everything stops on exit, a crash included."""
    with reap_on_crash(), prefect_api() as (api_url, wait_for_prefect), stragglers_finished():
        address, worker_env = ray_to_use(ray_address, api_url)
        with ray_in_background(address, num_cpus, worker_env, environment) as wait_for_ray:
            yield StartingServices(api_url, wait_for_prefect, wait_for_ray, None if worker_env else address)


@contextlib.contextmanager
def run_services(
    ray_address: str | None,
    num_cpus: int | None,
    environment: str,
    tracking_uri: str,
    services: StartingServices | None = None,
) -> Iterator[None]:
    """Everything a scenario's run needs, up and waited for: the Prefect API, Ray and the MLflow
    store, started in parallel (the server boots in its own process, Ray starts and warms its
    workers on a thread, the store is prepared on another), or ``services`` where the caller
    began them before its own slow imports (`services_starting`). Stopped on exit."""
    from concurrent.futures import ThreadPoolExecutor

    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.tracking.scenario_tracker import prepare_store

    with contextlib.ExitStack() as stack:
        if services is None:
            services = stack.enter_context(services_starting(ray_address, num_cpus, environment))
        # the outer run's heartbeat too (the scenarios' flows turn off only their subflows'): a run has its terminal
        stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        store = stack.enter_context(ThreadPoolExecutor(max_workers=1)).submit(prepare_store, tracking_uri)
        services.wait_for_prefect()
        store.result()
        services.wait_for_ray()
        yield
