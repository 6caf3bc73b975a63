"""IMPALA and APPO: actor-critics that learn from what an older policy played (hyperparameters: `rl.settings`).

Both act with PPO's `ActorCriticPolicy`, which records the behaviour policy's log-probability
of each action (`logp`) when it acts; at learning time the current network gives the target
policy's, and V-trace (`marl_core.rl.vtrace`) turns the two into value targets and
policy-gradient advantages. So a batch may come from weights a few updates old: the
asynchronous learners (`marl_core.distributed`) train while their workers keep playing.

- IMPALA takes one gradient step per batch: -log pi(a|x) * advantage, a squared error to the
  V-trace targets and an entropy bonus, V-trace computed in the same forward pass.
- APPO computes V-trace once per batch, with the network as the batch arrives, then runs
  `epochs` passes of minibatches over PPO's clipped surrogate, the ratio pi/mu taken against
  the behaviour policy.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from marl_core.rl import Algorithm
from marl_core.rl.batch import Experience
from marl_core.rl.gradient_steps import LossStep, LossStepTrainer
from marl_core.rl.networks import log_softmax
from marl_core.rl.ppo import ActorCriticPolicy, clipped_surrogate_loss
from marl_core.rl.settings import APPOConfig, IMPALAConfig
from marl_core.rl.vtrace import VTrace, VTraceClipping, vtrace


class IMPALATrainer(LossStepTrainer):
    """Owns the actor-critic (inside `.policy`) and its Adam optimizer."""

    def __init__(self, obs_size: int, num_actions: int, config: IMPALAConfig | None = None):
        self.config = config = config or self._default_config()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.policy = ActorCriticPolicy(obs_size, num_actions, config)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.lr, eps=1e-5)
        self.generator = np.random.default_rng(config.seed)
        self.updates = 0

    def _default_config(self):
        return IMPALAConfig()

    def loss_steps(self, experience: Experience) -> Iterator[LossStep]:
        """One loss on the whole batch, V-trace from the same forward pass (detached)."""
        c = self.config
        _check(experience)
        obs, mask, action = self._tensor(experience.obs), self._tensor(experience.mask), self._tensor(experience.action)
        logits, value = self.policy.logits_and_value(obs, mask)
        log_probs = log_softmax(logits)
        logp = log_probs.gather(1, action[:, None]).squeeze(1)
        trace = self._vtrace(experience, logp.detach().cpu().numpy(), value.detach().cpu().numpy())
        advantages = self._tensor(trace.advantages.astype(np.float32))
        targets = self._tensor(trace.targets.astype(np.float32))
        policy_loss = -(logp * advantages).mean()
        value_loss = 0.5 * (value - targets).pow(2).mean()
        entropy = -(log_probs.exp() * log_probs).sum(dim=-1).mean()  # illegal actions add exactly 0
        loss = policy_loss + c.value_coef * value_loss - c.entropy_coef * entropy
        metrics = {
            "loss": loss.item(),
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy.item(),
            **_rho_metrics(trace, c),
        }
        yield LossStep(loss, len(experience), metrics)

    def _vtrace(self, experience: Experience, target_logp: np.ndarray, value: np.ndarray) -> VTrace:
        c = self.config
        bootstrap = experience.last & ~experience.done
        next_value = np.zeros(len(experience), np.float32)
        if bootstrap.any():
            with torch.no_grad():
                next_value[bootstrap] = self.policy.value(self._tensor(experience.next_obs[bootstrap])).cpu().numpy()
        clipping = VTraceClipping(c.rho_bar, c.c_bar, c.pg_rho_bar, c.trace_lambda)
        return vtrace(
            experience.extras["logp"],
            target_logp,
            experience.reward,
            value,
            next_value,
            experience.done,
            experience.last,
            c.gamma,
            clipping,
        )

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        """`array` on the device the policy's parameters are on (a learner may move them to a GPU)."""
        tensor = torch.from_numpy(array)
        device = next(self.policy.parameters()).device
        return tensor if device.type == "cpu" else tensor.to(device)

    def state_dict(self) -> dict:
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.bit_generator.state,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.bit_generator.state = state["generator"]
        self.updates = int(state["updates"])


class APPOTrainer(IMPALATrainer):
    def _default_config(self):
        return APPOConfig()

    def loss_steps(self, experience: Experience) -> Iterator[LossStep]:
        """V-trace once with the network as the batch arrives, then PPO's minibatch epochs."""
        c = self.config
        _check(experience)
        obs, mask, action = self._tensor(experience.obs), self._tensor(experience.mask), self._tensor(experience.action)
        with torch.no_grad():
            logits, value = self.policy.logits_and_value(obs, mask)
            target_logp = log_softmax(logits).gather(1, action[:, None]).squeeze(1).cpu().numpy()
            value = value.cpu().numpy()
        trace = self._vtrace(experience, target_logp, value)
        rho = _rho_metrics(trace, c)
        behaviour_logp = self._tensor(experience.extras["logp"].astype(np.float32))
        advantages = self._tensor(trace.advantages.astype(np.float32))
        targets = self._tensor(trace.targets.astype(np.float32))
        for _ in range(c.epochs):
            order = self.generator.permutation(len(experience))
            for start in range(0, len(order), c.minibatch_size):
                index = self._tensor(order[start : start + c.minibatch_size])
                minibatch_advantages = advantages[index]
                if c.normalize_advantages and len(index) > 1:
                    minibatch_advantages = (minibatch_advantages - minibatch_advantages.mean()) / (
                        minibatch_advantages.std() + 1e-8
                    )
                step = clipped_surrogate_loss(
                    self.policy,
                    obs[index],
                    mask[index],
                    action[index],
                    behaviour_logp[index],
                    minibatch_advantages,
                    targets[index],
                    c,
                )
                step.metrics.update(rho)
                yield step


def _check(experience: Experience) -> None:
    experience.validate()
    if "logp" not in experience.extras:
        raise ValueError("V-trace needs extras 'logp' (the behaviour policy's), recorded by ActorCriticPolicy.act")


def _rho_metrics(trace: VTrace, config: IMPALAConfig) -> dict[str, float]:
    """How far behaviour and target policies were apart: the mean ratio and how often it was truncated."""
    return {"rho_mean": float(trace.rho.mean()), "rho_clipped_fraction": float((trace.rho > config.rho_bar).mean())}


IMPALA = Algorithm(IMPALAConfig, IMPALATrainer, ActorCriticPolicy)
APPO = Algorithm(APPOConfig, APPOTrainer, ActorCriticPolicy)
