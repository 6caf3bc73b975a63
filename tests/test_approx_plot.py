"""The approximate-exploitability figure a run logs to MLflow.

Runs are tracked by the real PSROTracker into a local SQLite store, from hand-made iterations
(real `IterationRecord`s and populations, no PSRO loop): every figure the tracker logs is
captured as it is made, and its error bars are compared with the metrics MLflow holds.
"""

from __future__ import annotations

import matplotlib.image
import mlflow
import numpy as np
import pytest
from matplotlib.container import ErrorbarContainer

from flows.runtime.run import load_resumed
from flows.scenarios.psro import PSRO
from flows.tracking import layout, plots
from flows.tracking.psro_tracker import PSROTracker, running_seconds
from marl_core.empirical_game.payoffs import PayoffTable
from marl_core.games.exploitability import nash_conv
from marl_core.games.tree import build_tree
from marl_core.policies.base import UniformPolicy
from marl_core.policies.population import Population
from marl_core.policies.tabular import TabularPolicy
from marl_core.psro.config import PSROConfig
from marl_core.psro.steps import ApproxNashConv, IterationRecord, PSROState

ADVERSARY = {
    "game": "pettingzoo:mpe2.simple_adversary_v3",
    "roles": {"adversary": "adversary", "agent": "agent"},
    "oracle": "ppo",
}


def _iterations(config: PSROConfig, approx_every: int, count: int):
    """(record, state) per iteration: a uniform member joins each population; the exact NashConv
    is the mixture's own where the game has a tree, the approximate one made up every
    `approx_every` iterations (0: never)."""
    game = config.psro_game
    tree = build_tree(config.game) if game.has_tree else None
    rng = np.random.default_rng(5)
    populations = None
    payoffs = PayoffTable(game.num_roles)
    for iteration in range(count):
        members = [
            TabularPolicy(config.game, r, tree.players[r].uniform_policy()) if tree else UniformPolicy()
            for r in range(game.num_roles)
        ]
        if populations is None:
            populations = [Population.of(role, [member]) for role, member in zip(game.roles, members)]
        else:
            populations = [population.added(member) for population, member in zip(populations, members)]
        payoffs = payoffs.copy()
        payoffs.grow(tuple(len(p) for p in populations))
        missing = payoffs.missing_profiles()
        mean = rng.normal(size=(len(missing), game.num_roles))
        payoffs.record(missing, mean, np.full_like(mean, 0.1), np.full(len(missing), 10))
        meta = [rng.dirichlet(np.ones(len(p))) for p in populations]
        report = nash_conv(tree, [p.tables for p in populations], meta) if tree else None
        approx = None
        if approx_every and iteration % approx_every == 0:
            gains, gains_stderr = rng.uniform(0, 1, game.num_roles), rng.uniform(0.01, 0.2, game.num_roles)
            total, total_stderr = float(gains.sum()), float(np.sqrt((gains_stderr**2).sum()))
            approx = ApproxNashConv(
                total,
                total_stderr,
                total / game.num_roles,
                total_stderr / game.num_roles,
                gains.tolist(),
                gains_stderr.tolist(),
            )
        record = IterationRecord(
            iteration,
            [len(p) for p in populations],
            report,
            [m.tolist() for m in meta],
            {},
            0.1,
            0.1 * (iteration + 1),
            approx=approx,
            roles=game.roles,
        )
        yield record, PSROState(populations, payoffs, meta, iteration)


@pytest.fixture
def figures(monkeypatch):
    """Every figure the tracker makes, by the plots function that made it."""
    made: dict[str, list] = {}
    for name in ("exploitability_curve", "exploitability_against_time", "approx_exploitability_curve"):
        original = getattr(plots, name)

        def capture(*args, _original=original, _name=name, **kwargs):
            figure = _original(*args, **kwargs)
            made.setdefault(_name, []).append(figure)
            return figure

        monkeypatch.setattr(plots, name, capture)
    return made


@pytest.fixture
def uri(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the store's default artifact root (./mlruns) lands here
    return f"sqlite:///{tmp_path}/mlflow.db"


def _track(config: PSROConfig, iterations, resume=None, finish: bool = True) -> str:
    with PSROTracker(config, resume=resume) as tracker:
        for record, state in iterations:
            tracker.log_iteration(record, state)
        if finish:
            tracker.finish(state)
    return tracker.run_id


def _history(client, run_id: str, name: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, name)}


def _plots(client, run_id: str) -> set[str]:
    return {artifact.path for artifact in client.list_artifacts(run_id, "plots")}


def _error_bars(figure):
    """(x, y, lower, upper) of the figure's one error-bar series."""
    axis = figure.axes[0]
    (container,) = [c for c in axis.containers if isinstance(c, ErrorbarContainer)]
    line, _, (bars,) = container.lines
    segments = np.array(bars.get_segments())  # per point [[x, y - e], [x, y + e]]
    return line.get_xdata(), line.get_ydata(), segments[:, 0, 1], segments[:, 1, 1]


def _check_figure(figure, client, run_id: str) -> None:
    """The figure's points and ±1.96 stderr bars are exactly the approx metrics the run logged."""
    approx = _history(client, run_id, "approx_exploitability")
    stderr = _history(client, run_id, "approx_exploitability_stderr")
    steps = sorted(approx)
    value, error = np.array([approx[s] for s in steps]), np.array([stderr[s] for s in steps])
    assert (error > 0).all()
    x, y, lower, upper = _error_bars(figure)
    np.testing.assert_array_equal(x, steps)
    np.testing.assert_array_equal(y, value)
    np.testing.assert_allclose(lower, value - 1.96 * error, rtol=0, atol=1e-12)
    np.testing.assert_allclose(upper, value + 1.96 * error, rtol=0, atol=1e-12)


def _logged_png(client, run_id: str, tmp_path) -> np.ndarray:
    path = client.download_artifacts(run_id, layout.APPROX_EXPLOITABILITY_PLOT, str(tmp_path))
    return matplotlib.image.imread(path)


def test_a_resumed_tree_game_run_plots_every_approx_point_beside_the_exact_curve(uri, figures, tmp_path):
    """Kuhn poker, approx every 2 iterations; killed after iteration 2 and resumed: the figure
    holds the points of both processes, and the exact curve on the same axes."""
    config = PSROConfig(game="kuhn_poker", iterations=5, tracking_uri=uri, experiment="tree")
    iterations = list(_iterations(config, approx_every=2, count=6))
    run_id = _track(config, iterations[:3], finish=False)
    run_id = _track(config, iterations[3:], resume=load_resumed(PSRO, config, uri, run_id))
    client = mlflow.MlflowClient(tracking_uri=uri)

    assert _plots(client, run_id) == {
        layout.EXPLOITABILITY_PLOT,
        layout.EXPLOITABILITY_TIME_PLOT,
        layout.APPROX_EXPLOITABILITY_PLOT,
        layout.PAYOFF_HEATMAP,
    }
    (timed,) = figures["exploitability_against_time"]
    (line,) = timed.axes[0].get_lines()
    np.testing.assert_allclose(line.get_xdata(), [0.1 * (i + 1) for i in range(6)])
    np.testing.assert_array_equal(line.get_ydata(), [_history(client, run_id, "exploitability")[s] for s in range(6)])
    (figure,) = figures["approx_exploitability_curve"]
    assert sorted(_history(client, run_id, "approx_exploitability")) == [0, 2, 4]
    _check_figure(figure, client, run_id)
    exact = _history(client, run_id, "exploitability")
    (exact_line,) = [line for line in figure.axes[0].get_lines() if line.get_label() == "exploitability (exact)"]
    np.testing.assert_array_equal(exact_line.get_xdata(), sorted(exact))
    np.testing.assert_array_equal(exact_line.get_ydata(), [exact[s] for s in sorted(exact)])
    assert sorted(exact) == list(range(6))
    image = _logged_png(client, run_id, tmp_path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0  # a real picture, not a blank


def test_a_resumed_process_counts_on_from_where_the_last_one_stopped():
    assert running_seconds([2.0, 5.0, 9.0, 1.5, 4.0, 0.5]) == [2.0, 5.0, 9.0, 10.5, 13.0, 13.5]
    assert running_seconds([]) == []


def test_an_environment_without_a_tree_plots_the_approx_points_alone(uri, figures, tmp_path):
    config = PSROConfig(**ADVERSARY, iterations=3, tracking_uri=uri, experiment="adversary")
    run_id = _track(config, list(_iterations(config, approx_every=1, count=4)))
    client = mlflow.MlflowClient(tracking_uri=uri)

    assert _plots(client, run_id) == {layout.APPROX_EXPLOITABILITY_PLOT, layout.PAYOFF_HEATMAP}
    assert "exploitability_curve" not in figures
    (figure,) = figures["approx_exploitability_curve"]
    assert sorted(_history(client, run_id, "approx_exploitability")) == [0, 1, 2, 3]
    _check_figure(figure, client, run_id)
    assert [line.get_label() for line in figure.axes[0].get_lines() if not line.get_label().startswith("_")] == []
    assert _logged_png(client, run_id, tmp_path).std() > 0


def test_a_run_without_approx_points_logs_no_approx_figure(uri, figures):
    config = PSROConfig(game="kuhn_poker", iterations=2, tracking_uri=uri, experiment="exact")
    run_id = _track(config, list(_iterations(config, approx_every=0, count=3)))
    client = mlflow.MlflowClient(tracking_uri=uri)

    assert _plots(client, run_id) == {
        layout.EXPLOITABILITY_PLOT,
        layout.EXPLOITABILITY_TIME_PLOT,
        layout.PAYOFF_HEATMAP,
    }
    assert "approx_exploitability_curve" not in figures
