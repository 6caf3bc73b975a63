"""RL algorithms: one module per algorithm, each with its trainer and the network policy it acts with.

`ALGORITHMS` maps a name to an `Algorithm`: a driver builds `trainer(obs_size, num_actions,
config)`, and a rollout worker rebuilds the acting side as `policy(obs_size, num_actions,
config)` followed by `set_weights(weights)`. Every algorithm registered here is also a learned
PSRO oracle of the same name (`--oracle a2c`, `marl_core.psro.oracles`), whose settings a PSRO
config takes under that name (`a2c: {lr: ...}`), checked by the algorithm's settings class.

Adding an algorithm is one file plus one registry line: its module, ending with
`ALGORITHM = Algorithm(settings, trainer, policy)`, and an `ALGORITHMS.add` line below naming
the module, a one-line summary and the settings class. The settings class itself goes in
`marl_core.rl.settings`, not in the module: configs are checked against it before any work
starts, and the module imports torch. The oracle, its config section and the listings follow
from the registry line; tests/test_registries.py checks the new algorithm as an oracle.

Entries load on first use, and so do the names below (PEP 562): the settings are imported by
every config check, and importing torch for them would add seconds to each command.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

from marl_core.registry import Registry
from marl_core.rl.settings import A2CConfig, APPOConfig, DQNConfig, IMPALAConfig, PPOConfig, TabularQConfig


class Algorithm(NamedTuple):
    config: type  # its typed settings (pydantic): the class its registry line names
    trainer: type
    policy: type  # a `marl_core.rl.policy.NetworkPolicy`


ALGORITHMS: Registry[Algorithm] = Registry("RL algorithm")
ALGORITHMS.add("dqn", "marl_core.rl.dqn:ALGORITHM", "double DQN with a target network and replay", DQNConfig)
ALGORITHMS.add("ppo", "marl_core.rl.ppo:ALGORITHM", "PPO with GAE, clipping and an entropy bonus", PPOConfig)
ALGORITHMS.add(
    "a2c", "marl_core.rl.a2c:ALGORITHM", "A2C: one policy-gradient step per batch on n-step returns", A2CConfig
)
ALGORITHMS.add(
    "impala",
    "marl_core.rl.impala:IMPALA",
    "IMPALA: an actor-critic on V-trace targets, for experience an older policy played",
    IMPALAConfig,
)
ALGORITHMS.add("appo", "marl_core.rl.impala:APPO", "APPO: PPO's clipped surrogate on V-trace advantages", APPOConfig)
ALGORITHMS.add(
    "tabular_q",
    "marl_core.rl.tabular_q:ALGORITHM",
    "tabular Q-learning on the empirical model of the observed transitions (small observation sets)",
    TabularQConfig,
)

# The acting network of a member no RL algorithm trained: neural CFR's average strategies
# (`marl_core.rl.average_policy`), stored and rebuilt like any network member.
AVERAGE_POLICY = "average_policy"


def acting_networks() -> list[str]:
    """Every name a stored network member may give as its `algorithm`."""
    return sorted([*ALGORITHMS, AVERAGE_POLICY])


def acting_network(algorithm: str, obs_size: int, num_actions: int, config: dict):
    """The acting network a member's description names, freshly initialised (its weights load
    next): an RL algorithm's policy built from its settings, or an average-policy network."""
    if algorithm == AVERAGE_POLICY:
        from marl_core.rl.average_policy import AveragePolicyNetwork

        return AveragePolicyNetwork(obs_size, num_actions, tuple(config["hidden"]))
    spec = ALGORITHMS[algorithm]
    return spec.policy(obs_size, num_actions, spec.config(**config))


_LAZY = {
    "Experience": "marl_core.rl.batch",
    "DQNTrainer": "marl_core.rl.dqn",
    "QPolicy": "marl_core.rl.dqn",
    "ReplayBuffer": "marl_core.rl.dqn",
    "PPOTrainer": "marl_core.rl.ppo",
    "A2CTrainer": "marl_core.rl.a2c",
    "IMPALATrainer": "marl_core.rl.impala",
    "APPOTrainer": "marl_core.rl.impala",
    "ActorCriticPolicy": "marl_core.rl.ppo",
    "compute_gae": "marl_core.rl.ppo",
    "NetworkPolicy": "marl_core.rl.policy",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'marl_core.rl' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_LAZY[name]), name)
    return value


__all__ = [
    "ALGORITHMS",
    "AVERAGE_POLICY",
    "acting_network",
    "acting_networks",
    "Algorithm",
    "A2CConfig",
    "APPOConfig",
    "DQNConfig",
    "IMPALAConfig",
    "PPOConfig",
    "TabularQConfig",
    *_LAZY,
]
