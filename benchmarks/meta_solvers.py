"""Seconds per meta-game solve, for every registered meta-solver, at the sizes PSRO reaches.

Two-player 150 x 150 (a long Leduc run) and three-player 30 x 30 x 30 tables with random
payoffs; the fastest of three solves is printed. Usage: python benchmarks/meta_solvers.py
"""

from __future__ import annotations

import time

import numpy as np

from marl_core.empirical_game.meta_solvers import META_SOLVERS

TABLES = {
    "2p 150x150 zero-sum": lambda rng: (lambda a: np.stack([a, -a]))(rng.uniform(-1, 1, (150, 150))),
    "3p 30x30x30 general-sum": lambda rng: rng.uniform(-1, 1, (3, 30, 30, 30)),
}


def fastest_of(solve, payoffs, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        solve(payoffs)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    rng = np.random.default_rng(0)
    tables = {name: make(rng) for name, make in TABLES.items()}
    print(f"{'solver':<16}" + "".join(f"{name:>26}" for name in tables))
    for name, solver in sorted(META_SOLVERS.items()):
        cells = []
        for payoffs in tables.values():
            if solver.two_player_zero_sum_only and payoffs.shape[0] != 2:
                cells.append(f"{'n/a':>26}")
            else:
                cells.append(f"{fastest_of(solver.solve, payoffs):>25.3f}s")
        print(f"{name:<16}" + "".join(cells))


if __name__ == "__main__":
    main()
