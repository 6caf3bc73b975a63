"""The population member: a `Policy` that any rollout worker can act with on any environment.

A policy answers one question for a batch of decision points: the probability of each action.
Acting samples from that distribution, so a member plays the same way in a rollout worker, in a
sampled evaluation and (where a game tree exists) in the exact computations that tabularize it.
What a learner does while it still explores (epsilon, entropy) belongs to the learner's network,
not to the member it becomes.

Two kinds exist: `TabularPolicy` (an information-state table of an OpenSpiel game) and
`NeuralPolicy` (a torch network plus the algorithm and settings that built it). Each is stored
as weights only, with a JSON description of how to rebuild it (`marl_core.policies.storage`).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from marl_core.rl.sampling import sample_rows


@dataclasses.dataclass(frozen=True)
class Observations:
    """A batch of decision points as a policy sees them.

    obs: [B, O] float32 flat observations; mask: [B, A] bool legal actions; infostates: the
    OpenSpiel information-state strings (what a tabular policy is keyed on), where the
    environment provides them (`OpenSpielEnv` puts them in each acting agent's info).
    """

    obs: np.ndarray
    mask: np.ndarray
    infostates: Sequence[str] | None = None

    def __len__(self) -> int:
        return len(self.mask)


class Policy(abc.ABC):
    kind: ClassVar[str]  # "tabular" or "neural": how `storage` rebuilds it

    @abc.abstractmethod
    def action_probs(self, batch: Observations) -> np.ndarray:
        """[B, A] float64: illegal actions exactly 0, each row sums to 1."""

    def act(self, batch: Observations, rng: np.random.Generator) -> np.ndarray:
        """One action per decision point, drawn from `action_probs` with the caller's generator."""
        return sample_rows(self.action_probs(batch), rng)

    @property
    def tabular(self) -> np.ndarray | None:
        """[I, A] in the game tree's information-state order, when this policy has that form."""
        return None

    @abc.abstractmethod
    def description(self) -> dict[str, Any]:
        """Everything but the weights, as JSON: what `storage.build_policy` needs to rebuild it."""

    @abc.abstractmethod
    def weights(self) -> dict[str, Any]:
        """The learned numbers only: arrays (tabular) or tensors (neural)."""


class UniformPolicy(Policy):
    """Every legal action equally likely: the first member of a population where no game tree
    gives it a table (on a tree game the same policy is a `TabularPolicy`)."""

    kind: ClassVar[str] = "uniform"

    def action_probs(self, batch: Observations) -> np.ndarray:
        mask = np.asarray(batch.mask, dtype=np.float64)
        return mask / mask.sum(axis=1, keepdims=True)

    def description(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def weights(self) -> dict[str, Any]:
        return {}
