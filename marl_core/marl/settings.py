"""Hyperparameters of the multi-agent learners, one typed class per algorithm.

Like `marl_core.rl.settings`, they live apart from the algorithms so that checking a run's
settings never imports torch. Independent learners reuse the single-agent settings unchanged.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from marl_core.rl.settings import A2CConfig, DQNConfig, PPOConfig


# algorithm name -> its settings class; `marl_core.marl.MARL_ALGORITHMS` has the same names
SETTINGS: dict[str, type[BaseModel]] = {}


class IPPOConfig(BaseModel):
    """Independent PPO: each policy id trains by PPO on its agents' own transitions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ppo: PPOConfig = Field(default_factory=PPOConfig)


class IQLConfig(BaseModel):
    """Independent Q-learning: each policy id trains by (double) DQN on its agents' own transitions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dqn: DQNConfig = Field(default_factory=DQNConfig)


class IA2CConfig(BaseModel):
    """Independent A2C: each policy id trains by A2C on its agents' own transitions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    a2c: A2CConfig = Field(default_factory=A2CConfig)


SETTINGS.update(ippo=IPPOConfig, iql=IQLConfig, a2c=IA2CConfig)
