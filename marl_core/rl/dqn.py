"""Double DQN with legal-action masks, read top to bottom: replay buffer, trainer (hyperparameters: `rl.settings`).

The trainer never steps an environment. Rollout workers act with `trainer.policy` (or a copy
rebuilt from its weights), hand transitions back as `Experience`, and the trainer:

1. `add(experience)`: stores them in a replay ring buffer, counts environment steps, and moves
   epsilon along its linear schedule (epsilon is a buffer of the policy, so it ships with the
   weights);
2. `update()`: does one gradient step for every `train_every` environment steps seen since
   `learning_starts`, however the experience arrived (one big batch or many small ones).

Each gradient step regresses Q(s, a) onto r + gamma * Q_target(s', a*) with a squared loss, where
a* is the best *legal* next action (masked by `next_mask`; with `double=True` chosen by the
online network, as in van Hasselt et al. 2016) and terminal transitions do not bootstrap.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from marl_core.rl import Algorithm
from marl_core.rl.batch import Experience
from marl_core.rl.networks import masked_argmax, mlp
from marl_core.rl.policy import NetworkPolicy
from marl_core.rl.sampling import uniform_legal
from marl_core.rl.settings import DQNConfig


class QPolicy(NetworkPolicy):
    """Epsilon-greedy over legal actions on a Q-network.

    With probability epsilon a sample takes a uniformly random legal action, otherwise the legal
    action of highest Q-value (ties to the lowest index). While it trains, epsilon follows the
    schedule (the `epsilon` buffer); the policy it stands for, as a population member and in
    evaluation (`explore=False`), uses the fixed `epsilon_eval`, greedy by default. Extras: none.
    """

    def __init__(self, obs_size: int, num_actions: int, config: DQNConfig):
        super().__init__(obs_size, num_actions)
        self.q = mlp(obs_size, config.hidden, num_actions, nn.ReLU)
        self.register_buffer("epsilon", torch.tensor(float(config.epsilon_start)))
        self.epsilon_eval = config.epsilon_eval

    def _greedy(self, obs: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        obs_t, mask_t = self._tensors(obs, mask)
        with torch.inference_mode():
            return masked_argmax(self.q(obs_t), mask_t).numpy(), mask_t.numpy()

    def act(self, obs, mask, explore, generator):
        greedy, mask = self._greedy(obs, mask)
        if explore:
            epsilon = float(self.epsilon)
        elif self.epsilon_eval == 0:
            return greedy, {}
        else:
            epsilon = self.epsilon_eval
        random = generator.random(len(greedy)) < epsilon
        return np.where(random, uniform_legal(mask, generator), greedy), {}

    def action_probs(self, obs, mask):
        greedy, mask = self._greedy(obs, mask)
        probs = self.epsilon_eval * mask / mask.sum(axis=1, keepdims=True)
        probs[np.arange(len(greedy)), greedy] += 1.0 - self.epsilon_eval
        return probs


class Transitions(NamedTuple):
    """A sampled minibatch as tensors."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor
    next_mask: torch.Tensor
    done: torch.Tensor


class ReplayBuffer:
    """A numpy ring buffer: once full, new transitions overwrite the oldest."""

    FIELDS = ("obs", "action", "reward", "next_obs", "next_mask", "done")

    def __init__(self, capacity: int, obs_size: int, num_actions: int):
        self.capacity = capacity
        self.obs = np.zeros((capacity, obs_size), np.float32)
        self.action = np.zeros(capacity, np.int64)
        self.reward = np.zeros(capacity, np.float32)
        self.next_obs = np.zeros((capacity, obs_size), np.float32)
        self.next_mask = np.zeros((capacity, num_actions), np.bool_)
        self.done = np.zeros(capacity, np.bool_)
        self.size = 0  # transitions held
        self.position = 0  # where the next one goes

    def __len__(self) -> int:
        return self.size

    def add(self, experience: Experience) -> None:
        n = min(len(experience), self.capacity)  # more than fits: only the newest survive anyway
        if n == 0:
            return
        slots = (self.position + np.arange(n)) % self.capacity
        for name in self.FIELDS:
            getattr(self, name)[slots] = getattr(experience, name)[-n:]
        self.position = (self.position + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, generator: np.random.Generator) -> Transitions:
        index = generator.integers(self.size, size=batch_size)
        return Transitions(*(torch.from_numpy(getattr(self, name)[index]) for name in self.FIELDS))

    def state_dict(self) -> dict:
        """The filled part as tensors (so it loads with `torch.load(weights_only=True)`)."""
        arrays = {name: torch.from_numpy(getattr(self, name)[: self.size].copy()) for name in self.FIELDS}
        return {**arrays, "size": self.size, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.size, self.position = int(state["size"]), int(state["position"])
        for name in self.FIELDS:
            getattr(self, name)[: self.size] = state[name].numpy()


class DQNTrainer:
    """Owns the Q-network (inside `.policy`), its target copy, the optimizer and the replay buffer."""

    def __init__(self, obs_size: int, num_actions: int, config: DQNConfig | None = None):
        self.config = config = config or DQNConfig()
        with torch.random.fork_rng(devices=[]):  # seeded initialisation without touching global state
            torch.manual_seed(config.seed)
            self.policy = QPolicy(obs_size, num_actions, config)
        self.target = copy.deepcopy(self.policy.q).requires_grad_(False)
        self.optimizer = torch.optim.Adam(
            self.policy.q.parameters(), lr=config.lr, fused=True
        )  # fused: one kernel for all parameters (docs/performance.md)
        self.buffer = ReplayBuffer(config.buffer_size, obs_size, num_actions)
        self.generator = np.random.default_rng(config.seed)
        self.env_steps = 0
        self.gradient_steps = 0

    def epsilon(self) -> float:
        return linear_epsilon(self.config, self.env_steps)

    def add(self, experience: Experience) -> None:
        """Store transitions, count them as environment steps, and advance epsilon."""
        self.buffer.add(experience.validate())
        self.env_steps += len(experience)
        self.policy.epsilon.fill_(self.epsilon())

    def learn(self, experience: Experience) -> dict[str, float]:
        """The trainer interface a learner loop uses: store the experience, then train on it."""
        self.add(experience)
        return self.update()

    def update(self) -> dict[str, float]:
        """All gradient steps owed for the environment steps seen so far; returns their mean metrics."""
        return take_owed_gradient_steps(self, q_name="q")

    def _gradient_step(self) -> tuple[float, float]:
        c = self.config
        batch = self.buffer.sample(c.batch_size, self.generator)
        q = self.policy.q(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
        with torch.no_grad():
            next_q = self.target(batch.next_obs)
            chooser = self.policy.q(batch.next_obs) if c.double else next_q
            next_action = masked_argmax(chooser, batch.next_mask)  # only legal next actions
            next_value = next_q.gather(1, next_action[:, None]).squeeze(1)
            # A terminal next state may have no legal action at all: its value is 0, not a max.
            next_value = torch.where(batch.done, torch.zeros_like(next_value), next_value)
            target = batch.reward + c.gamma * next_value
        # Squared error, not Huber: Q must be the *mean* return. With card-game payoffs of +-2 a
        # Huber loss (delta 1) converges to a median-like value (Kuhn: 1.46 where the mean is
        # 0.65), and the greedy policy then picks the wrong actions.
        loss = F.mse_loss(q, target)
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.q.parameters(), c.max_grad_norm)
        self.optimizer.step()
        self.gradient_steps += 1
        if self.gradient_steps % c.target_update_interval == 0:
            self.target.load_state_dict(self.policy.q.state_dict())
        return loss.item(), q.mean().item()

    def state_dict(self) -> dict:
        """Everything needed to resume exactly: networks, optimizer, replay buffer, RNG, counters."""
        return {
            "policy": self.policy.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "generator": self.generator.bit_generator.state,
            "env_steps": self.env_steps,
            "gradient_steps": self.gradient_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        self.generator.bit_generator.state = state["generator"]
        self.env_steps = int(state["env_steps"])
        self.gradient_steps = int(state["gradient_steps"])


ALGORITHM = Algorithm(DQNConfig, DQNTrainer, QPolicy)


def linear_epsilon(config, env_steps: int) -> float:
    """Linear decay from epsilon_start to epsilon_end over the first epsilon_decay_steps steps."""
    fraction = min(env_steps / config.epsilon_decay_steps, 1.0)
    return config.epsilon_start + fraction * (config.epsilon_end - config.epsilon_start)


def owed_gradient_steps(learner) -> int:
    """Gradient steps owed for the environment steps seen: one per `train_every` after
    `learning_starts`, less those taken."""
    c = learner.config
    return max(0, learner.env_steps - c.learning_starts) // c.train_every - learner.gradient_steps


def take_owed_gradient_steps(learner, q_name: str) -> dict[str, float]:
    """One gradient step per `train_every` environment steps after `learning_starts`, however
    the steps arrived: a learner that got a big batch catches up, one that got a small one waits.
    `learner` is a replay learner (DQN, VDN/QMIX): `config`, `env_steps`, `gradient_steps`,
    `epsilon()` and `_gradient_step() -> (loss, mean Q)`."""
    owed = owed_gradient_steps(learner)
    losses, q_values = [], []
    for _ in range(owed):
        loss, q = learner._gradient_step()
        losses.append(loss)
        q_values.append(q)
    metrics = {
        "gradient_steps": float(learner.gradient_steps),
        "env_steps": float(learner.env_steps),
        "epsilon": learner.epsilon(),
        "updates": float(owed),
    }
    if losses:
        metrics.update({"loss": float(np.mean(losses)), q_name: float(np.mean(q_values))})
    return metrics
