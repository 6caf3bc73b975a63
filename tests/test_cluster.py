"""The same `psro run`, on an existing two-node Ray cluster (`--ray-address`).

Both nodes run on this machine on loopback only, one CPU each. The run uses a learned oracle, so
each iteration's best responses fan out over rollout workers (Ray actors), which the pool spreads
over the nodes; `--eval sampled` adds an evaluation split in two chunks. Each task logs the Ray
node it ran on, and each best-response task the nodes of its rollout workers
(tasks/psro_tasks.py); the test reads those lines back from Prefect's task-run logs.

Why the rollout workers and not the tasks carry the assertion: where Ray runs a short task is up
to its scheduler (a leased worker that is free again takes the next task of its kind), so "some
task ran on the second node" holds most runs but not all. Actors placed with SPREAD land on both
nodes every time.

Why `ray.cluster_utils.Cluster` and not two `ray start`: `ray start` replaces 127.0.0.1 with the
machine's network address, and a second `ray start` on one machine refuses to keep it on
loopback. The cluster runs in a child process (this file run as a script) with its own RAY_TMPDIR,
so stopping it and checking for leftovers touches no other Ray on the machine.
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is Ray's switch for "local addresses stay local"; the cluster's
process needs it. `psro run` gets none: it joins --ray-address 127.0.0.1:PORT on loopback by
itself (`flows.services.patches.ray_on_loopback`), where Ray would rewrite it to the network address.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from processes import Prefect, assert_all_exited, mlflow_store, poll, prefect_home

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 2
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def serve_cluster(gcs_port: int) -> None:
    """Child process: a head and a worker node on 127.0.0.1, until stdin closes."""
    from ray.cluster_utils import Cluster

    node = dict(node_ip_address="127.0.0.1", num_cpus=1, object_store_memory=128 * 1024**2)
    cluster = Cluster(
        initialize_head=True, head_node_args=dict(node, gcs_server_port=gcs_port, include_dashboard=False)
    )
    worker = cluster.add_node(**node)
    print(json.dumps({"address": cluster.address, "nodes": [cluster.head_node.node_id, worker.node_id]}), flush=True)
    sys.stdin.read()
    cluster.shutdown()


@pytest.fixture
def two_node_cluster():
    from flows.services.prefect_server import free_port

    ray_tmp = tempfile.mkdtemp(prefix="psro-ray-", dir="/tmp")  # short: Ray's socket paths live here
    marker = f"RAY_TMPDIR={ray_tmp}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update(LOOPBACK_ONLY, RAY_TMPDIR=ray_tmp)
    child = subprocess.Popen(
        [sys.executable, __file__, str(free_port())],
        env=env,
        cwd=ROOT,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        line = child.stdout.readline()
        assert line, f"the cluster did not start; see {ray_tmp}/ray/session_latest/logs"
        yield json.loads(line)
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
        assert_all_exited(marker)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _nodes_of_tasks(api_url: str) -> dict[str, set[str]]:
    """Task name (without its run suffix) -> Ray node ids its runs logged; "rollout-workers" ->
    the nodes the run's flow logged its rollout workers on."""
    prefect = Prefect(api_url)
    names = {run.id: run.name.rsplit("-", 1)[0] for run in prefect("read_task_runs")}
    logs, page = [], None
    while page != []:  # the server answers 200 at most
        logs += (page := prefect("read_logs", limit=200, offset=len(logs)))
    nodes = defaultdict(set)
    for log in logs:
        if log.message.startswith("on Ray node ") and log.task_run_id is not None:
            nodes[names[log.task_run_id]].add(log.message.removeprefix("on Ray node "))
        elif log.message.startswith("rollout workers on Ray nodes "):
            nodes["rollout-workers"].update(log.message.removeprefix("rollout workers on Ray nodes ").split(", "))
    return dict(nodes)


@pytest.fixture
def prefect_server(tmp_path):
    """A Prefect server that outlives the run, so its task logs can be read; it boots while the
    cluster starts (request this fixture first)."""
    from flows.services.prefect_server import LocalPrefectServer

    server = LocalPrefectServer(prefect_home(tmp_path / "prefect-home"))
    try:
        yield server
    finally:
        server.stop()
        assert_all_exited(f"PREFECT_HOME={tmp_path / 'prefect-home'}")  # the server and the run's driver


@pytest.mark.end_to_end
def test_psro_runs_on_both_nodes_of_a_cluster(prefect_server, two_node_cluster, tmp_path):
    server = prefect_server
    server.wait()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_"))}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_API_URL=server.url)
    settings = tmp_path / "small-dqn.yaml"  # a short learned response: the point is where it runs
    settings.write_text(
        textwrap.dedent("""
        best_response: {episodes: 1000, episodes_per_round: 250}
        rollout: {workers: 2, envs_per_worker: 8}
    """)
    )
    command = [
        str(Path(sys.executable).with_name("psro")),
        "run",
        "--config",
        str(settings),
        "--game",
        "kuhn_poker",
        "--oracle",
        "dqn",
        "--iterations",
        str(ITERATIONS),
        "--eval",
        "sampled",
        "--episodes",
        "200",
        "--ray-address",
        two_node_cluster["address"],
        "--tracking-uri",
        mlflow_store(tmp_path),
        "--experiment",
        "cluster",
    ]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (
        f"Connecting to existing Ray cluster at address: {two_node_cluster['address']}" in result.stdout + result.stderr
    )
    # Task logs reach the server in batches after the tasks end: read until every line is in.
    nodes = poll(
        lambda: _nodes_of_tasks(server.url),
        lambda nodes: (
            nodes.get("rollout-workers") == set(two_node_cluster["nodes"])
            and {"train-best-response", "evaluate-payoffs"} <= set(nodes)
        ),
    )
    report = "\n".join(f"{task:24} {', '.join(sorted(n[:12] for n in ids))}" for task, ids in sorted(nodes.items()))
    artifact = ROOT / "test-artifacts" / "cluster-task-nodes.txt"
    artifact.parent.mkdir(exist_ok=True)
    artifact.write_text(f"nodes: {two_node_cluster['nodes']}\n{report}\n")
    print(report)
    assert nodes.get("rollout-workers") == set(two_node_cluster["nodes"]), report
    assert {"train-best-response", "evaluate-payoffs"} <= set(nodes), report
    assert f"done: {ITERATIONS} iterations" in result.stdout


def test_ray_address_comes_from_the_environment(monkeypatch):
    """RAY_ADDRESS is the same as --ray-address (the flag wins when both are given)."""
    from typer.testing import CliRunner

    from flows.cli import app as cli
    from flows.cli import scenario_commands as scenario_cli

    seen = []
    monkeypatch.setattr(scenario_cli, "start", lambda scenario, config, resume_run_id: seen.append(config))
    monkeypatch.setattr("flows.services.preflight.preflight", lambda config: None)  # no cluster listens here
    runner = CliRunner()
    assert runner.invoke(cli.app, ["run"], env={"RAY_ADDRESS": "127.0.0.1:6379"}).exit_code == 0
    assert (
        runner.invoke(
            cli.app, ["run", "--ray-address", "127.0.0.2:6380"], env={"RAY_ADDRESS": "127.0.0.1:6379"}
        ).exit_code
        == 0
    )
    assert [config.ray_address for config in seen] == ["127.0.0.1:6379", "127.0.0.2:6380"]


if __name__ == "__main__":
    serve_cluster(int(sys.argv[1]))
