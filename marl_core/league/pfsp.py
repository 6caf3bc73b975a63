"""Prioritized fictitious self-play (AlphaStar): opponents drawn with a weight that is a function
of the learner's win rate against each of them.

`pfsp(win_rates, weighting)` is AlphaStar's `pfsp`, with one difference its published pseudocode
and DI-engine share: where every weight is zero (every win rate 1.0 under `squared`, `linear` or
`linear_capped`; every win rate 0.0 or 1.0 under `variance`) they divide by zero or return NaN,
and here the draw falls back to uniform, which is what AlphaStar's own guard (`norm < 1e-10`)
was meant to do.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from marl_core.registry import Registry

Weighting = Callable[[np.ndarray], np.ndarray]

WEIGHTINGS: Registry[Weighting] = Registry("PFSP weighting")
WEIGHTINGS.add("squared", lambda x: (1 - x) ** 2, "(1-x)^2: the hardest opponents, strongly")
WEIGHTINGS.add("variance", lambda x: x * (1 - x), "x(1-x): opponents near an even match")
WEIGHTINGS.add("linear", lambda x: 1 - x, "1-x: the harder, the likelier")
WEIGHTINGS.add(
    "linear_capped", lambda x: np.minimum(0.5, 1 - x), "min(0.5, 1-x): every opponent it does not always beat, evenly"
)
WEIGHTINGS.add("uniform", lambda x: np.ones_like(x), "1: every opponent alike (fictitious self-play)")

# Below this the weights count as all zero: AlphaStar's threshold.
ZERO_WEIGHT = 1e-10


def pfsp(win_rates, weighting: str) -> np.ndarray:
    """Probabilities over the opponents whose win rates (of the learner against them) are given."""
    x = np.asarray(win_rates, dtype=np.float64)
    if x.ndim != 1 or not len(x):
        raise ValueError(f"PFSP needs at least one opponent's win rate, got {x.tolist()}")
    if np.any((x < 0) | (x > 1)) or not np.all(np.isfinite(x)):
        raise ValueError(f"win rates must lie in [0, 1], got {x.tolist()}")
    weights = WEIGHTINGS[weighting](x)
    total = weights.sum()
    if total < ZERO_WEIGHT:
        return np.full(len(x), 1.0 / len(x))
    return weights / total
