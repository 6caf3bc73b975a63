"""An average-policy network: a player's average strategy learned by supervised learning.

Neural CFR's members are these (`marl_core.neural_cfr`): the masked softmax of its logits over
the legal actions is the strategy, fitted to the strategies played. No RL algorithm trains it,
so it is not in `ALGORITHMS`; a stored member names it as `AVERAGE_POLICY` and
`marl_core.rl.acting_network` rebuilds it from its description.
"""

from __future__ import annotations

import numpy as np
import torch

from marl_core.rl.networks import log_softmax, masked_logits, mlp
from marl_core.rl.policy import NetworkPolicy
from marl_core.rl.sampling import sample_rows


class AveragePolicyNetwork(NetworkPolicy):
    """A player's average strategy: a softmax over the legal actions."""

    def __init__(self, obs_size: int, num_actions: int, hidden: tuple[int, ...]):
        super().__init__(obs_size, num_actions)
        self.hidden = tuple(hidden)
        self.logits = mlp(obs_size, self.hidden, num_actions)

    def settings(self) -> dict:
        """What `acting_network` rebuilds it from, beside its sizes."""
        return {"hidden": list(self.hidden)}

    def log_probs(self, obs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return log_softmax(masked_logits(self.logits(obs), mask))

    def action_probs(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        obs_t, mask_t = self._tensors(obs, mask)
        with torch.inference_mode():
            probs = self.log_probs(obs_t, mask_t).double().exp().numpy()
        probs = np.where(mask_t.numpy(), probs, 0.0)
        return probs / probs.sum(axis=1, keepdims=True)

    def act(self, obs, mask, explore, generator):
        return sample_rows(self.action_probs(obs, mask), generator).astype(np.int64), {}
