"""A MARL run's config (`MARLConfig`), its checks, and what the config alone decides about the run.

A MARL run (MALib's `MARLScenario`) is a fixed set of learners on one environment, trained in
rounds (`marl_core.marl.rounds`). Everything here reads the config only: its policy layout, the
rollout workers it asks for, which rounds evaluate and checkpoint, whether its algorithm learns
asynchronously, and the learner it names. Validating a config imports neither torch nor Ray, so
a bad one is refused before any server, actor or run starts; the rollout engine and the learners
are imported where they are used.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from marl_core.marl import MARL_ALGORITHMS

if TYPE_CHECKING:
    from marl_core.envs import EnvSpec
    from marl_core.marl.settings import AsyncConfig
    from marl_core.rollout.layout import PolicyLayout
    from marl_core.rollout.pool import PoolConfig
    from marl_core.rollout.progress import Work


class MARLConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str = Field(description="a simultaneous environment: pettingzoo:<module with parallel_env()> or atari:<game>")
    algorithm: str = Field("mappo", description="MARL algorithm (see marl_core.marl.MARL_ALGORITHMS)")
    settings: dict[str, Any] = Field(default_factory=dict, description="the algorithm's hyperparameters")
    policies: dict[str, str] | None = Field(
        None, description="agent-name prefix -> policy id; default: agents named <role>_<n> share the policy <role>"
    )
    agent_ids: bool = Field(True, description="agents that share a policy see a one-hot of their index")
    rounds: int = Field(100, gt=0, description="training rounds")
    steps_per_round: int = Field(128, gt=0, description="joint steps per environment copy per round")
    workers: int = Field(1, gt=0, description="rollout workers (Ray actors in a flow)")
    envs_per_worker: int = Field(8, gt=0, description="environment copies per worker")
    eval_every: int = Field(10, gt=0, description="rounds between greedy evaluations (and after the last)")
    eval_episodes: int = Field(32, gt=0, description="greedy episodes per evaluation")
    eval_greedy: bool = Field(
        True,
        description="evaluations play each policy's most likely action; false: they sample from it, as it explores "
        "(on pixels an untrained greedy policy may repeat one action forever, such as never serving in Pong)",
    )
    eval_versus_uniform: bool = Field(
        False,
        description="each evaluation also plays every agent alone with its policy against uniform-random play by all "
        "the others, eval_episodes each (metrics vs_uniform/<agent>): the sanity check of a competitive game, whose "
        "self-play returns say little",
    )
    checkpoint_every: int = Field(10, gt=0, description="rounds between committed checkpoints (and after the last)")
    seed: int = 0
    # where the flow runs and tracks; unused by the in-process loop
    tracking_uri: str = "sqlite:///mlflow.db"
    experiment: str = "marl"
    ray_address: str | None = None
    num_cpus: int | None = Field(None, gt=0)
    learner_threads: int = Field(
        1,
        gt=0,
        description="torch threads of the learner: in collect-then-learn rounds the workers wait while it learns, "
        "so a large network (pixels) learns faster on the CPUs they leave; small ones only contend",
    )

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, algorithm: str) -> str:
        if algorithm not in MARL_ALGORITHMS:
            raise ValueError(f"unknown MARL algorithm; choose one of: {', '.join(sorted(MARL_ALGORITHMS))}")
        return algorithm

    @model_validator(mode="after")
    def _valid_settings(self) -> MARLConfig:
        try:
            MARL_ALGORITHMS.settings(self.algorithm)(**self.settings)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(map(str, ("settings", *first["loc"])))
            raise ValueError(f"{where}={first['input']!r}: {first['msg']} ({self.algorithm}'s settings)") from None
        return self

    @property
    def algorithm_settings(self):
        return MARL_ALGORITHMS.settings(self.algorithm)(**self.settings)


def check(config: MARLConfig) -> None:
    """Make one copy of the environment and lay out its policies: a ValueError naming what is
    wrong (an unknown or turn-based environment, continuous actions the algorithm cannot take,
    agents that cannot share a policy, a frozen policy id that is not in the layout, learners
    asked to train on a GPU there is not) before any server, actor or run starts."""
    layout, spec = layout_and_spec(config)
    _check_actions(config, spec)
    unknown = sorted(set(getattr(config.algorithm_settings, "frozen", ())) - set(layout.groups))
    if unknown:
        raise ValueError(f"settings.frozen={unknown}: no such policy; the policies are {sorted(layout.groups)}")
    _check_frames(config, layout)
    shared = [policy for policy, agents in layout.groups.items() if len(agents) > 1]
    if config.eval_versus_uniform and config.agent_ids and shared:
        raise ValueError(
            f"eval_versus_uniform=True with agent_ids=True: policies {shared} are shared and see their agents' "
            "one-hot, which an agent playing alone against uniform play would not have; set agent_ids: false"
        )
    settings = asynchronous(config)
    if settings is not None and settings.device == "cuda":
        from marl_core.marl.learner import resolve_device

        resolve_device(settings.device)


def _check_actions(config: MARLConfig, spec) -> None:
    """Continuous actions need a learner that takes them, and no uniform play (a population)."""
    if not spec.action_boxes:
        return
    takes = sorted(
        name for name in MARL_ALGORITHMS if getattr(MARL_ALGORITHMS.settings(name), "continuous_actions", False)
    )
    if config.algorithm not in takes:
        raise ValueError(
            f"algorithm={config.algorithm!r}: environment {config.env!r} has continuous actions, which "
            f"{config.algorithm} cannot take; algorithms that can: {', '.join(takes)}"
        )
    if config.eval_versus_uniform:
        raise ValueError(
            f"eval_versus_uniform=True: environment {config.env!r} has continuous actions, and uniform play "
            "(a population) acts on discrete ones only; set eval_versus_uniform: false"
        )


def _check_frames(config: MARLConfig, layout) -> None:
    """A convolutional encoder reads stacked square frames: every policy's input must be a whole
    number of them (an Atari environment's, without agent one-hots)."""
    from marl_core.rl.settings import ActorCriticNetworkConfig

    settings = config.algorithm_settings
    for name in type(settings).model_fields:
        network = getattr(settings, name)
        if not isinstance(network, ActorCriticNetworkConfig) or network.encoder != "nature_cnn":
            continue
        pixels = network.frame_size**2
        for policy, size in layout.obs_size.items():
            if size % pixels:
                raise ValueError(
                    f"settings.{name}.encoder='nature_cnn' reads "
                    f"[channels, {network.frame_size}, {network.frame_size}] frames; policy {policy!r} observes "
                    f"{size} numbers, not a multiple of {pixels} "
                    "(use an atari: environment with agent_ids: false, or encoder: mlp)"
                )


def layout_and_spec(config: MARLConfig) -> tuple[PolicyLayout, EnvSpec]:
    """The policy layout and environment spec of `config`, read from one environment copy: what a
    learner or a pool of remote workers needs to know without stepping anything."""
    from marl_core.envs import make_env
    from marl_core.rollout.layout import PolicyLayout

    env = make_env(config.env)
    env.close()
    if not env.spec.simultaneous:
        raise ValueError(
            f"{env.spec.name} is turn-based; MARL training needs a simultaneous environment "
            "(a PettingZoo parallel_env) in which every agent acts every step"
        )
    return PolicyLayout.of(env.spec, policy_mapping(config), config.agent_ids), env.spec


def role_of(agent: str) -> str:
    """'adversary_0' -> 'adversary': PettingZoo names agents <role>_<index>."""
    head, _, tail = agent.rpartition("_")
    return head if head and tail.isdigit() else agent


def policy_mapping(config: MARLConfig):
    from marl_core.envs import by_prefix

    if config.policies:
        return by_prefix(config.policies)
    return _ByRole()


@dataclasses.dataclass(frozen=True)
class _ByRole:
    def __call__(self, agent: str) -> str:
        return role_of(agent)


# --- what the config decides about the run ----------------------------------------------------


def asynchronous(config: MARLConfig) -> AsyncConfig | None:
    """The run's asynchronous settings (`marl_core.marl.async_rounds`), or None for
    collect-then-learn rounds."""
    return getattr(config.algorithm_settings, "asynchronous", None)


def uses_global_state(config: MARLConfig) -> bool:
    """Whether the run's learner reads the global state (centralized critics and mixers do;
    independent learners do not, and their fragments leave it out)."""
    return getattr(MARL_ALGORITHMS[config.algorithm].learner, "uses_global_state", True)


def make_learner(config: MARLConfig, layout, state_size: int):
    """A fresh learner of the config's algorithm for `layout` (its algorithm's module, and with it
    torch, is imported here)."""
    return MARL_ALGORITHMS[config.algorithm].learner(layout, state_size, config.algorithm_settings)


def pool_config(config: MARLConfig) -> PoolConfig:
    """The rollout workers the run plays on."""
    from marl_core.rollout.pool import PoolConfig

    return PoolConfig(config.env, config.workers, config.envs_per_worker)


TRAINING_PROGRESS = "marl/training"  # the run's training steps, as progress in the pool's weight store


def training_work(config: MARLConfig, first_round: int = 0) -> Work:
    """The joint steps of the rounds from `first_round` on, over every copy: the run's training
    as progress (evaluations play apart from it)."""
    from marl_core.rollout.progress import Work

    copies = config.workers * config.envs_per_worker
    total = (config.rounds - first_round) * config.steps_per_round * copies
    return Work(TRAINING_PROGRESS, f"{config.algorithm} training", total, "steps")


def evaluation_due(config: MARLConfig, round: int) -> bool:
    return (round + 1) % config.eval_every == 0 or round == config.rounds - 1


def checkpoint_due(config: MARLConfig, round: int) -> bool:
    return (round + 1) % config.checkpoint_every == 0 or round == config.rounds - 1
