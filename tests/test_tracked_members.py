"""Population members as MLflow holds them: tabular and network members, stored by the PSROTracker,
come back from resume's loader and the registry exactly, and `psro evaluate/export` use them.

The runs are tracked directly from hand-made populations (no PSRO loop, no Prefect or Ray): per
role, a uniform tabular member at iteration 0, a PPO network at iteration 1 (player_0's with its
table, player_1's without one in the "mixed" run) and a random tabular member at iteration 2.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow_reads import registered_members
from typer.testing import CliRunner

from flows.cli.app import app
from flows.runtime.run import load_resumed
from flows.scenarios.psro import PSRO
from flows.tracking import layout
from flows.tracking.psro_tracker import PSROTracker
from flows.tracking.resume import load_checkpoint
from marl_core.empirical_game.evaluation import evaluate_exact
from marl_core.empirical_game.game import psro_game
from marl_core.empirical_game.payoffs import PayoffTable
from marl_core.games.exploitability import nash_conv
from marl_core.games.tree import build_tree
from marl_core.policies.neural import NeuralPolicy
from marl_core.policies.population import Population
from marl_core.policies.storage import load_policy
from marl_core.policies.tabular import TabularPolicy
from marl_core.policies.tabularize import tabularize
from marl_core.psro.config import PSROConfig

ROOT = Path(__file__).resolve().parents[1]
GAME = "kuhn_poker"
ROLES = ("player_0", "player_1")
ITERATIONS = 2


@dataclasses.dataclass(frozen=True)
class Record:
    """What the tracker reads of an iteration's record."""

    iteration: int
    meta_strategy: list[list[float]]
    logged: dict[str, float]

    def metrics(self) -> dict[str, float]:
        return self.logged


@dataclasses.dataclass
class State:
    populations: list[Population]
    payoffs: PayoffTable
    meta_strategy: list[np.ndarray]


def _network(player: int, seed: int, tabled: bool) -> NeuralPolicy:
    from marl_core.rl import PPOConfig

    game = psro_game(GAME)
    role = game.roles[player]
    torch.manual_seed(seed)
    member = NeuralPolicy("ppo", PPOConfig().model_dump(mode="json"), game.obs_size[role], game.num_actions[role])
    return NeuralPolicy.of(
        "ppo", member.config, member.network, tabularize(member.network, build_tree(GAME), player) if tabled else None
    )


def _random_table(player: int, rng) -> TabularPolicy:
    legal = build_tree(GAME).players[player].legal
    weights = np.where(legal, rng.random(legal.shape), 0.0)
    return TabularPolicy(GAME, player, weights / weights.sum(axis=1, keepdims=True))


def _iterations(untabled: bool):
    """(record, state) per iteration; the metrics are the mixture's real NashConv where every
    member has a table, so an export of the run passes OpenSpiel's check."""
    tree = build_tree(GAME)
    rng = np.random.default_rng(3)
    added = [
        [TabularPolicy(GAME, p, tree.players[p].uniform_policy()) for p in range(2)],
        [_network(0, seed=1, tabled=True), _network(1, seed=2, tabled=not untabled)],
        [_random_table(p, rng) for p in range(2)],
    ]
    populations = [Population.of(role, [member]) for role, member in zip(ROLES, added[0])]
    payoffs = PayoffTable(2)
    for iteration, members in enumerate(added):
        if iteration:
            populations = [population.added(member) for population, member in zip(populations, members)]
        payoffs = payoffs.copy()
        payoffs.grow(tuple(len(p) for p in populations))
        missing = payoffs.missing_profiles()
        mean = rng.normal(size=(len(missing), 2))
        payoffs.record(missing, mean, np.zeros_like(mean), np.zeros(len(missing), dtype=np.int64))
        meta = [rng.dirichlet(np.ones(len(p))) for p in populations]
        if all(p.tables is not None for p in populations):
            report = nash_conv(tree, [p.tables for p in populations], meta)
            logged = {"exploitability": report.exploitability, "nash_conv": report.nash_conv}
        else:
            logged = {"exploitability": 0.25, "nash_conv": 0.5}
        yield Record(iteration, [m.tolist() for m in meta], logged), State(populations, payoffs, meta)


def _track(uri: str, experiment: str, untabled: bool) -> tuple[str, State]:
    config = PSROConfig(game=GAME, tracking_uri=uri, experiment=experiment)
    with PSROTracker(config) as tracker:
        for record, state in _iterations(untabled):
            tracker.log_iteration(record, state)
        tracker.finish(state)
    return tracker.run_id, state


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store: the "mixed" run (player_1's network has no table) and the "tabled" run."""
    work = tmp_path_factory.mktemp("members")
    uri = f"sqlite:///{work}/mlflow.db"
    previous = os.getcwd()
    os.chdir(work)  # the store's default artifact root (./mlruns, fixed when MLflow first opens it) lands here
    try:
        return uri, {name: _track(uri, name, untabled=name == "mixed") for name in ("mixed", "tabled")}
    finally:
        os.chdir(previous)


def _assert_same_member(loaded, original) -> None:
    assert type(loaded) is type(original)
    if original.tabular is None:
        assert loaded.tabular is None
    else:  # the JSON round trip is exact
        assert loaded.tabular.dtype == np.float64
        np.testing.assert_array_equal(loaded.tabular, original.tabular)
    if isinstance(original, NeuralPolicy):
        assert (loaded.algorithm, loaded.config) == (original.algorithm, original.config)
        mine, theirs = loaded.weights(), original.weights()
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[name], theirs[name]) for name in theirs)


def test_resume_rebuilds_tabular_and_network_members_exactly(store):
    uri, runs = store
    run_id, state = runs["mixed"]
    checkpoint = load_checkpoint(uri, run_id)
    assert checkpoint.iteration == ITERATIONS
    assert [p.role for p in checkpoint.populations] == list(ROLES)
    for loaded, original in zip(checkpoint.populations, state.populations):
        assert len(loaded) == len(original) == ITERATIONS + 1
        for mine, theirs in zip(loaded.members, original.members):
            _assert_same_member(mine, theirs)
    assert checkpoint.populations[0].tables is not None and checkpoint.populations[1].tables is None
    np.testing.assert_array_equal(checkpoint.populations[0].tables, state.populations[0].tables)
    for loaded, original in zip(checkpoint.meta_strategy, state.meta_strategy):
        np.testing.assert_array_equal(loaded, original)
    np.testing.assert_array_equal(checkpoint.payoffs.mean, state.payoffs.mean)


def test_registry_versions_hold_weights_and_tables_only(store):
    uri, runs = store
    run_id, state = runs["mixed"]
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    expected = [  # per iteration, per role: the files of its member's folder
        [{"policy.json"}, {"policy.json"}],
        [{"network.json", "weights.pt", "policy.json"}, {"network.json", "weights.pt"}],
        [{"policy.json"}, {"policy.json"}],
    ]
    for player, role in enumerate(ROLES):
        assert registered_members(client, "mixed", role) == [(k, k) for k in range(ITERATIONS + 1)]
        name = layout.registered_model_name("mixed", GAME, role)
        for version in client.search_model_versions(f"name='{name}'"):
            tags = layout.VersionTags.of(version.tags)
            assert (tags.run_id, tags.game, tags.role) == (run_id, GAME, role)
            assert tags.meta_weight == pytest.approx(state.meta_strategy[player][tags.member], rel=1e-5)
            folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source, tracking_uri=uri))
            files = {path.name for path in folder.rglob("*") if path.is_file()}
            assert files == expected[tags.member][player], (role, tags.member, files)
            if "weights.pt" in files:  # tensors only: torch's safe loader accepts it
                assert all(
                    isinstance(t, torch.Tensor) for t in torch.load(folder / "weights.pt", weights_only=True).values()
                )
            _assert_same_member(load_policy(folder, GAME, player), state.populations[player].members[tags.member])


def test_a_resumed_tracker_drops_the_uncommitted_iterations_versions_and_registers_them_once(tmp_path, monkeypatch):
    """A run that registered iteration 2's members but committed only iteration 1 (as after a
    kill between the two): resuming forgets those versions, and redoing iteration 2 registers
    each member once."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    config = PSROConfig(game=GAME, tracking_uri=uri, experiment="resumed")
    iterations = list(_iterations(untabled=True))
    with PSROTracker(config) as tracker:
        for record, state in iterations:
            tracker.log_iteration(record, state)
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.set_tag(tracker.run_id, layout.COMMITTED_TAG, "1")
    uncommitted = {
        role: client.get_model_version_by_alias(
            layout.registered_model_name("resumed", GAME, role), layout.NEWEST_ALIAS
        ).version
        for role in ROLES
    }

    checkpoint = load_checkpoint(uri, tracker.run_id)
    assert [len(p) for p in checkpoint.populations] == [2, 2]
    with PSROTracker(config, resume=load_resumed(PSRO, config, uri, tracker.run_id)) as resumed:
        record, state = iterations[-1]
        resumed.log_iteration(record, state)
        resumed.finish(state)
    for role in ROLES:
        assert registered_members(client, "resumed", role) == [(k, k) for k in range(ITERATIONS + 1)]
        newest = client.get_model_version_by_alias(
            layout.registered_model_name("resumed", GAME, role), layout.NEWEST_ALIAS
        )
        assert newest.version != uncommitted[role] and newest.tags["member"] == "2"


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_evaluate_plays_a_network_member_by_its_table(store):
    uri, runs = store
    _, state = runs["mixed"]
    result = _cli(
        "evaluate",
        "--tracking-uri",
        uri,
        "--member",
        "mixed-kuhn_poker-player_0/1",
        "--member",
        "mixed-kuhn_poker-player_0/2",
        "--member",
        "mixed-kuhn_poker-player_1/3",
    )
    assert result.exit_code == 0, result.output
    run_id = result.output.split("logged to MLflow run ")[1].split()[0]
    table = mlflow.artifacts.download_artifacts(
        run_id=run_id, artifact_path=layout.EVALUATION_PAYOFFS, tracking_uri=uri
    )
    frame = pd.read_csv(table, float_precision="round_trip")
    tables = [state.populations[0].tables[[0, 1]], state.populations[1].members[2].tabular[None]]
    expected = evaluate_exact(build_tree(GAME), tables, [(0, 0), (1, 0)])
    np.testing.assert_array_equal(frame[["payoff_0", "payoff_1"]].to_numpy(), expected.mean)


def test_evaluate_names_a_network_member_without_a_table(store):
    uri, _ = store
    result = _cli(
        "evaluate",
        "--tracking-uri",
        uri,
        "--member",
        "mixed-kuhn_poker-player_0/1",
        "--member",
        "mixed-kuhn_poker-player_1/2",
    )
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "mixed-kuhn_poker-player_1/2 of kuhn_poker are networks without a tabular form" in result.output


def test_export_writes_the_networks_beside_tables_openspiel_accepts(store, tmp_path):
    uri, runs = store
    run_id, state = runs["tabled"]
    result = _cli("export", "--run", run_id, "--tracking-uri", uri, tmp_path / "export")
    assert result.exit_code == 0, result.output
    sys.path.insert(0, str(ROOT / "scripts"))
    from verify_export import verify

    summary = verify(tmp_path / "export", tolerance=1e-6)
    assert summary["passed"] and summary["population_sizes"] == [ITERATIONS + 1] * 2, summary
    written = sorted(
        p.relative_to(tmp_path / "export").as_posix()
        for p in (tmp_path / "export" / "policies").rglob("*")
        if p.is_file()
    )
    members = [f"policies/{role}/member_{k}.json" for role in ROLES for k in range(ITERATIONS + 1)]
    networks = [
        f"policies/{role}/member_1/{name}" for role in ROLES for name in ("network.json", "policy.json", "weights.pt")
    ]
    assert written == sorted(members + networks)
    for player, role in enumerate(ROLES):
        folder = tmp_path / "export" / "policies" / role / "member_1"
        _assert_same_member(load_policy(folder, GAME, player), state.populations[player].members[1])
        assert json.loads((folder.parent / "member_1.json").read_text()) == json.loads(
            (folder / "policy.json").read_text()
        )


def test_export_of_a_network_without_a_table_fails_with_one_line(store, tmp_path):
    uri, runs = store
    run_id, _ = runs["mixed"]
    result = _cli("export", "--run", run_id, "--tracking-uri", uri, tmp_path / "export")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "population(s) ['player_1'] have members without a tabular form" in result.output
    assert not (tmp_path / "export").exists()


# --- a PettingZoo run whose agents map to roles ---------------------------------------------------

ADVERSARY = "pettingzoo:mpe2.simple_adversary_v3"
ROLE_TABLE = {"adversary": "adversary", "agent": "agent"}  # agent_0 and agent_1 share the population "agent"


def _adversary_iterations(roles):
    """Per role a uniform member at iteration 0 and a PPO network at iteration 1, and the
    approximate NashConv such a run logs (made up: no tree to compute it on)."""
    from marl_core.policies.base import UniformPolicy
    from marl_core.rl import PPOConfig

    game = psro_game(ADVERSARY, tuple(sorted(roles.items())) if roles else None)
    rng = np.random.default_rng(11)
    populations = [Population.of(role, [UniformPolicy()]) for role in game.roles]
    payoffs = PayoffTable(game.num_roles)
    for iteration in range(2):
        if iteration:
            torch.manual_seed(iteration)
            populations = [
                population.added(
                    NeuralPolicy(
                        "ppo", PPOConfig().model_dump(mode="json"), game.obs_size[role], game.num_actions[role]
                    )
                )
                for role, population in zip(game.roles, populations)
            ]
        payoffs = payoffs.copy()
        payoffs.grow(tuple(len(p) for p in populations))
        missing = payoffs.missing_profiles()
        mean = rng.normal(size=(len(missing), game.num_roles))
        payoffs.record(missing, mean, np.full_like(mean, 0.1), np.full(len(missing), 10))
        meta = [rng.dirichlet(np.ones(len(p))) for p in populations]
        logged = {
            "approx_nash_conv": 0.5,
            "approx_nash_conv_stderr": 0.1,
            "approx_exploitability": 0.5 / game.num_roles,
            "approx_exploitability_stderr": 0.1 / game.num_roles,
        }
        yield Record(iteration, [m.tolist() for m in meta], logged), State(populations, payoffs, meta)


@pytest.fixture(scope="module")
def adversary_store(tmp_path_factory):
    """Two simple_adversary runs in one store: "roles" (adversary and agent populations) and
    "agents" (no role table: one population per agent)."""
    work = tmp_path_factory.mktemp("adversary")
    uri = f"sqlite:///{work}/mlflow.db"
    previous = os.getcwd()
    os.chdir(work)
    try:
        runs = {}
        for experiment, roles in (("roles", ROLE_TABLE), ("agents", None)):
            config = PSROConfig(
                game=ADVERSARY, roles=roles, oracle="ppo", iterations=1, tracking_uri=uri, experiment=experiment
            )
            with PSROTracker(config) as tracker:
                for record, state in _adversary_iterations(roles):
                    tracker.log_iteration(record, state)
                tracker.finish(state)
            runs[experiment] = (tracker.run_id, state)
        return uri, runs
    finally:
        os.chdir(previous)


def _adversary_member(experiment: str, role: str, version: int) -> list[str]:
    return ["--member", f"{layout.registered_model_name(experiment, ADVERSARY, role)}/{version}"]


def test_evaluate_groups_members_by_the_roles_their_run_mapped_agents_to(adversary_store):
    """adversary members 1 and 2 against agent member 2: two populations, both agents of the
    role "agent" playing its member, exactly as the sampled evaluator plays the run's own
    populations."""
    from marl_core.empirical_game.evaluation import EVALUATORS

    uri, runs = adversary_store
    _, state = runs["roles"]
    result = _cli(
        "evaluate",
        "--tracking-uri",
        uri,
        "--eval",
        "sampled",
        "--episodes",
        40,
        "--seed",
        3,
        *_adversary_member("roles", "adversary", 1),
        *_adversary_member("roles", "agent", 2),
        *_adversary_member("roles", "adversary", 2),
    )
    assert result.exit_code == 0, result.output
    run_id = result.output.split("logged to MLflow run ")[1].split()[0]
    client = mlflow.MlflowClient(tracking_uri=uri)
    assert client.get_run(run_id).data.params["roles"] == "adversary agent"
    frame = pd.read_csv(client.download_artifacts(run_id, layout.EVALUATION_PAYOFFS), float_precision="round_trip")
    assert frame[["member_0", "member_1"]].values.tolist() == [[0, 0], [1, 0]]

    game = psro_game(ADVERSARY, tuple(sorted(ROLE_TABLE.items())))
    assert game.roles == ("adversary", "agent") and game.agents_of("agent") == ("agent_0", "agent_1")
    adversary, agent = state.populations
    populations = [Population.of("adversary", [adversary[0], adversary[1]]), Population.of("agent", [agent[1]])]
    expected = EVALUATORS["sampled"](game, populations, [[0, 0], [1, 0]], episodes=40, seed=3)
    np.testing.assert_array_equal(frame[["payoff_0", "payoff_1"]].to_numpy(), expected.mean)
    np.testing.assert_array_equal(frame[["stderr_0", "stderr_1"]].to_numpy(), expected.stderr)


def test_evaluate_refuses_members_of_runs_with_different_roles(adversary_store):
    uri, _ = adversary_store
    result = _cli(
        "evaluate",
        "--tracking-uri",
        uri,
        "--eval",
        "sampled",
        *_adversary_member("roles", "adversary", 1),
        *_adversary_member("agents", "agent_0", 1),
        *_adversary_member("agents", "agent_1", 1),
    )
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "members come from runs with different roles: " in result.output
    assert "(adversary*->adversary, agent*->agent)" in result.output and "(one role per agent)" in result.output


def test_evaluate_names_the_missing_role_of_a_run_with_roles(adversary_store):
    uri, _ = adversary_store
    result = _cli("evaluate", "--tracking-uri", uri, "--eval", "sampled", *_adversary_member("roles", "adversary", 1))
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"no member for role 'agent' of {ADVERSARY}" in result.output


def test_export_of_a_run_with_roles_writes_one_population_per_role(adversary_store, tmp_path):
    uri, runs = adversary_store
    run_id, state = runs["roles"]
    result = _cli("export", "--run", run_id, "--tracking-uri", uri, tmp_path / "export")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "export" / "summary.json").read_text())
    assert summary["roles"] == ["adversary", "agent"] and summary["num_players"] == 2
    meta = json.loads((tmp_path / "export" / "meta_strategy.json").read_text())
    for r, role in enumerate(ROLE_TABLE):
        assert meta[str(r)] == state.meta_strategy[r].tolist()  # JSON round-trips floats exactly
        _assert_same_member(
            load_policy(tmp_path / "export" / "policies" / role / "member_1"), state.populations[r].members[1]
        )
