"""Drawing actions with the caller's numpy Generator, which makes rollouts reproducible.

Numpy only, so the population members (`marl_core.policies`) act with the same draw as the
networks here without importing torch.
"""

from __future__ import annotations

import numpy as np


def sample_rows(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One action per row of [B, A] probabilities, by inverting each row's CDF.

    The uniform is scaled by the row total, so rows summing to slightly less than 1 are fine;
    zero-probability (illegal) actions occupy an empty interval and are never drawn. The clamp
    covers a product that rounds up to the total.
    """
    cdf = np.cumsum(probs, axis=1)
    u = rng.random(len(probs)) * cdf[:, -1]
    return np.minimum((cdf <= u[:, None]).sum(axis=1), probs.shape[1] - 1)


def uniform_legal(mask: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    """One uniformly random legal action per row: the argmax of iid uniforms over legal entries."""
    return np.where(mask, generator.random(mask.shape), -1.0).argmax(axis=1)
