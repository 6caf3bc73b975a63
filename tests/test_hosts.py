"""The team's stack across hosts: a head on 127.0.0.2 (`psro stack up --host 127.0.0.2 --auth
--workers 0`, so that its Ray head offers no CPU), a worker host on 127.0.0.3 (`psro stack join
127.0.0.2 --cpus 8`) and a laptop on 127.0.0.4 that runs every scenario against the head's
addresses. Each host has its own HOME, working directory and temporary directory, and they share
no file: what a run needs goes through the servers (Prefect's API, MLflow's artifact proxy) and
Ray (Ray Client from the laptop). The head's Ray offers no CPU, so every task runs on the worker
host's node.

The worker host is SIGKILLed (its Ray node and its Prefect worker) while every scenario's run from
the laptop is held at a commit, with its actors up on that host, and joins again: every run ends
with nothing lost. Then `down` on the worker host stops its part and nothing else.

One head and one worker host serve the module; its tests run in file order.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow_reads import assert_each_metric_once, assert_each_version_once
from processes import FAULT_INJECTION, Prefect, assert_all_exited, command_line, pids_with_env, wait_until
from small_runs import PBT, SMALL_CFR, SMALL_LEAGUE, SYNC_MARL

pytestmark = pytest.mark.end_to_end

PSRO = str(Path(sys.executable).with_name("psro"))
HEAD, WORKER, LAPTOP = "127.0.0.2", "127.0.0.3", "127.0.0.4"
SECRETS = ("prefect-secret-0602", "mlflow-secret-0602", "ray-token-0602-" + "k" * 24)
CREDENTIALS = {
    "PREFECT_API_AUTH_STRING": f"team:{SECRETS[0]}",
    "MLFLOW_TRACKING_USERNAME": "team",
    "MLFLOW_TRACKING_PASSWORD": SECRETS[1],
    "RAY_AUTH_TOKEN": SECRETS[2],
}
HOST_MARKER = "PSRO_TEST_HOST"
# The worker host's Ray CPUs: more than its two cores. Five runs share it, and a run held at its
# commit keeps its actors and their CPUs; with two, the MARL and PBT runs once waited for a CPU
# until the held runs' holds ran out (a fresh-clone CI run, 540 s and no commit).
WORKER_CPUS = 8
HELD_AT = 1  # the commit every laptop run is held at while the worker host is killed
# Until every laptop run is held, and how long the first held waits for the others. A fresh-clone
# CI run, beside the other xdist worker's tests (load average 21 on two cores), took 484-640 s
# from the runs' start to their holds; PSRO's iteration 0 alone took 472 s.
ALL_HELD_DEADLINE, HOLD_LIMIT = 1500, 1800
PSRO_ITERATIONS = 4


class Host:
    """One host: an address and its own HOME, working directory and temporary directory (short:
    Ray's socket paths live under it and may not pass 107 bytes)."""

    def __init__(self, root: Path, name: str, address: str):
        self.address = address
        self.home, self.work, self.tmp = (root / f"{name}{part}" for part in ("h", "w", "t"))
        for folder in (self.home, self.work, self.tmp):
            folder.mkdir()
        self.stack_dir = self.home / "stack"
        self.name = f"{root}/{name}"

    @property
    def marker(self) -> str:
        """The environment entry every process this host starts carries."""
        return f"{HOST_MARKER}={self.name}"

    def env(self, credentials: bool = True, **more: str) -> dict[str, str]:
        own = ("PREFECT_", "RAY_", "PSRO_", "MLFLOW_")
        env = {key: value for key, value in os.environ.items() if not key.startswith(own)}
        env |= {"HOME": str(self.home), "TMPDIR": str(self.tmp), HOST_MARKER: self.name}
        return env | (CREDENTIALS if credentials else {}) | more

    def run(self, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*args], env=self.env(**env), cwd=self.work, capture_output=True, text=True, timeout=timeout
        )

    def stack(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.run(PSRO, "stack", *args, "--dir", str(self.stack_dir), timeout=timeout)

    def state(self) -> dict:
        return json.loads((self.stack_dir / "stack.json").read_text())


ADDRESSES = {
    "prefect": f"http://{HEAD}:4200/api",
    "mlflow": f"http://{HEAD}:5000",
    "ray": f"{HEAD}:6379",
    "ray_client": f"ray://{HEAD}:10001",
}
# The head's Prefect API, with the team's credentials (the test process's Prefect settings may
# have been read before this module's fixture set them)
HEAD_PREFECT = Prefect(ADDRESSES["prefect"], CREDENTIALS["PREFECT_API_AUTH_STRING"])


def _join(worker: Host) -> None:
    """`psro stack join` on the worker host, to the head, offering Ray `WORKER_CPUS`."""
    joined = worker.stack("join", HEAD, "--host", WORKER, "--cpus", str(WORKER_CPUS))
    assert joined.returncode == 0, joined.stdout + joined.stderr


@pytest.fixture(scope="module")
def hosts():
    root = Path(tempfile.mkdtemp(prefix="ph-", dir="/tmp"))
    root.chmod(0o755)  # as root, PostgreSQL runs as the `postgres` user, which must reach its data
    head, worker, laptop = Host(root, "h", HEAD), Host(root, "w", WORKER), Host(root, "l", LAPTOP)
    try:
        started = head.stack("up", "--host", HEAD, "--auth", "--workers", "0")
        assert started.returncode == 0, started.stdout + started.stderr
        _join(worker)
        with pytest.MonkeyPatch.context() as patch:  # this process reads the head's servers too
            for key, value in CREDENTIALS.items():
                patch.setenv(key, value)
            yield head, worker, laptop, started.stdout
    finally:
        for host in (worker, head):
            host.stack("down")
        kept = Path(__file__).resolve().parents[1] / "test-artifacts"
        kept.mkdir(exist_ok=True)
        for log in root.rglob("ray_client_server*.err"):  # why a laptop's Ray Client was refused
            shutil.copyfile(log, kept / f"hosts-{log.name}")
        for log in root.rglob("stack/logs/*.log"):  # each host's services, as `psro stack` started them
            shutil.copyfile(log, kept / f"hosts-{log.parents[2].name}-{log.name}")
        shutil.rmtree(root, ignore_errors=True)


def test_up_prints_the_heads_addresses_and_status_lists_each_hosts_nodes_and_workers(hosts):
    from flows.services.prefect_server import healthy

    head, worker, _, printed = hosts
    for line in (f"--tracking-uri {ADDRESSES['mlflow']} --ray-address {ADDRESSES['ray_client']}", ADDRESSES["prefect"]):
        assert line in printed, printed
    assert f"psro stack join {HEAD}" in printed
    status = head.stack("status")
    assert status.returncode == 0, status.stdout + status.stderr
    services, _, listed = status.stdout.partition("hosts:\n")
    assert dict(line.split() for line in services.splitlines()) == {
        name: "up" for name in ("postgres", "prefect-server", "mlflow", "ray-head", "prefect-worker")
    }
    assert listed.splitlines() == [
        f"  {HEAD:15} ray nodes: 0 CPUs; prefect workers: 1",
        f"  {WORKER:15} ray nodes: {WORKER_CPUS} CPUs; prefect workers: 1",
    ], status.stdout
    # the head's Ray Client proxy starts each laptop's process without a fork (flows/services/patches.py)
    proxies = [command_line(pid) or "" for pid in pids_with_env(head.marker)]
    assert [line for line in proxies if "--mode=proxy" in line and " -m flows.services.stack ray-client-proxy " in line]
    on_worker = worker.stack("status")
    assert on_worker.returncode == 0 and on_worker.stdout.split() == ["ray-worker-1", "up", "prefect-worker", "up"]
    # the servers listen on the head's address alone, PostgreSQL on the head's loopback alone
    assert healthy(ADDRESSES["prefect"]) and not healthy("http://127.0.0.1:4200/api")
    postgres = head.state()["ports"]["postgres"]
    import socket

    with socket.socket() as probe:
        assert probe.connect_ex((HEAD, postgres)) != 0
    for host in (head, worker):
        assert not any(secret in (host.stack_dir / "stack.json").read_text() for secret in SECRETS)


def _status(url: str, headers: dict[str, str] | None = None, body: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


RAY_PROBE = """
import sys
import ray
from ray._raylet import GcsClient
kind, address = sys.argv[1:]
try:
    if kind == "gcs":
        GcsClient(address=address).get_all_node_info(timeout=10)
    else:
        ray.init(address, log_to_driver=False)
        ray.shutdown()
except Exception as error:
    print(type(error).__name__, str(error)[-2000:])
    sys.exit(3)
print("answered")
"""


def test_every_server_other_hosts_use_refuses_a_request_without_credentials(hosts):
    """Prefect and MLflow answer 401; Ray's GCS and Ray Client refuse a client without the token
    or with another one, and answer the one with the team's token."""
    import base64

    _, _, laptop, _ = hosts
    assert _status(f"{ADDRESSES['prefect']}/flows/filter", body=b"{}") == 401
    assert _status(f"{ADDRESSES['mlflow']}/api/2.0/mlflow/experiments/search?max_results=1") == 401
    wrong = {"Authorization": "Basic " + base64.b64encode(b"team:wrong").decode()}
    assert _status(f"{ADDRESSES['prefect']}/flows/filter", wrong, b"{}") == 401
    for kind, address in (("gcs", ADDRESSES["ray"]), ("client", ADDRESSES["ray_client"])):
        tokens = {
            "none": {},
            "wrong": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "w" * 40},
            "right": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": SECRETS[2]},
        }
        for name, env in tokens.items():
            probe = laptop.run(sys.executable, "-c", RAY_PROBE, kind, address, timeout=180, credentials=False, **env)
            if name == "right" and "Initialization failure from server" in probe.stdout:
                # the token was taken; the Ray Client server's process for this client failed to
                # start (seen once in five runs, on a loaded machine): a second connection is made
                probe = laptop.run(
                    sys.executable, "-c", RAY_PROBE, kind, address, timeout=180, credentials=False, **env
                )
            refused = probe.returncode == 3
            assert refused == (name != "right"), (kind, name, probe.stdout[-500:], probe.stderr[-1500:])


# --- runs from the laptop ----------------------------------------------------------------------

# Every scenario but PSRO, run from the laptop by `psro run --config FILE` (FILE names its scenario)
OTHERS = {"marl": SYNC_MARL, "league": SMALL_LEAGUE, "pbt": PBT, "cfr": SMALL_CFR}
LOST: dict[str, float] = {}  # what losing the worker host cost, for the note


class LaptopRun:
    """A `psro run` on the laptop against the head's addresses, in the background."""

    def __init__(self, laptop: Host, scenario: str, args: list[str], **env: str):
        self.scenario = scenario
        self.experiment = f"laptop-{scenario}"
        flags = ["--tracking-uri", ADDRESSES["mlflow"], "--ray-address", ADDRESSES["ray_client"]]
        self.log = laptop.home / f"{scenario}.log"
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                [PSRO, "run", *args, *flags, "--experiment", self.experiment],
                env=laptop.env(PREFECT_API_URL=ADDRESSES["prefect"], RAY_AUTH_MODE="token", **env),
                cwd=laptop.work,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text()[-3000:]

    def mlflow_run(self):
        return mlflow_run(self.experiment)


def mlflow_run(experiment: str):
    """A client of the head's MLflow server, and the one run of `experiment` there."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=ADDRESSES["mlflow"])
    (found,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, found


@pytest.fixture
def laptop_runs(hosts):
    """Every scenario's run from the laptop, each held by the suite's seam as it hands its commit
    1 to its tracker (`tests/fault_injection`): its actors are up on the worker host then, and
    the steps after that commit still to run."""
    _, _, laptop, _ = hosts
    holds = laptop.home / "holds"
    runs = {}
    for scenario in ("psro", *OTHERS):
        (holds / scenario).mkdir(parents=True)
        seam = {
            "PYTHONPATH": str(FAULT_INJECTION),
            "PSRO_TEST_HOLD_AT_COMMIT": str(HELD_AT),
            "PSRO_TEST_HOLD_DIR": str(holds / scenario),
            "PSRO_TEST_HOLD_LIMIT": str(HOLD_LIMIT),
        }
        if scenario == "psro":
            args = ["--game", "kuhn_poker", "--iterations", str(PSRO_ITERATIONS)]
        else:
            path = laptop.home / f"{scenario}.yaml"
            path.write_text(yaml.safe_dump({"scenario": scenario, **OTHERS[scenario]}))
            args = ["--config", str(path)]
        runs[scenario] = LaptopRun(laptop, scenario, args, **seam)
    yield runs, holds
    kept = Path(__file__).resolve().parents[1] / "test-artifacts"
    kept.mkdir(exist_ok=True)
    for scenario, run in runs.items():
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()
        shutil.copyfile(run.log, kept / f"hosts-laptop-{scenario}.log")  # the host's folders are removed


@pytest.mark.timeout(3600)  # waits for all runs held (1,500 s), then their next commits (900 s), then their ends
def test_the_worker_host_killed_mid_run_and_joined_again_loses_no_laptop_run(hosts, laptop_runs):
    """With every run held at its commit 1, the worker host's Ray node and Prefect worker are
    SIGKILLed and the runs released: each has no CPU until the host joins again, and a run whose
    actors went with the host goes on from its last commit (`flows.runtime.run`). Every run then
    ends FINISHED at its last step, each metric once, each registry version once, its artifacts
    on the head's MLflow server, and nothing written in the laptop's working directory; the PSRO
    run's exploitability is an uninterrupted run's."""
    from flows.scenarios import SCENARIOS
    from marl_core.psro.config import PSROConfig
    from marl_core.psro.steps import iterate_psro_local

    _, worker, laptop, _ = hosts
    runs, holds = laptop_runs

    def all_held() -> bool:
        for scenario, run in runs.items():
            assert run.process.poll() is None, (scenario, run.output())
        return all((holds / scenario / f"held-{HELD_AT}").exists() for scenario in runs)

    wait_until(all_held, ALL_HELD_DEADLINE, f"every run at its commit {HELD_AT}")  # the first held still waits
    killed = time.monotonic()
    _kill_host(worker)
    for scenario in runs:
        (holds / scenario / f"release-{HELD_AT}").touch()
    _join(worker)
    back = time.monotonic()
    LOST["worker host down (s)"] = back - killed

    def went_on() -> bool:  # each run's next commit (or its end), timed from the rejoin
        for scenario, run in runs.items():
            key = f"{scenario}: from the rejoin to its next commit (s)"
            if key in LOST:
                continue
            assert run.process.poll() in (None, 0), (scenario, run.output())
            _, found = run.mlflow_run()
            if int(found.data.tags.get(SCENARIOS[scenario].commit_tag, -1)) > HELD_AT:
                LOST[key] = time.monotonic() - back
        return len(LOST) == 1 + len(runs)

    wait_until(went_on, 900, "every run's next commit")
    for scenario, run in runs.items():
        assert run.process.wait(timeout=900) == 0, (scenario, run.output())
        client, found = run.mlflow_run()
        assert found.info.status == "FINISHED", scenario
        last = str(PSRO_ITERATIONS) if scenario == "psro" else "3"
        assert found.data.tags[SCENARIOS[scenario].commit_tag] == last, scenario
        assert found.info.artifact_uri.startswith("mlflow-artifacts:"), scenario
        assert_each_metric_once(client, found)
        assert_each_version_once(client, found.info.run_id)
        assert client.search_model_versions(f"run_id = '{found.info.run_id}'"), scenario
        flow_run = HEAD_PREFECT("read_flow_run", found.data.tags["prefect.flow_run_id"])
        assert flow_run.state.is_completed(), (scenario, flow_run.state)
    assert list(laptop.work.iterdir()) == []  # no mlflow.db, no mlruns: everything went to the head
    *_, (reference, _) = iterate_psro_local(PSROConfig(game="kuhn_poker", iterations=PSRO_ITERATIONS))
    _, found = runs["psro"].mlflow_run()
    assert found.data.metrics["exploitability"] == pytest.approx(reference.exploitability, abs=1e-9)
    assert_all_exited(laptop.marker, timeout=30)
    root = laptop.home.parent
    files = [path for path in root.rglob("*") if path.is_file() and not path.is_socket()]
    holding = [str(path) for path in files for secret in SECRETS if secret.encode() in path.read_bytes()]
    assert files and holding == []  # in no host's files: the stacks', Ray's sessions, the laptop's
    artifact = Path(__file__).resolve().parents[1] / "test-artifacts" / "hosts-worker-loss.txt"
    artifact.parent.mkdir(exist_ok=True)
    recovered = [scenario for scenario, run in runs.items() if "lost a Ray worker or node" in run.log.read_text()]
    artifact.write_text(
        "".join(f"{what}: {seconds:.1f}\n" for what, seconds in LOST.items())
        + f"went on from their last commit after losing actors: {', '.join(recovered) or 'none'}\n"
    )


def test_a_deployment_triggered_from_the_laptop_runs_on_a_hosts_worker_and_tracks_to_the_head(hosts):
    """prefect.yaml deployed to the head's pool from the laptop and PSRO's smoke deployment
    triggered there, its config naming the head's addresses: a host's Prefect worker runs it,
    Ray Client carries its tasks, and it ends FINISHED in the head's MLflow and Completed in the
    head's Prefect."""
    import re

    from flows.scenarios import SCENARIOS

    _, _, laptop, _ = hosts
    root = Path(__file__).resolve().parents[1]
    prefect = str(Path(sys.executable).with_name("prefect"))
    env = laptop.env(PREFECT_API_URL=ADDRESSES["prefect"], RAY_AUTH_MODE="token")

    def prefect_cli(*args: str) -> str:
        done = subprocess.run([prefect, *args], cwd=root, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    prefect_cli("--no-prompt", "deploy", "--all")
    prefect_cli("deployment", "schedule", "pause", "--all")  # no nightly run may start during the suite
    common = {"tracking_uri": ADDRESSES["mlflow"], "ray_address": ADDRESSES["ray_client"], "experiment": "deployed"}
    config = SCENARIOS["psro"].with_common({"game": "kuhn_poker", "meta_solver": "nash", "iterations": 3}, common)
    triggered = prefect_cli("deployment", "run", "psro/kuhn-smoke", "--params", json.dumps({"config": config}))
    flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", triggered).group(1)
    assert HEAD_PREFECT.final_state(flow_run_id, 600).is_completed()
    client, found = mlflow_run("deployed")
    assert found.info.status == "FINISHED" and found.data.tags["psro.committed_iteration"] == "3"
    assert found.info.artifact_uri.startswith("mlflow-artifacts:")
    assert_each_metric_once(client, found)


def _kill_host(host: Host) -> None:
    """The host lost: every process group its stack started (its stack.json names them), then
    every other process of the host (PostgreSQL's, started apart by pg_ctl), SIGKILLed."""
    for group in host.state()["groups"].values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)

    def all_dead() -> bool:  # PostgreSQL's, and whatever left its group: every process of the host
        for pid in pids_with_env(host.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not pids_with_env(host.marker)

    wait_until(all_dead, 60, f"{host.address}'s processes to die")


@pytest.mark.timeout(2400)
def test_losing_the_head_stops_a_laptop_run_in_one_line_and_it_resumes_once_the_head_is_back(hosts):
    """A PSRO run from the laptop, held as it hands its commit 1 to its tracker while the head
    host is SIGKILLed: once released it meets no Ray head, stops, and says in one line which
    commit MLflow holds (0: the 1st never reached the server) and the command that continues
    it. The head comes up again (`psro stack up`, the same directory), the worker host joins
    it again (`down`, `join`), and that command ends the run FINISHED with PSRO's exact answer,
    each metric once."""

    from marl_core.psro.config import PSROConfig
    from marl_core.psro.steps import iterate_psro_local

    head, worker, laptop, _ = hosts
    holds = laptop.home / "holds" / "head-loss"
    holds.mkdir(parents=True)
    seam = {
        "PYTHONPATH": str(FAULT_INJECTION),
        "PSRO_TEST_HOLD_AT_COMMIT": str(HELD_AT),
        "PSRO_TEST_HOLD_DIR": str(holds),
    }
    run = LaptopRun(laptop, "head-loss", ["--game", "kuhn_poker", "--iterations", str(PSRO_ITERATIONS)], **seam)
    wait_until(lambda: (holds / f"held-{HELD_AT}").exists() or run.process.poll() is not None, 540, "the run's commit")
    assert run.process.poll() is None, run.output()

    def committed_before_the_held_one():  # the tracker's thread may still be writing it
        _, found = run.mlflow_run()
        return found if found.data.tags.get("psro.committed_iteration") == str(HELD_AT - 1) else None

    found = wait_until(committed_before_the_held_one, 120, f"commit {HELD_AT - 1} in MLflow")
    _kill_host(head)
    killed = time.monotonic()
    (holds / f"release-{HELD_AT}").touch()
    code = run.process.wait(timeout=600)
    LOST["head lost: from the kill to the run's stop (s)"] = time.monotonic() - killed
    run_id = found.info.run_id
    last = run.log.read_text().strip().splitlines()[-1]
    assert code == 75, run.output()
    assert last == (
        f"lost the Ray head at {ADDRESSES['ray_client']} (no answer for 30 s); stopped: iteration {HELD_AT - 1} is "
        f"the last committed to MLflow run {run_id}; continue with: psro resume {run_id} --tracking-uri "
        f"{ADDRESSES['mlflow']} once it is back"
    ), run.output()

    # the worker host's Ray node belonged to the lost cluster: the host leaves, and joins the new
    # head (on separate machines in either order; here the node would hold ports the head takes)
    left = worker.stack("down")
    assert left.returncode == 0, left.stdout + left.stderr
    up = head.stack("up", "--host", HEAD, "--auth", "--workers", "0")
    assert up.returncode == 0, up.stdout + up.stderr
    _join(worker)
    back = time.monotonic()
    env = {"PREFECT_API_URL": ADDRESSES["prefect"], "RAY_AUTH_MODE": "token"}
    resumed = laptop.run(PSRO, "resume", run_id, "--tracking-uri", ADDRESSES["mlflow"], timeout=900, **env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    LOST["head back: the resumed run to its end (s)"] = time.monotonic() - back
    client, found = run.mlflow_run()
    assert found.info.status == "FINISHED" and found.data.tags["psro.committed_iteration"] == str(PSRO_ITERATIONS)
    assert_each_metric_once(client, found)
    assert_each_version_once(client, run_id)
    *_, (reference, _) = iterate_psro_local(PSROConfig(game="kuhn_poker", iterations=PSRO_ITERATIONS))
    assert found.data.metrics["exploitability"] == pytest.approx(reference.exploitability, abs=1e-9)
    artifact = Path(__file__).resolve().parents[1] / "test-artifacts" / "hosts-head-loss.txt"
    artifact.parent.mkdir(exist_ok=True)
    artifact.write_text("".join(f"{what}: {seconds:.1f}\n" for what, seconds in LOST.items() if "head" in what))


def test_down_on_the_worker_host_stops_its_part_and_nothing_else(hosts):
    head, worker, _, _ = hosts
    stopped = worker.stack("down")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert stopped.stdout.split("\n")[:2] == ["stopped prefect-worker", "stopped ray-worker-1"], stopped.stdout
    assert_all_exited(worker.marker, timeout=30)

    def head_status() -> str:
        status = head.stack("status")
        assert status.returncode == 0, status.stdout + status.stderr
        return status.stdout

    # the GCS marks the node dead once its raylet has gone; Prefect lists the worker until it misses heartbeats
    def node_gone() -> str | None:
        out = head_status()
        return None if f"{WORKER_CPUS} CPUs" in out else out

    listed = wait_until(node_gone, 60, "the worker host's node to leave the head's listing")
    assert f"  {HEAD:15} ray nodes: 0 CPUs; prefect workers: 1" in listed, listed
