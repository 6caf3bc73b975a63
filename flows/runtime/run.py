"""The one scenario runtime: every scenario's run, from checked settings to its last commit.

A scenario (`flows.runtime.scenario.Scenario`) declares what is its own; this module does the rest, the
same way for all of them (`flows.deployments.entrypoints` wraps these bodies in each scenario's flows):

- the top-level flow (`run_flow`) checks the settings (`flows.services.preflight`) unless the command did, finds what it
  resumes (a run id, or, when Prefect retries a crashed flow run, the MLflow run its earlier
  attempt committed to), starts Ray where a deployment's run has none, opens the scenario's
  actors, shows their progress, and tracks the run (`flows.tracking.scenario_tracker`);
- every step is a subflow "{scenario}-{step}" whose tasks run on Ray; the next step's subflow
  is started while the current one works, so creating it and proposing its states (round trips
  to the Prefect server) overlap the work. Its body waits for the state it starts from, handed
  over in this process (`Handoff`): Prefect records a subflow's parameters on its server, and a
  population or a learner's state is no parameter to send there.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from flows.runtime import stopping
from flows.runtime.scenario import Scenario

Observer = Callable[[Any, Any], None]  # called with (record, state) after each step


class Handoff:
    """Hands a step's subflow the state it starts from, and its result back, in this process.

    `inbox` resolves to (config, session, state), or to None when the run stopped before the
    step; `outbox` resolves to the step's `Step` as soon as its work is done, before Prefect has
    finished recording the subflow. The subflow gets the handoff's key, not the handoff: Prefect
    copies a flow's parameters into every task's context, and futures do not pickle.
    """

    _open: dict[str, Handoff] = {}

    def __init__(self):
        self.inbox: Future = Future()
        self.outbox: Future = Future()
        self.key = uuid.uuid4().hex
        Handoff._open[self.key] = self

    @classmethod
    def take(cls, key: str) -> Handoff:
        return cls._open.pop(key)


@dataclasses.dataclass(frozen=True)
class Resumed:
    """What a run continues from: its MLflow run, the last step it committed, that step's state."""

    run_id: str
    step: int
    state: Any


def run_flow(scenario: Scenario, step_flow, config, resume_run_id: str | None, observer: Observer | None, progress):
    """The body of every scenario's top-level flow; `step_flow` is its step's subflow. A run
    whose Ray workers or nodes are lost under it goes on from its last commit, in the same flow
    run and MLflow run (`lost_ray_worker`); one that loses the Ray head it joined stops its
    command (`flows.runtime.stopping.watching_ray_head`)."""
    from prefect.runtime import flow_run

    from flows.services.preflight import preflight

    if isinstance(config, dict):  # a deployment's run: checked here, before any work
        config = scenario.build_config(config)
        preflight(scenario.settings(config))
    settings = scenario.settings(config)
    if flow_run.run_count > 1:  # a retry: the earlier attempt's process is gone
        _end_steps_left_running(flow_run.id)
        resume_run_id = resume_run_id or _earlier_attempt(scenario, settings, str(flow_run.id))
    started = time.perf_counter()
    with stopping.watching_ray_head(settings.ray_address):
        state, record = _tries(scenario, step_flow, config, settings, resume_run_id, observer, progress)
    if settings.export:
        scenario.export(config, state, record, time.perf_counter() - started)
    return state


def _tries(scenario: Scenario, step_flow, config, settings, resume_run_id: str | None, observer, progress):
    """The run's tries (`_attempt`): one, or more where its Ray workers or nodes were lost under
    it, each from the last commit. Returns the last state and record."""
    from prefect import get_run_logger

    failed, committed_before = 0, None  # tries lost since the last new commit, and that commit
    while True:
        resumed = load_resumed(scenario, config, settings.tracking_uri, resume_run_id) if resume_run_id else None
        trackers: list = []
        try:
            state, record = _attempt(scenario, step_flow, config, resumed, observer, progress, trackers)
            break
        except Exception as error:
            lost = lost_ray_worker(error)
            if lost is None:
                raise
            committed = resumed.step if resumed else None
            if trackers:  # the try opened its MLflow run: the next goes on from its last commit
                committed = trackers[0].committed
                resume_run_id = trackers[0].run_id if committed is not None else None
            failed = 1 if committed != committed_before else failed + 1
            committed_before = committed
            if failed >= NODE_LOSS_TRIES:
                raise
            going_on = (
                f"going on from {scenario.step_noun} {committed}'s commit to MLflow run {resume_run_id}"
                if resume_run_id
                else "starting again: nothing was committed"
            )
            get_run_logger().warning(
                f"lost a Ray worker or node ({type(lost).__name__}); {going_on} in {NODE_LOSS_PAUSE_S:.0f} s "
                f"(try {failed + 1} of {NODE_LOSS_TRIES} from that commit)"
            )
            time.sleep(NODE_LOSS_PAUSE_S)
    return state, record


NODE_LOSS_TRIES = 3  # tries from one commit of a run whose Ray workers or nodes are lost under it
# Ray marks a lost node dead only once it has missed its health checks (seconds after its
# actors stop answering); actors a try placed on it before then would be lost with it.
NODE_LOSS_PAUSE_S = 30.0


def lost_ray_worker(error: BaseException) -> BaseException | None:
    """The Ray failure in `error`'s chain that a lost node or a killed worker process raises (an
    actor gone with its node, its objects lost), or None: everything the run's actors held since
    the last commit is gone, and the run goes on from that commit as `psro resume` would. A lost
    connection to Ray itself (its head) is not one: the run stops and says how to resume."""
    import ray.exceptions

    from marl_core.rollout.pool import ray_losses

    kinds = (*ray_losses(), ray.exceptions.NodeDiedError)  # the tasks' retries see the same losses
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, kinds):  # an actor whose constructor raised is a bug, not a loss
            return None if getattr(error, "actor_init_failed", False) else error
        error = getattr(error, "cause", None) or error.__cause__ or error.__context__
    return None


def _attempt(scenario: Scenario, step_flow, config, resumed, observer, progress, trackers: list):
    """One try of the run, from `resumed` (or the start): its actors opened, its steps run and
    committed. Returns the last state and record; `trackers` gets the run's tracker as it opens."""
    from prefect import get_run_logger
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.runtime.progress import PlainLines, plain_interval, watching
    from flows.tracking.layout import FLOW_RUN_TAG, SCENARIO_TAG

    settings = scenario.settings(config)
    state = resumed.state if resumed else scenario.initial_state(config)
    with contextlib.ExitStack() as stack:
        # Heartbeats add seconds to every subflow (docs/performance.md); however the flow was
        # started (CLI, `psro serve`, a work-pool worker), its steps run without them.
        stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        _join_ray(settings, stack)
        steps = scenario.steps(config, resumed.step if resumed else None)
        session = scenario.open(config, state, steps, stack)
        read = getattr(session, "progress", None)
        if read is not None:
            stack.enter_context(watching(read, progress or PlainLines(get_run_logger().info, plain_interval())))
        tags = {FLOW_RUN_TAG: str(flow_run.id), SCENARIO_TAG: scenario.name}
        tracker = stack.enter_context(scenario.tracker(config, resumed, tags))
        trackers.append(tracker)
        stopping.follow(tracker)
        tracker.begin(state)
        state, record = _run_steps(scenario, step_flow, config, session, state, steps, tracker, observer)
        tracker.finish(state)
    return state, record


def _join_ray(settings, stack: contextlib.ExitStack) -> None:
    """A deployment's run starts Ray here, one session for all its steps; a command-line run
    has one already (`flows.services.run_services.run_services`)."""
    import ray

    from flows.services.ray_session import ray_session, ray_to_use
    from flows.services.reaper import reap_on_crash

    if ray.is_initialized():
        return
    stack.enter_context(reap_on_crash())
    api_url = os.environ.get("PREFECT_API_URL")
    address, worker_env = ray_to_use(settings.ray_address, api_url) if api_url else (settings.ray_address, {})
    stack.enter_context(ray_session(address, settings.num_cpus, worker_env))


def _run_steps(scenario: Scenario, step_flow, config, session, state, steps: range, tracker, observer: Observer | None):
    """Every step still to run, in order, each next subflow started while this one works. The
    work stays strictly sequential: a step's body waits for the state the previous one handed
    on. Returns the last state and the last step's record (None when nothing was left)."""
    from prefect.exceptions import CancelledRun

    from flows.services.run_services import finish_before_prefect_stops

    indices = iter(steps)
    index = next(indices, None)
    if index is None:
        return state, None

    def start(index: int) -> tuple[int, Handoff, Future]:
        handoff = Handoff()
        name = f"{scenario.name}-{scenario.step_noun}-{index}"
        return index, handoff, _on_daemon_thread(name, _own_client_context().run, step_flow, index, handoff.key)

    record, upcoming = None, None
    current = start(index)
    current[1].inbox.set_result((config, session, state))
    try:
        while True:
            following = next(indices, None)
            upcoming = start(following) if following is not None else None
            index, handoff, running = current
            wait([handoff.outbox, running], return_when=FIRST_COMPLETED)
            if not handoff.outbox.done():
                running.result()  # the subflow failed before its work began: raise why
            step = scenario.between(config, session, handoff.outbox.result())
            stop = scenario.should_stop(config, session, step.record)
            committed = scenario.checkpoint(config, session, index, step)  # before the next step changes it
            if upcoming:
                upcoming[1].inbox.set_result(None if stop else (config, session, step.state))
            tracker.log_step(index, step.record, step.state, committed)
            if observer:
                observer(step.record, step.state)
            state, record = step.state, step.record
            running.result()
            if stop and upcoming:
                with contextlib.suppress(CancelledRun):
                    upcoming[2].result()
            if stop or not upcoming:
                break
            current = upcoming
    except BaseException:
        # Ctrl-C or a failed step. A subflow still working is not waited for here: stopping Ray
        # (the caller's next step) ends its work, and the run's exit waits for it to record
        # that while the Prefect server still answers (see `finish_before_prefect_stops`).
        if upcoming and not upcoming[1].inbox.done():
            upcoming[1].inbox.set_result(None)
            wait([upcoming[2]], timeout=UPCOMING_TIMEOUT)  # it records its end while its client is open
        finish_before_prefect_stops(current[2], *(upcoming[2:] if upcoming else ()))
        raise
    return state, record


def _own_client_context() -> contextvars.Context:
    """This thread's context for a subflow's thread, less its Prefect API client: the subflow
    opens its own, which stays open until it has recorded its end. With the run's client, a
    subflow still ending when the run stopped found it closed by the run's flow and failed to
    record its end."""
    from prefect.context import SyncClientContext

    context = contextvars.copy_context()
    context.run(SyncClientContext.__var__.set, None)
    return context


UPCOMING_TIMEOUT = 10.0  # seconds a stopping run gives the next step's subflow to record that it never began


def _on_daemon_thread(name: str, function, *args) -> Future:
    """`function(*args)` on a daemon thread: a step's subflow still blocked in Ray when the run
    stops is waited for a while (`flows.services.run_services.finish_before_prefect_stops`), but never keeps
    the process from exiting, as the threads of an executor, which the interpreter joins, would."""
    future: Future = Future()

    def body() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(function(*args))
        except BaseException as error:
            future.set_exception(error)

    threading.Thread(target=body, name=name, daemon=True).start()
    return future


def run_step(scenario: Scenario, index: int, handoff: str):
    """The body of a step's subflow: the step, from the state its handoff brings."""
    from prefect.states import Cancelled

    taken = Handoff.take(handoff)
    given = taken.inbox.result()
    if given is None:
        return Cancelled(message=f"the run stopped before this {scenario.step_noun}")
    config, session, state = given
    try:
        taken.outbox.set_result(scenario.step(config, session, state, index))
    except BaseException as error:
        taken.outbox.set_exception(error)
        raise


# --- resuming ---------------------------------------------------------------------------------


def _end_steps_left_running(flow_run_id) -> None:
    """Mark Crashed the step subflows an earlier attempt of this flow run left unfinished: its
    process died under them, so nothing else will ever end them, and Prefect's UI would show them
    running beside the retry's own."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    final = [StateType.COMPLETED, StateType.FAILED, StateType.CANCELLED, StateType.CRASHED]
    unfinished = FlowRunFilter(
        parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]),
        state=FlowRunFilterState(type=FlowRunFilterStateType(not_any_=final)),
    )
    with get_client(sync_client=True) as client:
        for step in client.read_flow_runs(flow_run_filter=unfinished):
            message = "the process of an earlier attempt of its flow run died while it ran"
            client.set_flow_run_state(step.id, Crashed(message=message), force=True)


def load_resumed(scenario: Scenario, config, tracking_uri: str, run_id: str) -> Resumed:
    from flows.tracking.resume import committed_step, open_client

    client = open_client(tracking_uri)
    committed = committed_step(client, run_id, scenario)
    return Resumed(run_id, committed, scenario.load(config, client, run_id, committed))


def resume_values(scenario: Scenario, tracking_uri: str, run_id: str) -> tuple[dict, int]:
    """The settings run `run_id` was started with and the last step it committed; it must be one
    of the scenario's runs that committed a step (a one-line ResumeError otherwise)."""
    from flows.tracking.resume import committed_step, logged_config, open_client

    client = open_client(tracking_uri)
    committed = committed_step(client, run_id, scenario)
    return logged_config(client, run_id), committed


def _earlier_attempt(scenario: Scenario, settings, flow_run_id: str) -> str | None:
    """The MLflow run that an earlier attempt of this flow run committed to, when this is a retry.

    Prefect's UI retries a crashed or failed run (a killed worker process, a lost node) by
    scheduling the same flow run again, state "AwaitingRetry", and a worker or `psro serve` runs
    it again with the same parameters and a higher run count. It continues the MLflow run it
    created, as `psro resume` would, instead of starting another.
    """
    from flows.tracking.layout import FLOW_RUN_TAG
    from flows.tracking.resume import find_tagged

    return find_tagged(settings.tracking_uri, settings.experiment, FLOW_RUN_TAG, flow_run_id, scenario.commit_tag)
