"""A population member that is a torch network, and the settings that rebuild it around its weights.

The network is the acting side of an RL algorithm (`marl_core.rl`); the member means the
distribution its network gives (`action_probs`: greedy for a Q-network, the masked softmax for an
actor), never the exploration it trained with. On a game whose tree fits in memory it may also
carry its tabular form (`marl_core.policies.tabularize`), so the exact methods can use it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from marl_core.policies.base import Observations, Policy


class NeuralPolicy(Policy):
    kind: ClassVar[str] = "neural"

    def __init__(
        self,
        algorithm: str,
        config: dict,
        obs_size: int,
        num_actions: int,
        network=None,
        table: np.ndarray | None = None,
    ):
        from marl_core.rl import acting_network

        self.algorithm = algorithm
        self.config = dict(config)  # the algorithm's settings, as JSON
        self.obs_size = obs_size
        self.num_actions = num_actions
        if network is None:
            network = acting_network(algorithm, obs_size, num_actions, config)
        self.network = network
        self.table = table

    @classmethod
    def of(cls, algorithm: str, config, network, table: np.ndarray | None = None) -> NeuralPolicy:
        """A member made of a trained network (a copy: training may go on); `config` is the
        algorithm's settings (a pydantic model or its JSON)."""
        import copy

        config = config.model_dump(mode="json") if hasattr(config, "model_dump") else config
        return cls(algorithm, config, network.obs_size, network.num_actions, copy.deepcopy(network), table)

    @property
    def tabular(self) -> np.ndarray | None:
        return self.table

    def action_probs(self, batch: Observations) -> np.ndarray:
        return self.network.action_probs(batch.obs, batch.mask)

    def description(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "algorithm": self.algorithm,
            "config": self.config,
            "obs_size": self.obs_size,
            "num_actions": self.num_actions,
        }

    def weights(self) -> dict[str, Any]:
        return self.network.get_weights()

    def load_weights(self, weights: dict) -> NeuralPolicy:
        self.network.set_weights(weights)
        return self
