"""A2C, synchronous advantage actor-critic (Mnih et al. 2016), read top to bottom (hyperparameters: `rl.settings`).

It acts with PPO's `ActorCriticPolicy` (masked softmax actor, state-value critic; extras `logp`
and `value`) and computes advantages with PPO's `compute_gae`, so the two differ only in the
update: A2C takes one gradient step on the whole batch, on the plain policy gradient
-log pi(a|s) * A, with no probability ratio and no clipping. That makes it cheaper per sample and
strictly on-policy: each batch must come from the current weights. With `gae_lambda=1` the
advantages are the classic n-step returns minus the value.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from marl_core.rl import Algorithm
from marl_core.rl.batch import Experience
from marl_core.rl.gradient_steps import LossStep, LossStepTrainer
from marl_core.rl.networks import log_softmax
from marl_core.rl.ppo import ActorCriticPolicy, compute_gae
from marl_core.rl.settings import A2CConfig


class A2CTrainer(LossStepTrainer):
    """Owns the actor-critic (inside `.policy`) and its RMSprop optimizer (as in the A2C paper)."""

    def __init__(self, obs_size: int, num_actions: int, config: A2CConfig | None = None):
        self.config = config = config or A2CConfig()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.policy = ActorCriticPolicy(obs_size, num_actions, config)
        self.optimizer = torch.optim.RMSprop(self.policy.parameters(), lr=config.lr, alpha=0.99, eps=1e-5)
        self.updates = 0

    def loss_steps(self, experience: Experience) -> Iterator[LossStep]:
        """One loss on the whole batch (`marl_core.rl.gradient_steps`)."""
        c = self.config
        experience.validate()
        if "value" not in experience.extras:
            raise ValueError("A2C needs extras 'value', recorded by ActorCriticPolicy.act")
        bootstrap = experience.last & ~experience.done
        next_value = np.zeros(len(experience), np.float32)
        if bootstrap.any():
            with torch.no_grad():
                next_value[bootstrap] = self.policy.value(torch.from_numpy(experience.next_obs[bootstrap])).numpy()
        advantages, returns = compute_gae(
            experience.reward,
            experience.extras["value"].astype(np.float64),
            next_value,
            experience.done,
            experience.last,
            c.gamma,
            c.gae_lambda,
        )
        obs, mask = torch.from_numpy(experience.obs), torch.from_numpy(experience.mask)
        action = torch.from_numpy(experience.action)
        advantages = torch.from_numpy(advantages.astype(np.float32))
        returns = torch.from_numpy(returns.astype(np.float32))
        if c.normalize_advantages and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

        logits, value = self.policy.logits_and_value(obs, mask)
        log_probs = log_softmax(logits)
        logp = log_probs.gather(1, action[:, None]).squeeze(1)
        policy_loss = -(logp * advantages).mean()
        value_loss = 0.5 * (value - returns).pow(2).mean()
        entropy = -(log_probs.exp() * log_probs).sum(dim=-1).mean()  # illegal actions add exactly 0
        loss = policy_loss + c.value_coef * value_loss - c.entropy_coef * entropy
        metrics = {
            "loss": loss.item(),
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy.item(),
        }
        yield LossStep(loss, len(experience), metrics)

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])


ALGORITHM = Algorithm(A2CConfig, A2CTrainer, ActorCriticPolicy)
