"""The acting side of an RL agent, shared by rollout workers and trainers.

A `NetworkPolicy` is a torch module that maps a batch of observations and legal-action masks to actions.
Rollout workers rebuild one from `(obs_size, num_actions, config)` and the weights a trainer
published, then call `act` every environment step; so acting works on numpy arrays, runs under
`torch.inference_mode()`, and has no per-sample Python loops. All randomness comes from the
numpy Generator the caller passes, which makes rollouts reproducible.

`get_weights` returns the state_dict, buffers included: exploration state such as DQN's epsilon is
a buffer, so a worker that loads the weights explores exactly as the trainer intends.
"""

from __future__ import annotations

import abc

import numpy as np
import torch
from torch import nn


class NetworkPolicy(nn.Module, abc.ABC):
    """Batched acting over legal actions, plus the distribution the policy stands for."""

    def __init__(self, obs_size: int, num_actions: int):
        super().__init__()
        self.obs_size = obs_size
        self.num_actions = num_actions

    @abc.abstractmethod
    def act(
        self, obs: np.ndarray, mask: np.ndarray, explore: bool, generator: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions [B] int64 for obs [B, O] and mask [B, A], and per-sample extras for the trainer.

        `explore=False` is the deterministic policy (greedy / argmax) used for evaluation.
        """

    @abc.abstractmethod
    def action_probs(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The policy this network means, [B, A] float64: illegal actions exactly 0, rows sum to 1."""

    def get_weights(self) -> dict[str, torch.Tensor]:
        """Detached copies of all parameters and buffers on the CPU (safe to ship while training
        goes on, to workers that may have no GPU). A module shared by two heads (an actor-critic's
        trunk) appears under both names as one tensor, so it is copied and shipped once."""
        copies: dict[tuple, torch.Tensor] = {}
        weights = {}
        for name, value in self.state_dict().items():
            alias = (value.data_ptr(), value.dtype, value.shape, value.stride())
            if alias not in copies:
                copies[alias] = value.detach().to("cpu", copy=True)
            weights[name] = copies[alias]
        return weights

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.load_state_dict(weights)

    def _tensors(self, obs: np.ndarray, mask: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """numpy -> torch without copying when the input already has the right dtype."""
        obs = np.ascontiguousarray(obs, dtype=np.float32)
        mask = np.ascontiguousarray(mask, dtype=np.bool_)
        if obs.shape != (len(obs), self.obs_size) or mask.shape != (len(obs), self.num_actions):
            raise ValueError(
                f"expected obs [B, {self.obs_size}] and mask [B, {self.num_actions}], got {obs.shape} and {mask.shape}"
            )
        # Checked in numpy: every torch call costs dispatch overhead on the per-step path. A
        # policy of continuous actions has masks of width 0: nothing to check.
        if self.num_actions and not mask.any(axis=1).all():
            raise ValueError("every mask row needs at least one legal action")
        return torch.from_numpy(obs), torch.from_numpy(mask)
