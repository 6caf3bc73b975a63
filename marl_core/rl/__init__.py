"""RL algorithms: one module per algorithm, each with its trainer and the network policy it acts with.

`ALGORITHMS` maps a name such as `--oracle dqn` to an `Algorithm`: a driver builds
`trainer(obs_size, num_actions, config)`, and a rollout worker rebuilds the acting side as
`policy(obs_size, num_actions, config)` followed by `set_weights(weights)`. Adding an algorithm
means one module that ends with `ALGORITHM = Algorithm(...)`, its settings class in
`marl_core.rl.settings`, and one line here.

Entries load on first use, and so do the names below (PEP 562): the settings are imported by
every config check, and importing torch for them would add seconds to each command.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

from marl_core.registry import Registry
from marl_core.rl.settings import A2CConfig, DQNConfig, PPOConfig


class Algorithm(NamedTuple):
    config: type  # its typed settings (pydantic)
    trainer: type
    policy: type  # a `marl_core.rl.policy.NetworkPolicy`


ALGORITHMS: Registry[Algorithm] = Registry("RL algorithm")
ALGORITHMS.add("dqn", "marl_core.rl.dqn:ALGORITHM")
ALGORITHMS.add("ppo", "marl_core.rl.ppo:ALGORITHM")
ALGORITHMS.add("a2c", "marl_core.rl.a2c:ALGORITHM")

_LAZY = {
    "Experience": "marl_core.rl.batch",
    "DQNTrainer": "marl_core.rl.dqn",
    "QPolicy": "marl_core.rl.dqn",
    "ReplayBuffer": "marl_core.rl.dqn",
    "PPOTrainer": "marl_core.rl.ppo",
    "A2CTrainer": "marl_core.rl.a2c",
    "ActorCriticPolicy": "marl_core.rl.ppo",
    "compute_gae": "marl_core.rl.ppo",
    "NetworkPolicy": "marl_core.rl.policy",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'marl_core.rl' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_LAZY[name]), name)
    return value


__all__ = ["ALGORITHMS", "Algorithm", "A2CConfig", "DQNConfig", "PPOConfig", *_LAZY]
