"""Continuous actions: a diagonal Gaussian whose mean is a network's output and whose log standard
deviations are learned parameters of their own, the same in every state (CleanRL's
ppo_continuous_action, BenchMARL's MAPPO on VMAS). A state-independent spread keeps the network
a plain regression of the mean and lets exploration shrink only as fast as PPO's updates move it.

A policy samples mean + std * noise with the caller's numpy generator (rollouts reproducible, as
with discrete actions) and hands the raw sample to the environment, which clips it into its box
(`marl_core.envs.api`). The log-probability recorded, and the one PPO's ratio recomputes, are of
that raw sample: clipping inside the policy would need the raw sample kept beside the clipped one
for the ratio, and squashing (tanh) a change-of-variables term in every log-probability; clipping
at the environment needs neither. Greedy play (`explore=False`) takes the mean.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def log_prob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """log N(action; mean, diag(exp(log_std))^2) of each row [B, size]: [B]."""
    return (-0.5 * ((action - mean) / log_std.exp()).pow(2) - log_std - LOG_SQRT_2PI).sum(-1)


def entropy(log_std: torch.Tensor) -> torch.Tensor:
    """The Gaussian's entropy, a scalar: the spread is the same in every state."""
    return (0.5 + LOG_SQRT_2PI + log_std).sum()


def learned_log_std(size: int) -> nn.Parameter:
    """One log standard deviation per action entry, 0 (a spread of 1) at first, as CleanRL's."""
    return nn.Parameter(torch.zeros(size))


def sample(
    mean: torch.Tensor, log_std: torch.Tensor, explore: bool, generator: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Actions [B, size] float32 (a draw, or the mean where `explore` is off) and their
    log-probabilities [B] float32; under the caller's `torch.inference_mode()`."""
    action = mean
    if explore:
        noise = generator.standard_normal(tuple(mean.shape), dtype=np.float32)
        action = mean + log_std.exp() * torch.from_numpy(noise)
    return action.numpy(), log_prob(mean, log_std, action).numpy()


def no_action_probs() -> ValueError:
    """What a continuous policy answers when asked for discrete action probabilities."""
    return ValueError(
        "a policy of continuous actions has no action probabilities; populations and PSRO act on discrete actions"
    )
