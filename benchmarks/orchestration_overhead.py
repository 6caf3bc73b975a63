"""Where an orchestrated PSRO iteration spends its time: the work, and everything around it.

The same PSRO run (exact oracle, `nash`) is run twice in one process:

1. the in-process loop (`marl_core.psro.steps.iterate_psro_local`): the floor, pure computation, whose
   per-stage seconds are the compute time of each stage;
2. `psro run`'s path (`flows.deployments.entrypoints.run_scenario`): Prefect server, Ray, MLflow, one Prefect
   subflow per iteration whose tasks run on Ray.

Both compute the same iterations (tests/test_flow_matches_local.py), so for each iteration the
flow's time minus the loop's is the orchestration around the work. The flow's time is split
by instrumenting the driver only (nothing in the product changes for the benchmark):

- ``flow``: wall seconds between two iterations' results reaching the driver (the critical path);
- ``start``, ``waited``, ``finish``: Prefect's flow engine starting the iteration's subflow
  (creating the run, proposing Running), the started subflow waiting for the previous
  iteration's state, and the engine finishing it; the next subflow starts while the current one
  works, so a ``waited`` above zero means its start cost nothing on the critical path;
- ``api``, ``calls``: time in, and number of, HTTP calls to the Prefect server from that
  iteration's subflow thread;
- ``submit``: handing the iteration's tasks to the task runner (context and argument pickling);
- per stage, the wait for that stage's results minus the stage's compute time: Ray scheduling,
  argument transfer and Prefect's task engine on the worker;
- ``mlflow``: the driver's share of MLflow logging (snapshots handed to the tracking thread);
- ``gap``: ``flow`` minus the iteration's own work: the handoff between two iterations.

Start-up (server, Ray, MLflow store, first iteration) is printed on its own.

    python benchmarks/orchestration_overhead.py [--game leduc_poker] [--iterations 40] [--oracle ppo --episodes 20000]

With a learned oracle the in-process loop plays its rollout workers one after the other and
the flow in parallel, so the per-stage columns mix orchestration with that difference.

Time it only on a quiet machine: the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import threading
import time

STAGES = ("best_response", "evaluate", "meta_solve", "exploitability")


class DriverProbe:
    """Timestamps and HTTP time of the driver, grouped by the iteration whose thread spent them."""

    def __init__(self):
        self.api_seconds = collections.defaultdict(float)
        self.api_calls = collections.Counter()
        self.submit_seconds = collections.defaultdict(float)
        self.mlflow_seconds = collections.defaultdict(float)
        self.call = {}  # iteration -> subflow called, body entered, work began, work ended, call returned
        self.local = threading.local()

    def iteration(self) -> int:
        return getattr(self.local, "iteration", -1)

    def install(self) -> None:
        import httpx
        from prefect.tasks import Task

        import flows.deployments.entrypoints as entrypoints
        import flows.runtime.run as runtime
        from flows.tracking.psro_tracker import PSROTracker
        from marl_core.psro.steps import IterationRecord, StageClock

        probe = self

        def timed(accumulate, fn):
            def wrapper(*args, **kwargs):
                began = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    accumulate[probe.iteration()] += time.perf_counter() - began

            return wrapper

        send = httpx.Client.send

        def counted_send(self, request, *args, **kwargs):
            probe.api_calls[probe.iteration()] += 1
            return send(self, request, *args, **kwargs)

        httpx.Client.send = timed(self.api_seconds, counted_send)
        Task.submit = timed(self.submit_seconds, Task.submit)

        def log_step(tracker, index, record, state, committed, _log=PSROTracker.log_step):
            began = time.perf_counter()
            _log(tracker, index, record, state, committed)
            self.mlflow_seconds[record.iteration] += time.perf_counter() - began

        PSROTracker.log_step = log_step

        def stamp(iteration: int, event: str) -> None:
            self.call.setdefault(iteration, {})[event] = time.perf_counter()

        # Patched on classes only: Prefect pickles the iteration flow's function, with the
        # module globals it names, into every task, and the probe does not pickle.
        take, clock_init, record_init = runtime.Handoff.take, StageClock.__init__, IterationRecord.__init__

        def timed_take(key):
            stamp(probe.iteration(), "entered")  # the body's first step
            return take(key)

        def timed_clock_init(clock):
            stamp(probe.iteration(), "began")  # the work's first step
            clock_init(clock)

        def timed_record_init(record, *args, **kwargs):
            record_init(record, *args, **kwargs)
            stamp(probe.iteration(), "ended")  # the work's last step: its record

        runtime.Handoff.take = staticmethod(timed_take)
        StageClock.__init__ = timed_clock_init
        IterationRecord.__init__ = timed_record_init
        subflow = type(entrypoints.psro_iteration).__call__

        def timed_call(flow_self, *args, **kwargs):
            if flow_self is not entrypoints.psro_iteration:
                return subflow(flow_self, *args, **kwargs)
            iteration = args[0]
            self.local.iteration = iteration
            stamp(iteration, "called")
            try:
                return subflow(flow_self, *args, **kwargs)
            finally:
                stamp(iteration, "returned")

        type(entrypoints.psro_iteration).__call__ = timed_call


def psro_config(args, **settings):
    """The run both paths make: exact, or a learned oracle with `--episodes` per best response."""
    from marl_core.psro.config import PSROConfig

    learned = (
        {}
        if args.oracle == "exact"
        else dict(
            best_response={"episodes": args.episodes, "episodes_per_round": min(1000, args.episodes)},
            eval="sampled",
            episodes=200,
        )
    )
    return PSROConfig(
        game=args.game, meta_solver="nash", oracle=args.oracle, iterations=args.iterations, **learned, **settings
    )


def run_local(args):
    from marl_core.psro.steps import iterate_psro_local

    config = psro_config(args)
    started = time.perf_counter()
    records = [record for record, _ in iterate_psro_local(config)]
    return records, time.perf_counter() - started


def run_flow(args, probe: DriverProbe):
    from flows.services.prefect_server import prefect_api

    records, seen = [], []
    with tempfile.TemporaryDirectory() as tracking_dir:
        started = time.perf_counter()
        with prefect_api():
            from flows.deployments.entrypoints import run_scenario
            from flows.scenarios.psro import PSRO

            probe.install()
            config = psro_config(args, tracking_uri=f"sqlite:///{tracking_dir}/mlflow.db")
            run_scenario(
                PSRO, config, observer=lambda record, state: (records.append(record), seen.append(time.perf_counter()))
            )
    return records, seen, started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default="leduc_poker")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument(
        "--oracle",
        default="exact",
        help="exact, or a learned oracle (each best response is one train-best-response task)",
    )
    parser.add_argument("--episodes", type=int, default=2000, help="training episodes per learned best response")
    parser.add_argument("--show", type=int, default=8, help="per-iteration rows to print")
    args = parser.parse_args()

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs", flush=True)
    local, local_seconds = run_local(args)
    probe = DriverProbe()
    flow, seen, started = run_flow(args, probe)

    rows = []
    for record, work, returned_at in zip(flow, local, seen):
        i = record.iteration
        t = probe.call[i]
        row = {
            "compute": work.iteration_seconds,
            "flow": returned_at - (seen[i - 1] if i else t["began"]),
            "start": t["entered"] - t["called"],
            "waited": t["began"] - t["entered"],
            "finish": t["returned"] - t["ended"],
            "api": probe.api_seconds[i],
            "calls": probe.api_calls[i],
            "submit": probe.submit_seconds[i],
            "mlflow": probe.mlflow_seconds[i],
        }
        for stage in STAGES:
            row[stage] = record.stage_seconds.get(stage, 0.0) - work.stage_seconds.get(stage, 0.0)
        row["gap"] = row["flow"] - (t["ended"] - t["began"])
        rows.append(row)

    columns = ["compute", "flow", "start", "waited", "finish", "api", "calls", "submit", *STAGES, "mlflow", "gap"]
    print(
        f"\n{args.game}, oracle {args.oracle}: seconds per iteration "
        "(stage columns: flow's stage time minus its compute time)"
    )
    print(" iter " + " ".join(f"{c[:10]:>10}" for c in columns))

    def line(label, row):
        return f"{label:>5} " + " ".join(f"{row[c]:10.0f}" if c == "calls" else f"{row[c]:10.4f}" for c in columns)

    for i, row in enumerate(rows):
        if i < args.show or i == len(rows) - 1:
            print(line(str(i), row))
    steady = rows[1:] or rows
    print(line("mean", {c: statistics.fmean(r[c] for r in steady) for c in columns}) + "   (iterations 1..)")
    overhead = statistics.fmean(r["flow"] - r["compute"] for r in steady)
    flow_mean = statistics.fmean(r["flow"] for r in steady)
    print(f"\nin-process loop: {local_seconds:.2f} s for {len(local)} iterations")
    print(
        f"flow: first iteration done {seen[0] - started:.2f} s after the start (server, Ray, MLflow, iteration 0); "
        f"{seen[-1] - started:.2f} s for {len(flow)} iterations"
    )
    print(
        f"orchestration per iteration (flow minus compute): {overhead:.4f} s, "
        f"{overhead / flow_mean:.1%} of the flow's iteration"
    )
    best_response = statistics.fmean(r["best_response"] for r in steady)
    print(
        f"best-response stage (its tasks' scheduling, transfer and Prefect engine): {best_response:.4f} s, "
        f"{best_response / flow_mean:.1%} of the flow's iteration"
    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
