"""SIGTERM stops a run the way Ctrl-C does (`flows.services.run_services.stop_on_sigterm`), even while its main
thread waits on Ray, where a scenario's driver spends most of its time (`ray.get` on a round's or
generation's tasks), and leaves it resumable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes import assert_all_exited, mlflow_store, prefect_home, wait_until

WAITS_ON_RAY = """
import sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import ray
from prefect import flow_engine
from flows.services.patches import driver_keeps_sigterm
from flows.services.ray_session import rearm_sigterm_handler
from flows.services.run_services import stop_on_sigterm
from processes import start_bare_ray

# as a run's driver does: Ray starts on a thread that lives on (Ray's processes die with it), flows run here
with stop_on_sigterm(), ThreadPoolExecutor(1) as thread:
    thread.submit(start_bare_ray, Path(sys.argv[1])).result()
    try:
        rearm_sigterm_handler()
        driver_keeps_sigterm()
        with flow_engine.capture_sigterm():  # what the engine wraps every flow run in
            sleeper = ray.remote(lambda: time.sleep(300)).remote()
            print("waiting", flush=True)
            ray.get(sleeper)
    finally:
        ray.shutdown()
        print("shut down", flush=True)
"""


def test_sigterm_ends_a_wait_on_ray_unwinds_and_exits_143(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("ray")  # short: Ray's socket paths must fit in 107 characters
    marker = f"SIGTERM_TEST={tmp_path}"
    env = {**os.environ, "SIGTERM_TEST": str(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-c", WAITS_ON_RAY, str(tmp_path), str(Path(__file__).parent)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout.readline() == "waiting\n", process.stderr.read()[-3000:]
        process.send_signal(signal.SIGTERM)
        code = wait_until(lambda: process.poll() is not None and [process.returncode], 60, "the process to exit")[0]
        rest = process.stdout.read()
        assert code == 143 and "shut down" in rest, (code, rest, process.stderr.read()[-3000:])
        assert_all_exited(marker)  # Ray's processes too
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


MARL_RUN = """\
env: pettingzoo:mpe2.simple_spread_v3
algorithm: ippo
settings: {{ppo: {{hidden: [16]}}}}
rounds: 100
steps_per_round: 25
envs_per_worker: 2
eval_every: 100
checkpoint_every: 1
num_cpus: 2
tracking_uri: {store}
"""


@pytest.mark.slow
def test_sigterm_stops_a_marl_run_as_ctrl_c_does_and_leaves_its_commits(tmp_path):
    """Between rounds and inside them the driver waits on Ray, where Prefect's own SIGTERM
    handler did not end the wait (flows/services/patches.py, `driver_keeps_sigterm`); and Ray's
    failure handler, under Python's, ended the process by SIGABRT."""
    import mlflow

    from flows.tracking import layout

    store = mlflow_store(tmp_path)
    (tmp_path / "run.yaml").write_text(MARL_RUN.format(store=store))
    home = prefect_home(tmp_path / "prefect-home")
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_", "MARL_"))
    }
    output = tmp_path / "output.txt"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("psro")), "marl", "run", "--config", "run.yaml"],
            cwd=tmp_path,
            env={**env, "PREFECT_HOME": str(home)},
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: "round    1 " in output.read_text() or process.poll() is not None, 300, "round 1")
        assert process.poll() is None, output.read_text()[-3000:]
        process.send_signal(signal.SIGTERM)
        # the round at work when Ray stops ends at once (its wait on its task looks whether Ray
        # still runs), well before STRAGGLER_TIMEOUT, the longest the run's exit waits for it;
        # its wait once blocked in Ray for ever, and the process never exited
        from flows.services.run_services import STRAGGLER_TIMEOUT

        code = wait_until(
            lambda: process.poll() is not None and [process.returncode], STRAGGLER_TIMEOUT / 2, "the run to stop"
        )[0]
        printed = output.read_text()
        assert code == 143 and "SIGTERM received" not in printed, printed[-3000:]
        assert_all_exited(f"PREFECT_HOME={home}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    client = mlflow.MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("marl").experiment_id])
    assert (
        run.info.status == "FAILED" and int(run.data.tags[layout.MARL_COMMITTED_TAG]) >= 1
    )  # `psro marl resume` goes on from it


def test_ray_stops_only_once_no_steps_wait_is_inside_it(monkeypatch):
    """A run that stops (Ctrl-C, SIGTERM) shuts Ray down while its steps' subflow threads may
    still wait on their tasks: `flows.services.ray_session.stop_ray` lets each wait leave Ray first (within
    one slice), and the waits then end with an error instead of going back in. A wait inside
    `ray.wait` when Ray stopped under it once blocked there, and the process never exited."""
    import threading
    import time

    from flows.runtime import task_steps
    from flows.services import ray_session

    monkeypatch.setattr("ray.is_initialized", lambda: True)  # Ray "runs" throughout
    inside, release = threading.Event(), threading.Event()

    class TaskStillRunning:  # a step's task: each slice of the wait blocks until released
        def result(self, timeout):
            inside.set()
            release.wait(timeout)
            raise TimeoutError

    ended: dict = {}

    def step_waits():
        try:
            task_steps.RayTaskSteps({}).result(TaskStillRunning())
        except RuntimeError as error:
            ended["wait"] = (time.monotonic(), str(error))

    def ray_stops():
        with ray_session.waits_ended(timeout=30):
            ended["shutdown"] = time.monotonic()

    waiting = threading.Thread(target=step_waits)
    waiting.start()
    assert inside.wait(10)
    stopping = threading.Thread(target=ray_stops)
    stopping.start()
    time.sleep(0.3)  # the stop has begun while the wait is inside its slice
    released = time.monotonic()
    release.set()
    stopping.join(10)
    waiting.join(10)
    assert ended["shutdown"] >= released  # Ray stopped only after the wait had left it
    assert ended["wait"][1] == "Ray stopped while this step waited for its task"
    assert not ray_session._WAITS.stopping  # the next run's waits are not refused
