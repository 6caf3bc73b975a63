"""OpenSpiel's own PSRO (``psro_v2``) as the benchmark baseline.

This runs ``open_spiel.python.algorithms.psro_v2.PSROSolver`` with the defaults of
OpenSpiel's ``examples/psro_v2_example.py`` (exact best-response oracle, 1000 simulations per
meta-game entry, Nash meta-solver, probabilistic training-strategy selector, no rectifier,
one new policy per player per iteration, non-symmetric), and only replaces the example's
fixed iteration count with a budget of algorithm time and an optional exploitability target.

psro_v2's logic is not copied or modified: the setup below mirrors the example's
``init_br_responder`` and ``gpsro_looper`` glue, and each step is ``solver.iteration()``.

Timing. ``elapsed_seconds`` counts algorithm time only: game loading, oracle and solver
construction (psro_v2 evaluates the initial meta-game there) and every ``iteration()``. The
clock is stopped while the NashConv is measured, because the measurement is ours, not part of
the algorithm, and is slow (a Python tree walk over all population members). The time cap is
checked before each iteration, so the last record may pass the cap by up to one iteration.

NashConv is measured exactly as the example does: ``policy_aggregator.PolicyAggregator``
over the solver's policies and meta-strategies, then ``exploitability.nash_conv``. (The
example prints this NashConv under the name "Exploitabilities"; here exploitability means
NashConv / number of players.)

Usage::

    python benchmarks/openspiel_psro.py --game leduc_poker --time-cap 600 [--stop-exploitability 0.05]

Requires cvxpy and ecos next to open_spiel (without ecos the Nash meta-solver returns None).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import time

import numpy as np
import pyspiel
from open_spiel.python import policy
from open_spiel.python.algorithms import exploitability, policy_aggregator
from open_spiel.python.algorithms.psro_v2 import best_response_oracle, psro_v2

# psro_v2_example.py defaults (flags of the same names), with the Nash meta-solver.
EXAMPLE_SETTINGS = {
    "sims_per_entry": 1000,
    "meta_strategy_method": "nash",
    "training_strategy_selector": "probabilistic",
    "rectifier": "",
    "number_policies_selected": 1,
    "symmetric_game": False,
    # gpsro_looper passes these fixed values; prd_* only matter for the PRD meta-solver.
    "prd_iterations": 50000,
    "prd_gamma": 1e-10,
    "sample_from_marginals": True,
}


class Stopwatch:
    """Accumulates algorithm time; paused while we measure so measuring costs the run nothing."""

    def __init__(self):
        self._total = 0.0
        self._started = None

    def start(self):
        self._started = time.perf_counter()

    def stop(self):
        self._total += time.perf_counter() - self._started
        self._started = None

    @property
    def seconds(self) -> float:
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return self._total + running


def build_solver(game_name: str, seed: int):
    """Game, BR oracle and PSROSolver set up as psro_v2_example.py's main() does for BR.

    The example loads the game turn-based with an explicit player count; here the player
    count is the game's own (``kuhn_poker(players=3)`` style strings still work).

    The example seeds only numpy, but psro_v2 samples its meta-game episodes with Python's
    ``random`` module (``psro_v2.utils.random_choice``), so the example's runs are not
    reproducible. Seeding both makes a seed mean one run.
    """
    np.random.seed(seed)
    random.seed(seed)
    game = pyspiel.load_game_as_turn_based(game_name)
    # init_br_responder: the initial policy of every player is the uniform TabularPolicy.
    random_policy = policy.TabularPolicy(game)
    oracle = best_response_oracle.BestResponseOracle(game=game, policy=random_policy)
    agents = [random_policy.__copy__() for _ in range(game.num_players())]
    # psro_v2 prints its configuration when constructed; keep the benchmark output readable.
    with contextlib.redirect_stdout(io.StringIO()):
        solver = psro_v2.PSROSolver(game, oracle, initial_policies=agents, **EXAMPLE_SETTINGS)
    return game, solver


def measure_nash_conv(game, solver) -> float:
    """NashConv of the current meta-strategy mixture, as gpsro_looper computes it."""
    aggregator = policy_aggregator.PolicyAggregator(game)
    aggregated = aggregator.aggregate(range(game.num_players()), solver.get_policies(), solver.get_meta_strategies())
    return float(exploitability.nash_conv(game, aggregated))


def record(iteration: int, clock: Stopwatch, game, solver) -> dict:
    nash_conv = measure_nash_conv(game, solver)  # the clock is stopped by the caller
    return {
        "iteration": iteration,
        "elapsed_seconds": clock.seconds,
        "nash_conv": nash_conv,
        "exploitability": nash_conv / game.num_players(),
    }


def _target_reached(entry: dict, stop_exploitability: float | None) -> bool:
    return stop_exploitability is not None and entry["exploitability"] <= stop_exploitability


def run_openspiel_psro(
    game_name: str = "leduc_poker",
    time_cap_seconds: float = 600.0,
    stop_exploitability: float | None = None,
    seed: int = 1,
    on_record=None,
) -> list[dict]:
    """Run psro_v2 until ``time_cap_seconds`` of algorithm time or the exploitability target.

    Returns one record per iteration, iteration 0 being the state after initialisation:
    ``{"iteration", "elapsed_seconds", "nash_conv", "exploitability"}``. ``elapsed_seconds``
    includes setup and excludes measurement. ``on_record``, if given, is called with each
    record as soon as it exists (the command line uses it to print progress).
    """
    clock = Stopwatch()
    clock.start()
    game, solver = build_solver(game_name, seed)
    clock.stop()
    records = [record(0, clock, game, solver)]
    if on_record:
        on_record(records[-1])
    while clock.seconds < time_cap_seconds and not _target_reached(records[-1], stop_exploitability):
        clock.start()
        solver.iteration()
        clock.stop()
        records.append(record(len(records), clock, game, solver))
        if on_record:
            on_record(records[-1])
    return records


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="OpenSpiel psro_v2 benchmark baseline.")
    parser.add_argument("--game", default="leduc_poker", help="OpenSpiel game string")
    parser.add_argument(
        "--time-cap", type=float, default=600.0, help="seconds of algorithm time (measurement excluded)"
    )
    parser.add_argument(
        "--stop-exploitability",
        type=float,
        default=None,
        help="stop once exploitability (NashConv / players) is at most this",
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    wall_start = time.perf_counter()

    def show(entry):
        print(
            f"iteration {entry['iteration']:4d}  elapsed {entry['elapsed_seconds']:8.2f} s  "
            f"nash_conv {entry['nash_conv']:.6f}  exploitability {entry['exploitability']:.6f}  "
            f"(wall {time.perf_counter() - wall_start:.1f} s)",
            flush=True,
        )

    run_openspiel_psro(args.game, args.time_cap, args.stop_exploitability, args.seed, on_record=show)


if __name__ == "__main__":
    main()
