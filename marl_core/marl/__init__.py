"""Multi-agent RL: learners that train every agent of an environment together.

MALib separates the training paradigm from the algorithm; so does this package:

- The rollout engine (`marl_core.rollout`, shared with PSRO) plays E copies of a simultaneous
  environment with one policy per group of agents (parameter sharing) and returns a
  `JointExperience` (`marl_core.rollout.joint_experience`): every agent's observation, action
  and reward, the global state, episode ends, time-major.
- A learner (`learner.MARLLearner`) owns the acting networks (`policies`, one per policy id of
  the `PolicyLayout`) and whatever it trains besides them (centralized critics, mixers, target
  networks), and turns a batch into updates.

`MARL_ALGORITHMS` maps a name (`--algorithm mappo`) to a `MARLAlgorithm`; `psro marl
algorithms` lists them with their summaries. Adding one is one file plus one registry line: its
module, ending with `NAME = MARLAlgorithm(settings, learner)`, and a `MARL_ALGORITHMS.add` line
below naming the module, a one-line summary and the settings class. The settings class itself
goes in `marl_core.marl.settings`, not in the module: `MARLConfig` checks a run's `settings`
against it before any work starts, and the module imports torch. Entries load on first use.
"""

from __future__ import annotations

from typing import NamedTuple

from marl_core.marl.settings import (
    IA2CConfig,
    IAPPOConfig,
    IIMPALAConfig,
    IPPOConfig,
    IQLConfig,
    MADDPGConfig,
    MAPPOConfig,
    QMIXConfig,
    VDNConfig,
)
from marl_core.registry import Registry


class MARLAlgorithm(NamedTuple):
    config: type  # its typed settings (pydantic): the class its registry line names
    learner: type  # learner(layout: PolicyLayout, state_size: int, config) -> MARLLearner


MARL_ALGORITHMS: Registry[MARLAlgorithm] = Registry("MARL algorithm")
MARL_ALGORITHMS.add(
    "ippo", "marl_core.marl.independent:IPPO", "independent PPO: one PPO trainer per policy id", IPPOConfig
)
MARL_ALGORITHMS.add(
    "iql", "marl_core.marl.independent:IQL", "independent Q-learning: one double-DQN trainer per policy id", IQLConfig
)
MARL_ALGORITHMS.add(
    "a2c", "marl_core.marl.independent:A2C", "independent A2C: one A2C trainer per policy id", IA2CConfig
)
MARL_ALGORITHMS.add(
    "impala",
    "marl_core.marl.independent:IMPALA",
    "independent IMPALA: V-trace learners that train while the workers stream fragments",
    IIMPALAConfig,
)
MARL_ALGORITHMS.add(
    "appo",
    "marl_core.marl.independent:APPO",
    "independent APPO: PPO's surrogate on V-trace, learning while the workers stream fragments",
    IAPPOConfig,
)
MARL_ALGORITHMS.add(
    "mappo",
    "marl_core.marl.mappo:MAPPO",
    "PPO with decentralized actors and centralized state-value critics",
    MAPPOConfig,
)
MARL_ALGORITHMS.add(
    "vdn", "marl_core.marl.value_decomposition:VDN", "the team's Q-value is the sum of the agents' utilities", VDNConfig
)
MARL_ALGORITHMS.add(
    "qmix",
    "marl_core.marl.value_decomposition:QMIX",
    "the team's Q-value is a monotonic mix of the agents' utilities, weights from the global state",
    QMIXConfig,
)
MARL_ALGORITHMS.add(
    "maddpg",
    "marl_core.marl.maddpg:MADDPG",
    "Gumbel-softmax actors trained through centralized critics of all observations and actions",
    MADDPGConfig,
)
