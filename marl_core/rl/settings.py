"""Hyperparameters of the RL algorithms, in one typed place per algorithm.

They live apart from the algorithms so that validating a run's settings (which every `psro`
command does before anything starts) never imports torch.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


def over_defaults(defaults: BaseModel, given):
    """A settings section given as a mapping overrides `defaults` one setting at a time (the rest
    keep those defaults, not the class's); a settings object stands as it is. For a pydantic
    `field_validator(mode="before")` of a section whose defaults differ from its class's."""
    return {**defaults.model_dump(), **given} if isinstance(given, dict) else given


class AlgorithmSettings(BaseModel):
    """What every algorithm's settings share."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # A table row per distinct observation: only for environments with few, exactly repeating
    # observations (OpenSpiel games' information states), which configs check before a run.
    keyed_by_observation: ClassVar[bool] = False


class DQNConfig(AlgorithmSettings):
    """DQN hyperparameters. The defaults are RL Baselines3 Zoo's tuned CartPole-v1 values, adapted
    to counting in environment and gradient steps (tests/test_rl.py learns CartPole with them)."""

    hidden: tuple[int, ...] = Field((256, 256), min_length=1, description="Q-network hidden layer widths")
    lr: float = Field(2.3e-3, gt=0, description="Adam learning rate")
    gamma: float = Field(0.99, ge=0, le=1, description="discount factor")
    batch_size: int = Field(64, gt=0, description="transitions per gradient step")
    buffer_size: int = Field(50_000, gt=0, description="replay buffer capacity in transitions")
    learning_starts: int = Field(1_000, ge=0, description="environment steps before the first gradient step")
    train_every: int = Field(2, gt=0, description="environment steps per gradient step")
    target_update_interval: int = Field(128, gt=0, description="gradient steps between target-network copies")
    epsilon_start: float = Field(1.0, ge=0, le=1, description="exploration rate at the first step")
    epsilon_end: float = Field(0.04, ge=0, le=1, description="exploration rate after the decay")
    epsilon_decay_steps: int = Field(8_000, gt=0, description="environment steps of the linear decay")
    epsilon_eval: float = Field(
        0.0,
        ge=0,
        le=1,
        description="exploration rate of the policy the network stands for: a population member and greedy "
        "evaluation (0: greedy; a little keeps deterministic members from playing each other one game forever)",
    )
    double: bool = Field(True, description="online network picks the next action, target network values it")
    max_grad_norm: float = Field(10.0, gt=0, description="gradient-norm clip")
    seed: int = Field(0, description="seeds network initialisation and replay sampling")

    @model_validator(mode="after")
    def _buffer_holds_a_batch(self) -> DQNConfig:
        if self.buffer_size < self.batch_size:
            raise ValueError(f"buffer_size {self.buffer_size} is smaller than batch_size {self.batch_size}")
        return self


class ActorCriticNetworkConfig(AlgorithmSettings):
    """The network of every actor-critic here (PPO, A2C, IMPALA, APPO): `ppo.ActorCriticPolicy`."""

    hidden: tuple[int, ...] = Field((64, 64), min_length=1, description="hidden layer widths of actor and critic")
    shared_trunk: bool = Field(False, description="actor and critic share the hidden layers")
    encoder: Literal["mlp", "nature_cnn"] = Field(
        "mlp",
        description="mlp: the hidden layers on the flat observation; nature_cnn: Mnih et al.'s convolutions over "
        "stacked frames [channels, frame_size, frame_size] (atari: environments) before the hidden layers, "
        "shared by actor and critic",
    )
    frame_size: int = Field(84, gt=0, description="nature_cnn: side of the square frames")


class PPOConfig(ActorCriticNetworkConfig):
    """PPO hyperparameters; the defaults are CleanRL's for classic control."""

    lr: float = Field(2.5e-4, gt=0, description="Adam learning rate")
    gamma: float = Field(0.99, ge=0, le=1, description="discount factor")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE bias/variance trade-off")
    clip: float = Field(0.2, gt=0, description="probability-ratio clip of the surrogate objective")
    entropy_coef: float = Field(0.01, ge=0, description="weight of the entropy bonus")
    value_coef: float = Field(0.5, ge=0, description="weight of the value loss")
    epochs: int = Field(4, gt=0, description="passes over each batch")
    minibatch_size: int = Field(128, gt=0, description="transitions per gradient step")
    max_grad_norm: float = Field(0.5, gt=0, description="gradient-norm clip")
    normalize_advantages: bool = Field(True, description="standardise advantages per minibatch")
    seed: int = Field(0, description="seeds network initialisation and minibatch shuffling")


class A2CConfig(ActorCriticNetworkConfig):
    """A2C hyperparameters; the defaults are Stable-Baselines3's (RMSprop, n-step returns)."""

    lr: float = Field(7e-4, gt=0, description="RMSprop learning rate")
    gamma: float = Field(0.99, ge=0, le=1, description="discount factor")
    gae_lambda: float = Field(1.0, ge=0, le=1, description="1: n-step returns; below 1: GAE")
    entropy_coef: float = Field(0.0, ge=0, description="weight of the entropy bonus")
    value_coef: float = Field(0.5, ge=0, description="weight of the value loss")
    max_grad_norm: float = Field(0.5, gt=0, description="gradient-norm clip")
    normalize_advantages: bool = Field(False, description="standardise advantages per batch")
    seed: int = Field(0, description="seeds network initialisation")


class IMPALAConfig(ActorCriticNetworkConfig):
    """IMPALA's learner (Espeholt et al. 2018): an actor-critic trained on V-trace targets, so
    it learns from fragments a slightly older policy played. The clipping thresholds are
    DeepMind's `scalable_agent`'s and RLlib's (1.0); loss weights and gradient clip RLlib's;
    Adam instead of the paper's RMSprop, as RLlib's new stack does."""

    lr: float = Field(5e-4, gt=0, description="Adam learning rate")
    gamma: float = Field(0.99, ge=0, le=1, description="discount factor")
    rho_bar: float = Field(1.0, gt=0, description="V-trace: truncation of the value targets' importance weights")
    c_bar: float = Field(1.0, gt=0, description="V-trace: truncation of the traces")
    pg_rho_bar: float = Field(1.0, gt=0, description="V-trace: truncation of the policy gradient's importance weights")
    trace_lambda: float = Field(1.0, ge=0, le=1, description="V-trace: lambda scaling every trace")
    entropy_coef: float = Field(0.01, ge=0, description="weight of the entropy bonus")
    value_coef: float = Field(0.5, ge=0, description="weight of the value loss")
    max_grad_norm: float = Field(40.0, gt=0, description="gradient-norm clip")
    seed: int = Field(0, description="seeds network initialisation")


class APPOConfig(IMPALAConfig):
    """APPO: PPO's clipped surrogate on V-trace advantages, the ratio taken against the policy
    that played (RLlib's APPO, whose clip 0.4 this keeps). V-trace targets are computed once per
    batch, as PPO computes GAE once, then `epochs` passes of minibatches."""

    clip: float = Field(0.4, gt=0, description="probability-ratio clip of the surrogate objective")
    epochs: int = Field(2, gt=0, description="passes over each batch")
    minibatch_size: int = Field(256, gt=0, description="transitions per gradient step")
    max_grad_norm: float = Field(0.5, gt=0, description="gradient-norm clip")
    normalize_advantages: bool = Field(True, description="standardise advantages per minibatch")


class TabularQConfig(AlgorithmSettings):
    """Tabular Q-learning settings. The table has a row per distinct observation, so it suits
    environments whose observations repeat exactly and are few: small games' information states
    (Leduc poker: under a thousand per player), not images or continuous vectors. The
    exploration schedule has DQN's names and meaning."""

    keyed_by_observation: ClassVar[bool] = True

    gamma: float = Field(0.99, ge=0, le=1, description="discount factor")
    epsilon_start: float = Field(1.0, ge=0, le=1, description="exploration rate at the first step")
    epsilon_end: float = Field(0.05, ge=0, le=1, description="exploration rate after the decay")
    epsilon_decay_steps: int = Field(40_000, gt=0, description="environment steps of the linear decay")
    epsilon_eval: float = Field(
        0.0, ge=0, le=1, description="exploration rate of the policy the table stands for (0: greedy)"
    )
    max_states: int = Field(200_000, gt=0, description="distinct observations the table may hold; more is refused")
    seed: int = Field(
        0,
        description="unused by the learner, which draws nothing; kept so every algorithm's responses are seeded alike",
    )
