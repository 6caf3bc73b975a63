"""The acting side of an RL agent, shared by rollout workers and trainers.

A `Policy` is a torch module that maps a batch of observations and legal-action masks to actions.
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

from marl_core.policies import sample_rows
from marl_core.rl.networks import features, masked_argmax, masked_logits, mlp
from marl_core.rl.settings import DQNConfig, PPOConfig


class Policy(nn.Module, abc.ABC):
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
        """Detached copies of all parameters and buffers (safe to ship while training goes on)."""
        return {name: value.detach().clone() for name, value in self.state_dict().items()}

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
        # Checked in numpy: every torch call costs dispatch overhead on the per-step path.
        if not mask.any(axis=1).all():
            raise ValueError("every mask row needs at least one legal action")
        return torch.from_numpy(obs), torch.from_numpy(mask)


def _uniform_legal(mask: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    """One uniformly random legal action per row: the argmax of iid uniforms over legal entries."""
    return np.where(mask, generator.random(mask.shape), -1.0).argmax(axis=1)


class QPolicy(Policy):
    """Epsilon-greedy over legal actions on a Q-network; it means the greedy policy.

    With probability `epsilon` a sample takes a uniformly random legal action, otherwise the legal
    action of highest Q-value (ties to the lowest index). Extras: none.
    """

    def __init__(self, obs_size: int, num_actions: int, config: DQNConfig):
        super().__init__(obs_size, num_actions)
        self.q = mlp(obs_size, config.hidden, num_actions, nn.ReLU)
        self.register_buffer("epsilon", torch.tensor(float(config.epsilon_start)))

    def _greedy(self, obs: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        obs_t, mask_t = self._tensors(obs, mask)
        with torch.inference_mode():
            return masked_argmax(self.q(obs_t), mask_t).numpy(), mask_t.numpy()

    def act(self, obs, mask, explore, generator):
        greedy, mask = self._greedy(obs, mask)
        if not explore:
            return greedy, {}
        random = generator.random(len(greedy)) < float(self.epsilon)
        return np.where(random, _uniform_legal(mask, generator), greedy), {}

    def action_probs(self, obs, mask):
        greedy, _ = self._greedy(obs, mask)
        probs = np.zeros((len(greedy), self.num_actions))
        probs[np.arange(len(greedy)), greedy] = 1.0
        return probs


class ActorCriticPolicy(Policy):
    """A masked-softmax actor and a state-value critic, separate or on a shared trunk.

    Exploring samples from the masked softmax; `explore=False` takes its argmax. Extras: `logp`
    (log-probability of the chosen action) and `value` (critic estimate), which PPO needs from
    the moment of acting.
    """

    def __init__(self, obs_size: int, num_actions: int, config: PPOConfig):
        super().__init__(obs_size, num_actions)
        hidden = config.hidden
        if config.shared_trunk:
            trunk = features(obs_size, hidden, nn.Tanh)
            self.actor = nn.Sequential(trunk, nn.Linear(hidden[-1], num_actions))
            self.critic = nn.Sequential(trunk, nn.Linear(hidden[-1], 1))
        else:
            self.actor = mlp(obs_size, hidden, num_actions, nn.Tanh)
            self.critic = mlp(obs_size, hidden, 1, nn.Tanh)
        self._orthogonal_init()

    def _orthogonal_init(self) -> None:
        """Orthogonal weights, zero biases; a tiny actor output layer so the first policy is
        close to uniform over legal actions (the PPO implementation details of Huang et al.)."""
        for layer in self.modules():
            if isinstance(layer, nn.Linear):
                nn.init.orthogonal_(layer.weight, gain=np.sqrt(2))
                nn.init.zeros_(layer.bias)
        nn.init.orthogonal_(self.actor[-1].weight, gain=0.01)
        nn.init.orthogonal_(self.critic[-1].weight, gain=1.0)

    def logits(self, obs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Masked actor logits: illegal actions have probability exactly 0."""
        return masked_logits(self.actor(obs), mask)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def act(self, obs, mask, explore, generator):
        obs_t, mask_t = self._tensors(obs, mask)
        with torch.inference_mode():
            log_probs = torch.log_softmax(self.logits(obs_t, mask_t), dim=-1)
            value = self.value(obs_t)
        if explore:
            action = sample_rows(log_probs.double().exp().numpy(), generator)
        else:
            action = masked_argmax(log_probs, mask_t).numpy()
        logp = log_probs.numpy()[np.arange(len(action)), action]
        return action, {"logp": logp, "value": value.numpy()}

    def action_probs(self, obs, mask):
        obs_t, mask_t = self._tensors(obs, mask)
        with torch.inference_mode():
            return torch.softmax(self.logits(obs_t, mask_t).double(), dim=-1).numpy()
