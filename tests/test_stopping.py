"""A run's command stops like a tool: Ctrl-C or SIGTERM, one line, the exact command that goes on.

`flows.runtime.stopping` handles both signals for every scenario's `run` and `resume`: the run
unwinds (commits queued by then written, the MLflow run marked failed, Ray and the run's Prefect
server stopped), the command prints which step was committed last and the command that
continues the run, and exits 130 (SIGINT) or 143 (SIGTERM); nothing the libraries say about the
stop reaches the terminal.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from processes import assert_all_exited, mlflow_store, prefect_home, start_psro_server, wait_until
from small_runs import SMALL_CFR

from flows.runtime.stopping import CommandStop

TESTS = Path(__file__).resolve().parent
PSRO_COMMAND = str(Path(sys.executable).with_name("psro"))


# --- the line ------------------------------------------------------------------------------------


class _Tracker:  # what the line reads of a `ScenarioTracker`
    def __init__(self, run_id, committed):
        self.run_id, self.committed = run_id, committed


def test_the_line_names_the_last_commit_and_the_command_that_continues_the_run():
    stop = CommandStop("round", "psro marl resume", "psro marl run --config run.yaml")
    assert stop.line() == "stopped before the run began; start it again with: psro marl run --config run.yaml"
    stop.tracker = _Tracker(None, None)  # its MLflow run not made yet
    assert stop.line() == "stopped before the run began; start it again with: psro marl run --config run.yaml"
    stop.tracker = _Tracker("abc", None)
    assert stop.line() == (
        "stopped before MLflow run abc committed any round; start it again with: psro marl run --config run.yaml"
    )
    stop.tracker, stop.tracking_uri = _Tracker("abc", 3), "sqlite:///mlflow.db"  # the default: no flag
    assert (
        stop.line() == "stopped: round 3 is the last committed to MLflow run abc; continue with: psro marl resume abc"
    )
    stop.tracking_uri = "sqlite:////tmp/my runs/mlflow.db"
    assert stop.line(kept_log="/tmp/psro-stop-x.log") == (
        "stopped: round 3 is the last committed to MLflow run abc; continue with: psro marl resume abc "
        "--tracking-uri 'sqlite:////tmp/my runs/mlflow.db' (the shutdown's log: /tmp/psro-stop-x.log)"
    )


def test_a_resume_stopped_before_its_tracker_opened_names_the_commit_it_started_from():
    stop = CommandStop("iteration", "psro resume", "psro resume abc", run_id="abc", committed=7)
    assert stop.line() == "stopped: iteration 7 is the last committed to MLflow run abc; continue with: psro resume abc"


INTERRUPTED_IN_A_DESTRUCTOR = """
import os, signal, sys, time
from rich.console import Console
from flows.runtime.stopping import CommandStop, stop_on_signals

class Collected:
    def __del__(self):  # the signal comes while a garbage collection runs this
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass

with stop_on_signals(CommandStop("step", "resume", "run"), Console()):
    Collected()
    time.sleep(10)
    print("went on", flush=True)
"""


def test_an_interrupt_that_python_ignored_in_a_destructor_is_raised_again():
    """Raised inside a `__del__` or a weakref callback, the handler's KeyboardInterrupt is
    ignored by Python ("Exception ignored in ..."), and the command goes on as if no signal had
    come (seen in the shutdown's log of a league run stopped by Ctrl-C); here it exits 0."""
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IN_A_DESTRUCTOR],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=TESTS.parent,
    )
    assert (done.returncode, done.stdout) == (130, "stopped before the run began; start it again with: run\n"), done


# --- a wait on Ray ---------------------------------------------------------------------------------

WAITS_ON_RAY = """
import sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import ray
from prefect import flow_engine
from rich.console import Console
from flows.runtime.stopping import CommandStop, stop_on_signals
from flows.services.patches import driver_keeps_sigterm
from flows.services.ray_session import rearm_signal_handlers
from processes import start_bare_ray

console = Console()
# as a run's driver does: Ray starts on a thread that lives on (Ray's processes die with it), flows run here
with stop_on_signals(CommandStop("step", "resume", "run"), console), ThreadPoolExecutor(1) as thread:
    thread.submit(start_bare_ray, Path(sys.argv[1])).result()
    try:
        rearm_signal_handlers()
        driver_keeps_sigterm()
        with flow_engine.capture_sigterm():  # what the engine wraps every flow run in
            sleeper = ray.remote(lambda: time.sleep(300)).remote()
            print("waiting", flush=True)  # before the signal, on standard output itself
            ray.get(sleeper)
    finally:
        ray.shutdown()
        console.print("shut down")
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_a_wait_on_ray_unwinds_and_exits_with_its_code(signum, tmp_path_factory):
    """The main thread of a driver may wait inside `ray.get`, where Ray runs the signal's
    handler; Prefect's own SIGTERM handler did not end that wait (flows/services/patches.py,
    `driver_keeps_sigterm`), and Ray's failure handler, under Python's, ended the process by
    SIGABRT (`rearm_signal_handlers`)."""
    tmp_path = tmp_path_factory.mktemp("ray")  # short: Ray's socket paths must fit in 107 characters
    env = {**os.environ, "SIGNAL_TEST": str(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-c", WAITS_ON_RAY, str(tmp_path), str(TESTS)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout.readline() == "waiting\n", process.stderr.read()[-3000:]
        process.send_signal(signum)
        code = wait_until(lambda: process.poll() is not None and [process.returncode], 60, "the process to exit")[0]
        rest, errors = process.stdout.read(), process.stderr.read()
        assert code == 128 + signum, (code, rest, errors[-3000:])
        assert rest.splitlines() == ["shut down", "stopped before the run began; start it again with: run"], rest
        # Ray's start-up notices came before the signal; what the shutdown said went to its log
        assert "Traceback" not in errors and "Error" not in errors, errors
        assert_all_exited(f"SIGNAL_TEST={tmp_path}")  # Ray's processes too
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_ray_stops_only_once_no_steps_wait_is_inside_it(monkeypatch):
    """A run that stops (Ctrl-C, SIGTERM) shuts Ray down while its steps' subflow threads may
    still wait on their tasks: `flows.services.ray_session.stop_ray` lets each wait leave Ray
    first (within one slice), and the waits then end with an error instead of going back in. A
    wait inside `ray.wait` when Ray stopped under it once blocked there, and the process never
    exited."""
    import threading

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


# --- every scenario's run, stopped and continued -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StoppedCase:
    command: list[str]  # after the program: the scenario's `run` and its own settings
    config: dict | None  # written to run.yaml and given as --config
    first: int  # the first step of a run
    last: int  # the last step


SPREAD = "pettingzoo:mpe2.simple_spread_v3"
MARL = {
    "env": SPREAD,
    "algorithm": "ippo",
    "settings": {"ppo": {"hidden": [16]}},
    "rounds": 6,
    "steps_per_round": 25,
    "envs_per_worker": 2,
    "eval_every": 6,
    "eval_episodes": 2,
    "checkpoint_every": 1,
}
CASES = {
    "psro": StoppedCase(["run", "--game", "kuhn_poker", "--iterations", "9"], None, 0, 9),
    "marl": StoppedCase(["marl", "run"], MARL, 0, 5),
    "league": StoppedCase(
        ["league", "run"],
        {
            "game": "kuhn_poker",
            "generations": 4,
            "episodes": 60,
            "episodes_per_round": 30,
            "eval_episodes": 20,
            "rollout": {"workers": 1, "envs_per_worker": 8},
            "league": {"main_agents": 1, "main_exploiters": 0, "league_exploiters": 0},
        },
        1,  # generation 0 is the league as seeded
        4,
    ),
    "pbt": StoppedCase(
        ["pbt", "run"],
        {
            "marl": {
                **MARL,
                "algorithm": "mappo",
                "rounds": 5,
                "eval_every": 5,
                "settings": {"epochs": 1, "minibatch_size": 50},
            },
            "population": 2,
            "pbt": {"perturbation_interval": 2, "hyperparam_mutations": {"lr": [1.0e-4, 1.0e-3]}},
        },
        0,
        4,
    ),
    # `psro run` on a file of another scenario: the stop line names that scenario's resume
    "cfr": StoppedCase(["run"], {"scenario": "cfr", **SMALL_CFR, "rounds": 16}, 0, 15),
    "toy": StoppedCase(["toy", "run", "--rounds", "20", "--seed", "3"], None, 0, 19),
}
STEP_DEADLINE = 600  # seconds until a step's line shows; see `Command.wait_for_step`
STEP_LINE = r"^\s*(?:iter|round|gen)\s+{}\s"  # a step's line, whatever the scenario calls it
STOP_LINE = re.compile(r"^stopped: (\w+) (\d+) is the last committed to MLflow run (\w+); continue with: (.+)$")


def test_every_registered_scenario_has_a_stopped_case():
    from flows.scenarios import SCENARIOS

    assert set(CASES) == {*SCENARIOS, "toy"}, "a scenario without a case here: give it one"


def _program(words: list[str]) -> list[str]:
    """What runs a printed command here: `psro` is the venv's; the toy's commands are
    `toy_command.py toy ...`, a test script run by this Python."""
    if words[0] == "psro":
        return [PSRO_COMMAND, *words[1:]]
    assert words[0] == "toy_command.py", words
    return [sys.executable, str(TESTS / "toy_command.py"), *words[1:]]


class Command:
    """A command started as a user starts it in a terminal: its own process group, its output
    (standard output and error together) read from a file."""

    def __init__(self, argv: list[str], work: Path, env: dict, name: str):
        self.output = work / f"{name}.txt"
        with self.output.open("w") as sink:
            self.process = subprocess.Popen(
                argv, cwd=work, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )

    def text(self) -> str:
        return self.output.read_text()

    def wait_for_step(self, index: int) -> None:
        """Until the step's line shows. The deadline allows for a loaded machine: a run's first
        step starts Ray workers that import torch and Prefect, and beside another module's runs
        on two cores that took over 300 s once in CI (PBT's first round)."""
        line = re.compile(STEP_LINE.format(index), re.M)
        try:
            wait_until(
                lambda: line.search(self.text()) or self.process.poll() is not None, STEP_DEADLINE, f"step {index}"
            )
        except AssertionError as late:
            os.killpg(self.process.pid, signal.SIGKILL)  # left running, it would slow the next case
            raise AssertionError(f"{late}; the command printed:\n{self.text()[-3000:]}") from None
        assert self.process.poll() is None, self.text()[-3000:]

    def signal(self, signum: int) -> None:
        """SIGINT to the whole group, as a terminal's Ctrl-C sends it; SIGTERM to the process,
        as `kill` does."""
        if signum == signal.SIGINT:
            os.killpg(self.process.pid, signum)
        else:
            self.process.send_signal(signum)

    def stop(self, signum: int, twice: bool = False) -> tuple[int, str]:
        """The exit code and the output after `signum`; `twice`: sent again once the shutdown
        has begun, which ends the process at once."""
        self.signal(signum)
        if twice:
            time.sleep(0.5)
            self.signal(signum)
        return self.finish(120)

    def finish(self, timeout: float) -> tuple[int, str]:
        try:
            return self.process.wait(timeout=timeout), self.text()
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)


def _stopped(stopped: tuple[int, str], signum: int, scenario, client, cut_short: bool = False) -> tuple[str, list[str]]:
    """The checks of a stopped command; the run's id and the command that continues it.
    `cut_short`: a second signal ended the shutdown, so the MLflow run was never marked failed
    and a commit under way as the line was written may have landed."""
    code, output = stopped
    assert code == 128 + signum, output[-3000:]
    # the toy's command prints how often it checked its settings, at its exit
    *_, last = [line for line in output.splitlines() if line.strip() and not line.startswith("preflight calls: ")]
    said = STOP_LINE.match(last)
    assert said and said.group(1) == scenario.step_noun, output[-3000:]
    assert "Traceback" not in output and "ERROR" not in output and "(raylet)" not in output, output[-3000:]
    _, committed, run_id, command = said.groups()
    run = client.get_run(run_id)
    if cut_short:
        assert int(run.data.tags[scenario.commit_tag]) >= int(committed)
    else:
        assert run.data.tags[scenario.commit_tag] == committed and run.info.status == "FAILED"
    return run_id, shlex.split(command)


@dataclasses.dataclass(frozen=True)
class Server:
    home: Path
    prefect_api_url: str
    ray_address: str
    pid: int

    @property
    def reused(self) -> str:
        """The line of a run that reuses this server."""
        return (
            f"Prefect UI during the run: {self.prefect_api_url.removesuffix('/api')} "
            f"(the running psro server's; Ray at {self.ray_address})"
        )


@pytest.fixture(scope="module")
def psro_server(tmp_path_factory):
    """One `psro server` (a Prefect server and Ray kept up) for the registered scenarios' runs,
    as a user's later runs reuse one: each run then costs its own work, not a Prefect server's
    and a Ray's start. The toy's runs start and stop their own, the default. SIGTERM stops the
    server and everything it started."""
    work = tmp_path_factory.mktemp("server")
    home = prefect_home(work / "prefect-home")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_"))}
    env["PREFECT_HOME"] = str(home)
    state = home / "psro-server.json"
    server = start_psro_server(
        [PSRO_COMMAND, "server", "--port", "0", "--num-cpus", "2"], work, env, work / "server.log", state.exists
    )
    try:
        assert server.poll() is None, (work / "server.log").read_text()
        yield Server(home, **json.loads(state.read_text()))
        assert server.poll() is None, "the runs must leave the server they reused running"
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 0
    assert not state.exists()
    assert_all_exited(f"PREFECT_HOME={home}")


@pytest.mark.end_to_end
def test_a_second_server_for_the_same_home_is_refused(psro_server):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_"))}
    second = subprocess.run(
        [PSRO_COMMAND, "server"], env={**env, "PREFECT_HOME": str(psro_server.home)}, capture_output=True, text=True
    )
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        f"error: a psro server already runs for {psro_server.home.resolve()} "
        f"(pid {psro_server.pid}, Prefect at {psro_server.prefect_api_url})"
    ]


@pytest.mark.end_to_end
@pytest.mark.timeout(3 * STEP_DEADLINE)  # two waits for a step and the finish, on a loaded machine
@pytest.mark.parametrize("name", list(CASES))
def test_a_stopped_run_says_how_to_go_on_and_goes_on_from_its_last_commit(name, tmp_path, request):
    """The run is stopped by SIGINT once its first step is shown (the toy's by a second Ctrl-C
    during the shutdown, which cuts it short); the command it printed is run as printed and
    stopped by SIGTERM once it shows a step of its own; run as printed again, it ends as an
    uninterrupted run ends. Every process a command started carries the case's marker in its
    environment, and none is left after each stop."""
    import mlflow
    from mlflow_reads import assert_each_metric_once, assert_each_version_once

    from flows.scenarios import SCENARIOS

    case = CASES[name]
    if name == "toy":
        from toy_scenario import TOY as scenario

        home = prefect_home(tmp_path / "prefect-home")
    else:
        scenario = SCENARIOS[name]
        server = request.getfixturevalue("psro_server")
        home = server.home
    store = mlflow_store(tmp_path)
    marker = f"STOPPED_CASE={tmp_path}"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_", "PSRO_"))}
    env.update(PREFECT_HOME=str(home), PYTHONPATH=str(TESTS), STOPPED_CASE=str(tmp_path))
    flags = ["--tracking-uri", store, "--num-cpus", "2"]
    if case.config is not None:
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(case.config))
        flags = ["--config", "run.yaml", *flags]
    client = mlflow.MlflowClient(tracking_uri=store)
    started = _program(["toy_command.py" if name == "toy" else "psro", *case.command, *flags])

    run = Command(started, tmp_path, env, "run")
    run.wait_for_step(case.first)
    if name != "toy":
        assert server.reused in run.text()
    twice = name == "toy"  # a second Ctrl-C cuts the shutdown short; what the run started is stopped all the same
    run_id, resume = _stopped(run.stop(signal.SIGINT, twice=twice), signal.SIGINT, scenario, client, cut_short=twice)
    assert_all_exited(marker)
    assert resume[-2:] == ["--tracking-uri", store] and run_id in resume
    if name != "toy":  # the server outlives the run: Prefect's UI shows its flow run crashed
        from processes import Prefect

        from flows.tracking.layout import FLOW_RUN_TAG

        flow_run = client.get_run(run_id).data.tags[FLOW_RUN_TAG]
        assert Prefect(server.prefect_api_url)("read_flow_run", flow_run).state.type.value == "CRASHED"
    if twice:  # cut short, the run is unfinished and committed all the same
        from toy_scenario import ToyConfig

        from flows.tracking.resume import find_resumable

        config = ToyConfig(rounds=case.last + 1, seed=3, tracking_uri=store)
        assert find_resumable(scenario, config) == run_id

    resumed = Command(_program(resume), tmp_path, env, "resume")
    resumed.wait_for_step(int(client.get_run(run_id).data.tags[scenario.commit_tag]) + 1)
    assert _stopped(resumed.stop(signal.SIGTERM), signal.SIGTERM, scenario, client) == (run_id, resume)
    assert_all_exited(marker)

    code, output = Command(_program(resume), tmp_path, env, "finish").finish(600)
    assert code == 0, output[-3000:]
    assert re.search(rf"^done: \d+ {scenario.steps_setting}\b", output, re.M), output
    finished = client.get_run(run_id)
    assert finished.info.status == "FINISHED" and finished.data.tags[scenario.commit_tag] == str(case.last)
    assert_each_metric_once(client, finished)
    assert_each_version_once(client, run_id)
    assert_all_exited(marker)
    if name == "psro":  # deterministic: the exact payoffs and meta-strategy of an uninterrupted run
        from mlflow_reads import final_tables, uninterrupted_tables

        from marl_core.psro.config import build_config

        config = build_config({"game": "kuhn_poker", "iterations": case.last})
        assert final_tables(client, run_id, case.last) == uninterrupted_tables(config)
    if name == "cfr":  # deterministic: the exploitability an uninterrupted run reaches
        assert resume[:3] == ["psro", "cfr", "resume"]
        import torch

        from marl_core.neural_cfr.config import NeuralCFRConfig
        from marl_core.neural_cfr.rounds import iterate_cfr_local

        threads = torch.get_num_threads()
        try:
            *_, (last, _) = iterate_cfr_local(NeuralCFRConfig(**{**SMALL_CFR, "rounds": case.last + 1}))
        finally:
            torch.set_num_threads(threads)
        assert finished.data.metrics["exploitability"] == pytest.approx(last.exploitability, abs=1e-9)
    if name == "toy":
        from toy_scenario import ToyConfig, expected_total

        assert f"total {expected_total(ToyConfig(rounds=case.last + 1, seed=3)):.6f}" in output
        assert output.splitlines()[-1] == "preflight calls: 1"  # the command's; the flow trusts it
