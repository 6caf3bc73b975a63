"""Multi-agent RL: learners that train every agent of an environment together.

MALib separates the training paradigm from the algorithm; so does this package:

- the rollout engine (`marl_core.rollout`) plays E copies of a simultaneous environment with one policy per
  group of agents (parameter sharing) and returns `batch.JointExperience`: every agent's
  observation, action and reward, the global state, episode ends, time-major.
- A learner (`learner.MARLLearner`) owns the acting networks (`policies`, one per policy id of
  the `PolicyLayout`) and whatever it trains besides them (centralized critics, mixers, target
  networks), and turns a batch into updates.

`MARL_ALGORITHMS` maps a name (`--algorithm mappo`) to a `MARLAlgorithm`: adding one means a
module that ends with `ALGORITHM = MARLAlgorithm(...)`, its settings class in
`marl_core.marl.settings`, and one line here. Entries load on first use, so validating a config
never imports torch.
"""

from __future__ import annotations

from typing import NamedTuple

from marl_core.registry import Registry


class MARLAlgorithm(NamedTuple):
    config: type  # its typed settings (pydantic), in marl_core.marl.settings
    learner: type  # learner(layout: PolicyLayout, state_size: int, config) -> MARLLearner


MARL_ALGORITHMS: Registry[MARLAlgorithm] = Registry("MARL algorithm")
MARL_ALGORITHMS.add("ippo", "marl_core.marl.independent:IPPO")
MARL_ALGORITHMS.add("iql", "marl_core.marl.independent:IQL")
MARL_ALGORITHMS.add("a2c", "marl_core.marl.independent:A2C")
MARL_ALGORITHMS.add("mappo", "marl_core.marl.mappo:MAPPO")
MARL_ALGORITHMS.add("vdn", "marl_core.marl.value_decomposition:VDN")
MARL_ALGORITHMS.add("qmix", "marl_core.marl.value_decomposition:QMIX")
MARL_ALGORITHMS.add("maddpg", "marl_core.marl.maddpg:MADDPG")
