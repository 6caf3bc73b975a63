"""Figures people would rather look at than read: exploitability curves and payoff heatmaps."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _curve_figure(figure, axis, xlabel: str, ylabel: str, title: str, grid: str = "major"):
    """The finish every curve shares: labels, title, a light grid, the legend."""
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(alpha=0.3, which=grid)
    axis.legend()
    figure.tight_layout()
    return figure


def exploitability_curve(iterations, exploitability, nash_conv, title: str, xlabel: str = "PSRO iteration"):
    figure, axis = plt.subplots(figsize=(7, 4.2))
    axis.plot(iterations, exploitability, label="exploitability (NashConv / players)", lw=2)
    axis.plot(iterations, nash_conv, label="NashConv", lw=1, alpha=0.7)
    if min(list(exploitability) + [1]) > 0:
        axis.set_yscale("log")
    return _curve_figure(figure, axis, xlabel, "value", title)


def exploitability_against_time(seconds, exploitability, title: str):
    """Exploitability against wall time: what a user comparing oracles or settings asks first."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    axis.plot(seconds, exploitability, marker=".", lw=1.5, label="exploitability (NashConv / players)")
    if min(list(exploitability) + [1]) > 0:
        axis.set_yscale("log")
    xlabel = "wall seconds (a resumed run: time between its processes left out)"
    return _curve_figure(figure, axis, xlabel, "exploitability", title, grid="both")


def approx_exploitability_curve(iterations, approx, stderr, title: str, exact=None):
    """The approximate exploitability with 95% error bars (±1.96 standard errors), and where the
    game has a tree the exact curve `exact` = (iterations, values) on the same axes: the gap
    between them is how far the learned responses fall short of best responses (an approximate
    point sits at or below the exact one up to its error). Linear axes: an estimate may be negative."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    axis.errorbar(
        iterations,
        approx,
        yerr=1.96 * np.asarray(stderr, dtype=np.float64),
        fmt="o-",
        capsize=4,
        lw=2,
        label="approx_exploitability (±1.96 stderr)",
    )
    if exact is not None:
        axis.plot(*exact, lw=1.5, alpha=0.8, label="exploitability (exact)")
    return _curve_figure(figure, axis, "PSRO iteration", "exploitability", title)


def payoff_heatmap(payoff_mean: np.ndarray, meta_strategy, title: str):
    """Player 0's payoffs over (player 0 member, player 1 member); other players are averaged
    out by their meta-strategies so the figure stays two-dimensional for any number of players."""
    table = payoff_mean[0]
    for weights in reversed(meta_strategy[2:]):
        table = table @ np.asarray(weights)
    figure, axis = plt.subplots(figsize=(6.5, 5.5))
    limit = float(np.abs(table).max()) or 1.0
    image = axis.imshow(table, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
    figure.colorbar(image, ax=axis, label="player 0 expected return")
    axis.set_xlabel("player 1 population member")
    axis.set_ylabel("player 0 population member")
    axis.set_title(title if len(meta_strategy) <= 2 else f"{title}\n(players 2+ mixed by their meta-strategies)")
    figure.tight_layout()
    return figure


def close(figure) -> None:
    plt.close(figure)


def episode_return_curve(curves: dict[str, dict[int, float]], title: str):
    """Evaluation episode return per policy (and per agent against uniform play, where the run
    plays that) against environment steps: a MARL run's learning curve."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    for policy, points in sorted(curves.items()):
        steps = sorted(points)
        axis.plot(steps, [points[s] for s in steps], marker="o", label=policy)
    axis.set_xlabel("environment steps (joint steps x copies)")
    axis.set_ylabel("evaluation episode return (a policy: mean over its agents)")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    return figure


def staleness_histogram(counts: dict[int, int], title: str):
    """How many fragments learners took at each staleness (learner version minus the version
    that played the fragment): how far behind an asynchronous run's data was."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    staleness = sorted(counts)
    axis.bar(staleness, [counts[s] for s in staleness], width=0.8)
    axis.set_xlabel("staleness (optimizer steps between acting and learning)")
    axis.set_ylabel("fragments taken")
    axis.set_title(title)
    figure.tight_layout()
    return figure


def ratings_curve(curves: dict[str, tuple[list, list, list]], title: str):
    """Each player's skill rating (mu) against the generation, with a band of ±sigma:
    `curves` maps a player to (generations, mu, sigma)."""
    figure, axis = plt.subplots(figsize=(7, 4.2))
    for player, (generations, mu, sigma) in curves.items():
        mu, sigma = np.asarray(mu), np.asarray(sigma)
        (line,) = axis.plot(generations, mu, label=player, lw=1.8, marker="o", ms=3)
        axis.fill_between(generations, mu - sigma, mu + sigma, color=line.get_color(), alpha=0.15)
    axis.set_xlabel("generation")
    axis.set_ylabel("skill rating mu (band: ±sigma)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


def win_rate_heatmap(win_rates: np.ndarray, players: list[str], title: str):
    """Row player's win rate against column player (0.5 where they never met)."""
    size = max(4.0, 0.45 * len(players) + 2)
    figure, axis = plt.subplots(figsize=(size + 1, size))
    image = axis.imshow(win_rates, cmap="RdBu", vmin=0, vmax=1)
    axis.set_xticks(range(len(players)), players, rotation=90, fontsize=7)
    axis.set_yticks(range(len(players)), players, fontsize=7)
    axis.set_xlabel("opponent")
    axis.set_ylabel("player")
    axis.set_title(title)
    figure.colorbar(image, ax=axis, label="win rate")
    figure.tight_layout()
    return figure


def pbt_curves(
    scores: dict[int, dict[int, float]], values: dict[int, dict[int, dict]], lineage: list[dict], title: str
):
    """A PBT run: each member's score against the round, an arrow where it copied another
    member (from the source's score to its own next one), and below, each numeric mutated
    hyperparameter per member (log scale where it spans a decade)."""
    names = sorted(
        {
            name
            for by_round in values.values()
            for v in by_round.values()
            for name, x in v.items()
            if isinstance(x, (int, float))
        }
    )
    figure, axes = plt.subplots(1 + len(names), 1, figsize=(7, 3.2 * (1 + len(names))), sharex=True, squeeze=False)
    colors = {}
    for member, by_round in sorted(scores.items()):
        rounds = sorted(by_round)
        (line,) = axes[0, 0].plot(rounds, [by_round[r] for r in rounds], marker="o", ms=3, label=f"member {member}")
        colors[member] = line.get_color()
    for entry in lineage:
        axes[0, 0].annotate(
            "",
            xy=(entry["step"] - 1, entry["source_score"]),
            xytext=(entry["step"] - 1, entry["member_score"]),
            arrowprops=dict(arrowstyle="->", color=colors.get(entry["member"], "grey"), alpha=0.7),
        )
    axes[0, 0].set_ylabel("greedy return (score)")
    axes[0, 0].set_title(title + "\n(arrows: a bottom member takes a top one's weights)")
    axes[0, 0].legend(fontsize=8)
    axes[0, 0].grid(alpha=0.3)
    for axis, name in zip(axes[1:, 0], names):
        for member, by_round in sorted(values.items()):
            rounds = sorted(r for r in by_round if name in by_round[r])
            axis.step(
                rounds,
                [by_round[r][name] for r in rounds],
                where="post",
                color=colors.get(member),
                label=f"member {member}",
            )
        spread = [v[name] for by_round in values.values() for v in by_round.values() if name in v and v[name] > 0]
        if spread and max(spread) / min(spread) > 10:
            axis.set_yscale("log")
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("round")
    figure.tight_layout()
    return figure
