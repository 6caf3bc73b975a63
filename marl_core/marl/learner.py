"""A multi-agent learner: what it offers the MARL rounds, where it trains, and how its acting
networks reach the rollout workers.

Every learner of `marl_core.marl.MARL_ALGORITHMS` offers `MARLLearner`. The workers never call a
learner: they build a copy of each acting network once (`learner_specs`), and before each
request pull the newest weights its learner published into the pool's weight store, under the
network's policy id (`publish`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: torch comes with a learner, not with this module
    from marl_core.rl.policy import NetworkPolicy
    from marl_core.rollout.joint_experience import JointExperience
    from marl_core.rollout.worker import LearnerSpec


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


def resolve_device(device: str) -> str:
    """ "auto" -> "cuda" where torch sees a GPU, else "cpu"; "cuda" without one is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda': torch sees no GPU here; use 'auto' or 'cpu'")
    return device


def place(learner, device: str):
    """Move a fresh learner's networks (its trainers' policies) to `device`; before any step or
    loaded state, so its optimizers still hold the same parameters and load state onto them."""
    for network in learner.policies.values():
        network.to(device)
    return learner


# --- the acting networks, as the workers get them ------------------------------------------


def learner_specs(learner) -> dict[str, LearnerSpec]:
    """Policy id -> how a worker builds and refreshes that policy's acting network."""
    import copy

    from marl_core.rollout.worker import LearnerSpec, NetworkCopy

    # The workers' copies are built on the CPU, wherever the learner's networks live.
    return {
        policy: LearnerSpec(_weights_key(policy), NetworkCopy(copy.deepcopy(network).cpu()))
        for policy, network in learner.policies.items()
    }


def publish(learner, pool, version: int) -> None:
    """The learner's acting weights, as `version`, into the pool's weight store."""
    publish_weights(pool, version, {policy: network.get_weights() for policy, network in learner.policies.items()})


def publish_weights(pool, version: int, weights: dict) -> None:
    """Policy id -> acting weights, into the pool's weight store."""
    for policy, policy_weights in weights.items():
        pool.push(_weights_key(policy), version, policy_weights)


def _weights_key(policy: str) -> str:
    return f"marl/{policy}"
