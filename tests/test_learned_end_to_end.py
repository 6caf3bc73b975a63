"""PSRO with a learned oracle through the real `psro` command: rollout workers as Ray actors,
networks checkpointed in MLflow's registry as weights only, the export checked by OpenSpiel."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from processes import run_config

from flows.tracking.layout import registered_model_name
from flows.tracking.registry_members import load_member, open_store, parse_member
from marl_core.games.tree import build_tree
from marl_core.policies.neural import NeuralPolicy
from marl_core.policies.tabular import TabularPolicy
from marl_core.policies.tabularize import tabularize

pytestmark = pytest.mark.end_to_end

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 2
# Per response: long enough (seconds, several of the progress reader's polls) for each response to
# be seen in progress; a shorter one may start and end between two polls on a fast machine.
EPISODES = 8000


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory):
    """`--oracle a2c`: an oracle that exists only as a line of marl_core.rl.ALGORITHMS, with its
    game defaults from its config section (every RL algorithm is an oracle of the real command).
    Its output is no terminal, so its progress shows as plain lines, here at most every second."""
    work = tmp_path_factory.mktemp("learned")
    result = run_config(
        work,
        "game: kuhn_poker\n"
        f"iterations: {ITERATIONS}\n"
        "experiment: learned\n"
        f"best_response: {{episodes: {EPISODES}, episodes_per_round: 1000}}\n"
        "rollout: {workers: 2, envs_per_worker: 8}\n",
        "--oracle",
        "a2c",
        "--export",
        str(work / "export"),
        env={"PSRO_PROGRESS_EVERY": "1"},
    )
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{work}/mlflow.db")
    run = client.search_runs([client.get_experiment_by_name("learned").experiment_id])[0]
    return work, result, client, run


def test_learned_run_reports_training_and_an_export_openspiel_accepts(learned_run):
    work, result, client, run = learned_run
    assert "oracle=a2c" in result.stdout and f"done: {ITERATIONS} iterations" in result.stdout
    assert run.info.status == "FINISHED" and run.data.params["oracle"] == "a2c"
    assert run.data.params["a2c.gamma"] == "1.0" and run.data.params["rollout.workers"] == "2"
    for player in range(2):
        returns = client.get_metric_history(run.info.run_id, f"player_{player}/oracle_training_return")
        assert sorted(m.step for m in returns) == list(range(1, ITERATIONS + 1))
        episodes = client.get_metric_history(run.info.run_id, f"player_{player}/oracle_episodes")
        assert {m.value for m in episodes} == {float(EPISODES)}
    sys.path.insert(0, str(ROOT / "scripts"))
    from verify_export import verify

    report = verify(work / "export")
    assert report["passed"]
    logged = client.get_metric_history(run.info.run_id, "exploitability")
    final = max(logged, key=lambda m: m.step).value
    assert report["openspiel_exploitability"] == pytest.approx(final, abs=1e-9)


@pytest.fixture
def one_torch_thread():
    """As the learner that tabularized the members: an A2C member's probabilities are float32
    sums whose last bit depends on how torch splits them over threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_every_learned_member_is_a_weights_only_checkpoint_that_rebuilds_its_policy(learned_run, one_torch_thread):
    work, _, _, _ = learned_run
    client = open_store(f"sqlite:///{work}/mlflow.db")
    tree = build_tree("kuhn_poker")
    for player in range(2):
        name = registered_model_name("learned", "kuhn_poker", f"player_{player}")
        versions = sorted(client.search_model_versions(f"name='{name}'"), key=lambda v: int(v.version))
        assert [v.tags["member"] for v in versions] == [str(m) for m in range(ITERATIONS + 1)]
        members = [load_member(client, parse_member(f"{name}/{v.version}")).policy for v in versions]
        assert isinstance(members[0], TabularPolicy)  # the uniform start has no network
        for version, member in zip(versions[1:], members[1:]):
            weights_file = Path(
                mlflow.artifacts.download_artifacts(
                    artifact_uri=f"{version.source}/weights.pt", tracking_uri=client.tracking_uri
                )
            )
            state = torch.load(weights_file, weights_only=True)  # tensors only: nothing unpickled
            assert all(isinstance(t, torch.Tensor) for t in state.values())
            assert isinstance(member, NeuralPolicy)
            np.testing.assert_array_equal(tabularize(member.network, tree, player), member.tabular)


def test_each_learned_iteration_shows_its_responses_progress_within_seconds(learned_run):
    """A plain progress line as each best response starts, within 10 s of the previous
    iteration's line and before its own result; then counts that only grow. The first
    iteration's line shows its responses mid-way (its workers start cold: seconds of work); a
    later one, on warm workers, may play all its episodes within the watcher's one-second poll."""
    _, result, _, _ = learned_run
    timed = result.timed_lines
    first_counts = []
    for iteration in range(1, ITERATIONS + 1):
        began = next(t for t, line in timed if line.startswith(f"iter {iteration - 1:4d}"))
        ended = next(t for t, line in timed if line.startswith(f"iter {iteration:4d}"))
        pattern = rf"(best response player_[01] \(iteration {iteration}\)): (\d+)/{EPISODES} episodes"
        shown = [(t, match) for t, line in timed if (match := re.match(pattern, line))]
        assert {match[1] for _, match in shown} == {
            f"best response player_{r} (iteration {iteration})" for r in (0, 1)
        }, result.stdout
        first_time, first = shown[0]
        assert began <= first_time < min(began + 10, ended), result.stdout
        first_counts.append(int(first[2]))
        counts = [int(match[2]) for _, match in shown if "player_0" in match[1]]
        assert counts == sorted(counts), result.stdout
    assert first_counts[0] < EPISODES, result.stdout
