"""PBT's exploit and explore steps, as Ray Tune's `PopulationBasedTraining` takes them, but over
a whole population at once (Tune's `synch=True`) and with a seeded generator.

At a perturbation point members are ranked by their metric. `quantiles` splits off the bottom
and top `quantile_fraction` (at least one member each, at most half the population each, as in
Tune). Every bottom member copies a top member chosen uniformly (exploit: its weights and its
hyperparameters), then `explore` changes the copied hyperparameters: with probability
`resample_probability` a value is drawn afresh from its mutation; otherwise a list value moves
one place up or down (staying within the list) and any other value is multiplied by one of
`perturbation_factors` (an integer stays an integer). A value that is not in its list is always
resampled. Each copy is one `LineageEntry`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from marl_core.pbt.settings import Distribution, PBTSettings


@dataclasses.dataclass(frozen=True)
class LineageEntry:
    """At training step `step`, member `member` took member `source`'s weights, and these
    hyperparameters (`before` -> `after`, the source's values explored)."""

    step: int
    member: int | str  # a member's index in its population (a league names its players)
    source: int | str
    before: dict[str, Any]
    after: dict[str, Any]
    member_score: float
    source_score: float


def quantiles(scores: Sequence[float], fraction: float, mode: str = "max") -> tuple[list[int], list[int]]:
    """(bottom, top) member indices, each the `fraction` of the population rounded up, at most
    half of it; worst first in `bottom`, best last in `top`. Ties keep the members' order."""
    if len(scores) <= 1:
        return [], []
    order = sorted(range(len(scores)), key=lambda i: scores[i] if mode == "max" else -scores[i])
    count = math.ceil(len(scores) * fraction)
    if count > len(scores) / 2:
        count = len(scores) // 2
    if count == 0:
        return [], []
    return order[:count], order[-count:]


def sample(mutation, rng: np.random.Generator):
    """A fresh value of a mutation: a list's element or a distribution's draw."""
    if isinstance(mutation, list):
        return copy.deepcopy(mutation[int(rng.integers(len(mutation)))])
    assert isinstance(mutation, Distribution)
    low, high = getattr(mutation, mutation.kind)
    if mutation.kind == "uniform":
        return float(rng.uniform(low, high))
    if mutation.kind == "loguniform":
        return float(np.exp(rng.uniform(np.log(low), np.log(high))))
    return int(rng.integers(low, high))


def explore(values: dict[str, Any], settings: PBTSettings, rng: np.random.Generator) -> dict[str, Any]:
    """`values` with every mutated hyperparameter resampled or perturbed; the rest as they were."""
    explored = dict(values)
    for name, mutation in settings.hyperparam_mutations.items():
        current = values[name]
        if isinstance(mutation, list):
            if rng.random() < settings.resample_probability or current not in mutation:
                explored[name] = sample(mutation, rng)
            else:
                index = mutation.index(current) + (-1 if rng.random() < 0.5 else 1)
                explored[name] = copy.deepcopy(mutation[min(max(index, 0), len(mutation) - 1)])
        elif rng.random() < settings.resample_probability:
            explored[name] = sample(mutation, rng)
        else:
            factor = settings.perturbation_factors[int(rng.integers(len(settings.perturbation_factors)))]
            explored[name] = (
                int(current * factor)
                if isinstance(current, int) and not isinstance(current, bool)
                else current * factor
            )
    return explored


def due(settings: PBTSettings, step: int) -> bool:
    """Whether training step `step` (counted from 1) is a perturbation point."""
    return step >= max(settings.burn_in_period, 1) and step % settings.perturbation_interval == 0


def exploit_and_explore(
    step: int,
    scores: Sequence[float],
    hyperparams: Sequence[dict[str, Any]],
    settings: PBTSettings,
    rng: np.random.Generator,
) -> list[LineageEntry]:
    """Who copies whom at this point and with what hyperparameters; the caller copies the
    weights (`source` -> `member`) and sets `after` as the member's hyperparameters. Every
    member's hyperparameters must name every mutated one."""
    for i, values in enumerate(hyperparams):
        missing = sorted(set(settings.hyperparam_mutations) - set(values))
        if missing:
            raise ValueError(f"member {i} has no value for the mutated hyperparameter(s) {missing}")
    bottom, top = quantiles(scores, settings.quantile_fraction, settings.mode)
    entries = []
    for member in bottom:
        source = top[int(rng.integers(len(top)))]
        after = explore(hyperparams[source], settings, rng)
        entries.append(
            LineageEntry(
                step, member, source, dict(hyperparams[member]), after, float(scores[member]), float(scores[source])
            )
        )
    return entries
