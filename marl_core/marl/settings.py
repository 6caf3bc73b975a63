"""Hyperparameters of the multi-agent learners, one typed class per algorithm.

Like `marl_core.rl.settings`, they live apart from the algorithms so that checking a run's
settings never imports torch; each algorithm's line in `marl_core.marl.MARL_ALGORITHMS` names
its class. Independent learners reuse the single-agent settings unchanged. A class whose
learner takes continuous actions says so (`continuous_actions`), so that a config is refused on
an environment of continuous actions before anything starts, not in its learner.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from marl_core.distributed.settings import DatasetConfig, StrategyConfig
from marl_core.rl.settings import A2CConfig, APPOConfig, DQNConfig, IMPALAConfig, PPOConfig, over_defaults


class AsyncConfig(BaseModel):
    """An asynchronous learner's settings beyond its algorithm's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    distributed: StrategyConfig = Field(default_factory=StrategyConfig)
    fragments_per_batch: int = Field(
        1, gt=0, description="fragments a learner takes from the dataset server per update"
    )
    publish_every: int = Field(1, gt=0, description="updates between the weights the workers act with")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="where learners train: auto takes a GPU when torch sees one, else the CPU "
        "(workers always act on CPUs)",
    )

    @model_validator(mode="after")
    def _a_batch_fits(self) -> AsyncConfig:
        if self.fragments_per_batch > self.dataset.capacity:
            raise ValueError(
                f"fragments_per_batch {self.fragments_per_batch} is more than the dataset's capacity "
                f"{self.dataset.capacity}"
            )
        return self


class IPPOConfig(BaseModel):
    """Independent PPO: each policy id trains by PPO on its agents' own transitions. With
    `asynchronous` set, the workers stream fragments into a dataset server while the learner(s)
    train (several learners of a policy combine gradients by `asynchronous.distributed`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    continuous_actions: ClassVar[bool] = True  # PPO's Gaussian actor

    ppo: PPOConfig = Field(default_factory=PPOConfig)
    asynchronous: AsyncConfig | None = Field(None, description="learn while the workers play (see AsyncConfig)")


class IIMPALAConfig(BaseModel):
    """Independent IMPALA: each policy id trains by IMPALA, always asynchronously."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    impala: IMPALAConfig = Field(default_factory=IMPALAConfig)
    asynchronous: AsyncConfig = Field(
        default_factory=AsyncConfig, description="the dataset server and distributed strategy"
    )


class IAPPOConfig(BaseModel):
    """Independent APPO: each policy id trains by APPO, always asynchronously."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    appo: APPOConfig = Field(default_factory=APPOConfig)
    asynchronous: AsyncConfig = Field(
        default_factory=AsyncConfig, description="the dataset server and distributed strategy"
    )


# DQN's own defaults are CartPole's (a 256x256 network, a gradient step every 2 transitions): on
# MPE they were several times slower and did not learn (docs/marl.md, "The MPE suite"). These
# follow VDN and QMIX's below, counted in the transitions of one policy id (3 a joint step when
# 3 agents share it).
MULTI_AGENT_DQN = DQNConfig(
    hidden=(128, 128),
    lr=5e-4,
    batch_size=256,
    buffer_size=100_000,
    learning_starts=5_000,
    train_every=8,
    target_update_interval=500,
    epsilon_end=0.05,
    epsilon_decay_steps=100_000,
)


class IQLConfig(BaseModel):
    """Independent Q-learning: each policy id trains by (double) DQN on its agents' own
    transitions. Settings given under `dqn` override `MULTI_AGENT_DQN` one by one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dqn: DQNConfig = Field(default_factory=lambda: MULTI_AGENT_DQN)

    @field_validator("dqn", mode="before")
    @classmethod
    def _override_multi_agent_defaults(cls, value):
        return over_defaults(MULTI_AGENT_DQN, value)


class IA2CConfig(BaseModel):
    """Independent A2C: each policy id trains by A2C on its agents' own transitions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    a2c: A2CConfig = Field(default_factory=A2CConfig)


# --- MAPPO (marl_core/marl/mappo.py) ---------------------------------------------------------


class MAPPOConfig(BaseModel):
    """MAPPO (Yu et al. 2022): PPO with decentralized actors, one per policy id, and a
    centralized critic per policy id that values the global state (plus the agent's one-hot
    when several agents share it).

    Steps are joint environment steps; a batch holds every agent of a policy id in every step
    and copy. The defaults follow the paper's particle-environment choices where they matter
    (value normalization, advantage normalization, value loss weight 1, gradient-norm clip 10)
    and PPO's usual clip, GAE and entropy settings for the rest; they suit MPE's simple_spread
    (3 agents, 25 steps).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    continuous_actions: ClassVar[bool] = True  # its Gaussian actor

    hidden: tuple[int, ...] = Field((64, 64), min_length=1, description="actor hidden layer widths")
    critic_hidden: tuple[int, ...] = Field((64, 64), min_length=1, description="centralized critic hidden layer widths")
    lr: float = Field(5e-4, gt=0, description="Adam learning rate of the actors")
    critic_lr: float | None = Field(None, gt=0, description="Adam learning rate of the critics (default: lr)")
    gamma: float = Field(0.99, ge=0, le=1, description="discount factor")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE bias/variance trade-off")
    clip: float = Field(0.2, gt=0, description="probability-ratio clip of the surrogate objective")
    epochs: int = Field(4, gt=0, description="passes over each batch")
    minibatch_size: int = Field(512, gt=0, description="agent transitions (of one policy id) per gradient step")
    entropy_coef: float = Field(0.01, ge=0, description="weight of the entropy bonus")
    value_coef: float = Field(1.0, ge=0, description="weight of the critic's loss")
    max_grad_norm: float = Field(10.0, gt=0, description="gradient-norm clip, of actor and critic separately")
    normalize_advantages: bool = Field(True, description="standardise advantages over each policy id's batch")
    value_norm: bool = Field(True, description="critics predict returns standardised by running statistics")
    seed: int = Field(0, description="seeds network initialisation and minibatch shuffling")


class _ReplaySettings(BaseModel):
    """Checks shared by the off-policy learners: the replay buffer must hold one batch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _buffer_holds_a_batch(self):
        if self.buffer_size < self.batch_size:
            raise ValueError(f"buffer_size {self.buffer_size} is smaller than batch_size {self.batch_size}")
        return self


# --- VDN and QMIX (marl_core/marl/value_decomposition.py) ------------------------------------


class ValueDecompositionConfig(_ReplaySettings):
    """What VDN and QMIX share: per-policy agent Q-networks trained through a mixer on a replay
    buffer of joint transitions, with double-Q targets and epsilon-greedy exploration.

    Steps are joint environment steps (one per environment copy per step, however many agents
    act in it), the unit of the MARL loop's `env_steps`. The defaults are tuned for MPE's
    simple_spread (3 agents, 25 steps an episode) over a few hundred thousand steps. There
    QMIX's values run away upward (to +1000 with rewards that are all negative) with frequent
    target copies (every 200 gradient steps = 1,600 joint steps) and lr 5e-4 once exploration
    gets low: a target copy every 1,000 gradient steps (8,000 joint steps, near EPyMARL's 200
    episodes), lr 2.5e-4 and a shorter epsilon decay keep them bounded and learn faster.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden: tuple[int, ...] = Field((128, 128), min_length=1, description="agent Q-network hidden layer widths")
    lr: float = Field(2.5e-4, gt=0, description="Adam learning rate (agents and mixer together)")
    gamma: float = Field(0.99, ge=0, le=1, description="discount factor")
    batch_size: int = Field(256, gt=0, description="joint transitions per gradient step")
    buffer_size: int = Field(100_000, gt=0, description="replay buffer capacity in joint transitions")
    learning_starts: int = Field(5_000, ge=0, description="joint environment steps before the first gradient step")
    train_every: int = Field(8, gt=0, description="joint environment steps per gradient step")
    target_update_interval: int = Field(1_000, gt=0, description="gradient steps between target-network copies")
    epsilon_start: float = Field(1.0, ge=0, le=1, description="exploration rate at the first step")
    epsilon_end: float = Field(0.05, ge=0, le=1, description="exploration rate after the decay")
    epsilon_decay_steps: int = Field(50_000, gt=0, description="joint environment steps of the linear decay")
    double: bool = Field(True, description="online agents pick the next actions, target agents and mixer value them")
    max_grad_norm: float = Field(10.0, gt=0, description="gradient-norm clip")
    seed: int = Field(0, description="seeds network initialisation and replay sampling")


class VDNConfig(ValueDecompositionConfig):
    """VDN (Sunehag et al. 2018): the team's Q-value is the sum of the agents' utilities."""


class QMIXConfig(ValueDecompositionConfig):
    """QMIX (Rashid et al. 2018): the team's Q-value is a monotonic mixing network of the agents'
    utilities, whose weights hypernetworks compute from the global state."""

    mixing_embed: int = Field(32, gt=0, description="width of the mixing network's hidden layer")
    hypernet_hidden: int = Field(64, gt=0, description="hidden width of the hypernetworks that make its weights")


# --- MADDPG (marl_core/marl/maddpg.py) -------------------------------------------------------


class MADDPGConfig(_ReplaySettings):
    """MADDPG (Lowe et al. 2017) for discrete actions: per-policy actors trained through
    Gumbel-softmax samples against per-policy centralized critics of every agent's observation
    and action, on a replay buffer of joint transitions with every agent's own reward.

    Steps are joint environment steps (one per environment copy per step), the unit of the MARL
    loop's `env_steps`. The defaults are the paper's for the particle environments (section 5 and
    appendix; the authors' code for the rest): Adam at 1e-2, gamma 0.95, two ReLU layers of 64,
    minibatches of 1024 from a buffer of a million transitions, Polyak averaging at tau 0.01,
    gradient-norm clip 0.5 and a 1e-3 penalty on the squared actor logits; except that updates
    start after 5,000 steps and come every 50, where the paper waits for 1024 episodes of 25
    steps (25,600) and updates every 100: with the paper's, simple_adversary's good agents had
    not learned within the MPE suite's budget (docs/marl.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden: tuple[int, ...] = Field((64, 64), min_length=1, description="actor hidden layer widths")
    critic_hidden: tuple[int, ...] = Field((64, 64), min_length=1, description="centralized critic hidden layer widths")
    actor_lr: float = Field(1e-2, gt=0, description="Adam learning rate of the actors")
    critic_lr: float = Field(1e-2, gt=0, description="Adam learning rate of the critics")
    gamma: float = Field(0.95, ge=0, le=1, description="discount factor")
    tau: float = Field(
        0.01, gt=0, le=1, description="Polyak rate: target <- (1 - tau) target + tau online, every update"
    )
    batch_size: int = Field(1024, gt=0, description="joint transitions per update")
    buffer_size: int = Field(1_000_000, gt=0, description="replay buffer capacity in joint transitions")
    learning_starts: int = Field(
        5_000, ge=0, description="joint environment steps before the first update (the paper: 25,600)"
    )
    train_every: int = Field(
        50, gt=0, description="joint environment steps per update, of every critic and actor (the paper: 100)"
    )
    gumbel_temperature: float = Field(
        1.0, gt=0, description="temperature of the Gumbel-softmax relaxation that the actor's gradient flows through"
    )
    logit_penalty: float = Field(
        1e-3,
        ge=0,
        description="weight of the mean squared actor logits in the actor loss (keeps the softmax from saturating)",
    )
    max_grad_norm: float = Field(0.5, gt=0, description="gradient-norm clip, per network")
    frozen: tuple[str, ...] = Field(
        (),
        description="policy ids that act but do not learn (e.g. a trained adversary the good agents learn to deceive)",
    )
    seed: int = Field(0, description="seeds network initialisation, replay sampling and Gumbel noise")
