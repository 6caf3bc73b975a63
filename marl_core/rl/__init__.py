"""Torch policies and the RL algorithms that train them (DQN, PPO).

`ALGORITHMS` maps a name such as `--oracle dqn` to its config, trainer and policy classes: a
driver builds `Trainer(obs_size, num_actions, Config(**settings))`, and a rollout worker rebuilds
the acting side as `Policy(obs_size, num_actions, config)` followed by `set_weights(weights)`.

The names are loaded on first use (PEP 562): `marl_core.rl.settings` (the hyperparameters) is
imported by every config check, and importing torch for it would add seconds to each command.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

from marl_core.rl.settings import DQNConfig, PPOConfig

_LAZY = {
    "Experience": "marl_core.rl.batch",
    "DQNTrainer": "marl_core.rl.dqn",
    "ReplayBuffer": "marl_core.rl.dqn",
    "PPOTrainer": "marl_core.rl.ppo",
    "compute_gae": "marl_core.rl.ppo",
    "Policy": "marl_core.rl.policy",
    "QPolicy": "marl_core.rl.policy",
    "ActorCriticPolicy": "marl_core.rl.policy",
}


class Algorithm(NamedTuple):
    config: type
    trainer: type
    policy: type


def _algorithms() -> dict[str, Algorithm]:
    from marl_core.rl.dqn import DQNTrainer
    from marl_core.rl.policy import ActorCriticPolicy, QPolicy
    from marl_core.rl.ppo import PPOTrainer

    return {
        "dqn": Algorithm(DQNConfig, DQNTrainer, QPolicy),
        "ppo": Algorithm(PPOConfig, PPOTrainer, ActorCriticPolicy),
    }


def __getattr__(name: str):
    if name == "ALGORITHMS":
        value = _algorithms()
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'marl_core.rl' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = ["ALGORITHMS", "Algorithm", "DQNConfig", "PPOConfig", *_LAZY]
