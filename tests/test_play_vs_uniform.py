"""scripts/play_vs_uniform.py: a run's final mixture against uniform play, read from MLflow.

Two runs in one SQLite store: a real two-iteration Kuhn poker run (the one-process PSRO loop,
tracked by the PSROTracker `psro run` uses), whose outcome probabilities against uniform play
are computed exactly on the game tree; and a connect four run whose populations are the uniform
policy alone, so both seats play uniformly and the two roles' games must mirror each other.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest

from flows.tracking import layout
from flows.tracking.psro_tracker import PSROTracker
from flows.tracking.resume import load_checkpoint
from marl_core.empirical_game.payoffs import PayoffTable
from marl_core.games.exploitability import mixed_reach
from marl_core.games.tree import build_tree
from marl_core.policies.base import UniformPolicy
from marl_core.policies.population import Population
from marl_core.psro.config import PSROConfig
from marl_core.psro.steps import IterationRecord, PSROState, iterate_psro_local

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from play_vs_uniform import main, play_vs_uniform  # noqa: E402

CONNECT_FOUR = "pettingzoo:classic.connect_four_v3"


def _track(config: PSROConfig, iterations) -> str:
    with PSROTracker(config) as tracker:
        for record, state in iterations:
            tracker.log_iteration(record, state)
        tracker.finish(state)
    return tracker.run_id


def _uniform_only(config: PSROConfig):
    """Iteration 0 of a run on a game without a tree: every population the uniform policy alone."""
    game = config.psro_game
    populations = [Population.of(role, [UniformPolicy()]) for role in game.roles]
    payoffs = PayoffTable(game.num_roles)
    payoffs.grow((1,) * game.num_roles)
    payoffs.record(
        payoffs.missing_profiles(),
        np.zeros((1, game.num_roles)),
        np.zeros((1, game.num_roles)),
        np.ones(1, dtype=np.int64),
    )
    meta = [np.ones(1) for _ in game.roles]
    record = IterationRecord(0, [1] * game.num_roles, None, [[1.0]] * game.num_roles, {}, 0.0, 0.0, roles=game.roles)
    yield record, PSROState(populations, payoffs, meta)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    work = tmp_path_factory.mktemp("play")
    uri = f"sqlite:///{work}/mlflow.db"
    previous = os.getcwd()
    os.chdir(work)  # the store's default artifact root (./mlruns) lands here
    try:
        kuhn = PSROConfig(game="kuhn_poker", iterations=2, tracking_uri=uri, experiment="kuhn")
        connect_four = PSROConfig(
            game=CONNECT_FOUR, oracle="dqn", iterations=1, tracking_uri=uri, experiment="connect_four"
        )
        runs = {
            "kuhn": _track(kuhn, iterate_psro_local(kuhn)),
            "connect_four": _track(connect_four, _uniform_only(connect_four)),
        }
    finally:
        os.chdir(previous)
    return uri, runs


def _exact_outcomes(checkpoint, role: int) -> tuple[float, float, float]:
    """P(win), P(draw) and the expected return of `role`'s final mixture against uniform play,
    from Kuhn poker's tree: each terminal weighted by chance and every player's reach."""
    tree = build_tree("kuhn_poker")
    tables = [
        checkpoint.populations[p].tables if p == role else tree.players[p].uniform_policy()[None]
        for p in range(tree.num_players)
    ]
    weights = [checkpoint.meta_strategy[p] if p == role else np.ones(1) for p in range(tree.num_players)]
    weight = tree.chance_reach.copy()
    for player, reach in zip(tree.players, mixed_reach(tree, tables, weights)):
        weight *= reach[player.terminal_seq]
    utility = tree.utilities[:, role]
    return float(weight[utility > 0].sum()), float(weight[utility == 0].sum()), float(weight @ utility)


def test_kuhn_outcomes_match_the_tree_within_four_standard_errors(store):
    uri, runs = store
    checkpoint = load_checkpoint(uri, runs["kuhn"])
    assert [len(p) for p in checkpoint.populations] == [3, 3]
    assert all(np.count_nonzero(m) > 1 for m in checkpoint.meta_strategy)  # a real mixture, not one member
    games = 4000
    results = play_vs_uniform(checkpoint, games, seed=1)
    assert [r.role for r in results] == ["player_0", "player_1"]
    for role, result in enumerate(results):
        assert result.wins + result.draws + result.losses == games
        win, draw, mean = _exact_outcomes(checkpoint, role)
        assert draw == 0 and result.draws == 0  # Kuhn poker never ties
        assert abs(result.win_rate - win) < 4 * np.sqrt(win * (1 - win) / games), (role, result, win)
        assert abs(result.mean_return - mean) < 4 * result.mean_return_stderr, (role, result, mean)


def test_uniform_against_uniform_mirrors_across_the_seats_of_connect_four(store):
    """Both requests play uniform against uniform: seat 0's wins are the first mover's wins, and
    so are seat 1's losses."""
    uri, runs = store
    games = 500
    first, second = play_vs_uniform(load_checkpoint(uri, runs["connect_four"]), games, seed=2)
    assert (first.role, second.role) == ("player_0", "player_1")
    for result in (first, second):
        assert result.wins + result.draws + result.losses == games
        assert result.draws < result.wins and result.draws < result.losses  # uniform play rarely fills the board
    for mine, theirs in ((first.wins, second.losses), (first.losses, second.wins)):
        p, q = mine / games, theirs / games
        assert abs(p - q) < 4 * np.sqrt((p * (1 - p) + q * (1 - q)) / games), (first, second)
    assert abs(first.mean_return + second.mean_return) < 4 * np.hypot(
        first.mean_return_stderr, second.mean_return_stderr
    )


def test_the_command_line_plays_the_experiments_newest_finished_run(store):
    """Newer runs that are unfinished, or finished but not `psro run` runs, are passed over."""
    uri, runs = store
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("connect_four").experiment_id
    later = client.get_run(runs["connect_four"]).info.start_time + 1000
    running = client.create_run(experiment, start_time=later, tags={layout.COMMITTED_TAG: "0"}).info.run_id
    evaluation = client.create_run(experiment, start_time=later + 1000).info.run_id
    client.set_terminated(evaluation, status="FINISHED")
    try:
        result = subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "play_vs_uniform.py"),
                "--tracking-uri",
                uri,
                "--experiment",
                "connect_four",
                "--games",
                "50",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        client.delete_run(running)
        client.delete_run(evaluation)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith(f"run {runs['connect_four']}: {CONNECT_FOUR}, iteration 0, populations 1x1")
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert sorted(rows) == ["player_0", "player_1"]
    for role, row in rows.items():
        assert row[1] == role and sum(int(count) for count in row[2:5]) == 50


BAD_INPUTS = [
    (
        ["--run-id", "0123456789abcdef0123456789abcdef"],
        "no MLflow run '0123456789abcdef0123456789abcdef' in sqlite:///",
    ),
    (["--experiment", "nothing-here"], "no experiment 'nothing-here' in sqlite:///"),
    (["--games", "1"], "--games 1: play 2 or more"),
]


@pytest.mark.parametrize("args,message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_fails_with_one_line(store, capsys, args, message):
    uri, _ = store
    assert main(["--tracking-uri", uri, *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("error: "), captured
    assert message in captured.err


def test_a_missing_store_is_named_and_not_created(tmp_path, capsys):
    assert main(["--tracking-uri", f"sqlite:///{tmp_path}/nowhere.db"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no MLflow store at" in err and "nowhere.db" in err
    assert not (tmp_path / "nowhere.db").exists()


def test_a_uri_mlflow_cannot_open_fails_with_one_line(capsys):
    assert main(["--tracking-uri", "foo://bar", "--run-id", "0123456789abcdef0123456789abcdef"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --tracking-uri foo://bar: ") and "unsupported URI" in err, (
        err
    )
