"""What every multi-agent learner offers the MARL training loop (and rollout workers)."""

from __future__ import annotations

from typing import Protocol

from marl_core.marl.batch import JointExperience
from marl_core.rl.policy import NetworkPolicy


class MARLLearner(Protocol):
    """A multi-agent learner.

    `policies` are the acting networks, one per policy id of the layout the learner was built
    for: agents mapped to one id share that one network (parameter sharing). Rollout workers
    act with copies of them; their weights are what a checkpoint of the population holds.
    """

    policies: dict[str, NetworkPolicy]

    def learn(self, batch: JointExperience) -> dict[str, float]:
        """Train on one segment collected with (a recent copy of) `policies`; return scalar metrics."""

    def state_dict(self) -> dict:
        """Everything needed to resume training exactly (networks, optimizers, buffers, counters),
        as tensors and plain values that `torch.load(weights_only=True)` reads back."""

    def load_state_dict(self, state: dict) -> None: ...
