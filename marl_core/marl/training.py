"""The MARL training scenario (MALib's `MARLScenario`): a fixed set of learners on one environment.

A run is a sequence of *rounds*, each three named steps, wired once in
`marl_core.marl.rounds.run_round` and run in this process or as Prefect tasks on Ray:

1. `collect-rollouts`: the learner publishes its networks to the pool's parameter store, and the
   rollout workers (the one rollout engine, `marl_core.rollout`) play `steps_per_round` joint
   steps in each of their environment copies with them (exploring), episodes running on across
   rounds;
2. `update-learner`: the learner trains on that segment;
3. `evaluate-policies` (every `eval_every` rounds and at the end): the workers play
   `eval_episodes` whole episodes greedily, from fresh resets, so the figure does not depend on
   where training episodes happened to stop.

Returns are reported per agent and per policy (the agents that share it), summed over an
episode; a policy's return is the mean over its agents. An asynchronous algorithm's rounds
stream and learn at once instead (`marl_core.marl.async_rounds`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from marl_core.marl import MARL_ALGORITHMS

if TYPE_CHECKING:  # the rollout engine imports torch; validating a config must not
    from marl_core.distributed.settings import AsyncConfig
    from marl_core.envs import EnvSpec
    from marl_core.marl.batch import JointExperience
    from marl_core.rollout.layout import PolicyLayout
    from marl_core.rollout.pool import PoolConfig
    from marl_core.rollout.progress import Work
    from marl_core.rollout.worker import LearnerSpec


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
        description="each evaluation also plays every agent alone with its policy against uniform-random play by all the others, "
        "eval_episodes each (metrics vs_uniform/<agent>): the sanity check of a competitive game, whose self-play "
        "returns say little",
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
    wrong (an unknown or turn-based environment, agents that cannot share a policy, a frozen
    policy id that is not in the layout, learners asked to train on a GPU there is not) before
    any server, actor or run starts."""
    layout, _ = layout_and_spec(config)
    unknown = sorted(set(getattr(config.algorithm_settings, "frozen", ())) - set(layout.groups))
    if unknown:
        raise ValueError(f"settings.frozen={unknown}: no such policy; the policies are {sorted(layout.groups)}")
    _check_frames(config, layout)
    shared = [policy for policy, agents in layout.groups.items() if len(agents) > 1]
    if config.eval_versus_uniform and config.agent_ids and shared:
        raise ValueError(
            f"eval_versus_uniform=True with agent_ids=True: policies {shared} are shared and see their agents' one-hot, "
            "which an agent playing alone against uniform play would not have; set agent_ids: false"
        )
    settings = asynchronous(config)
    if settings is not None and settings.device == "cuda":
        from marl_core.distributed.learning import resolve_device

        resolve_device(settings.device)


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
                    f"settings.{name}.encoder='nature_cnn' reads [channels, {network.frame_size}, {network.frame_size}] "
                    f"frames; policy {policy!r} observes {size} numbers, not a multiple of {pixels} "
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


# --- the rollout workers: the one rollout engine's pool, in this process or on Ray -------------


def pool_config(config: MARLConfig) -> PoolConfig:
    from marl_core.rollout.pool import PoolConfig

    return PoolConfig(config.env, config.workers, config.envs_per_worker)


TRAINING_PROGRESS = "marl/training"  # the run's training steps, as progress in the pool's store


def training_work(config: MARLConfig, first_round: int = 0) -> Work:
    """The joint steps of the rounds from `first_round` on, over every copy: the run's training
    as progress (evaluations play apart from it)."""
    from marl_core.rollout.progress import Work

    copies = config.workers * config.envs_per_worker
    total = (config.rounds - first_round) * config.steps_per_round * copies
    return Work(TRAINING_PROGRESS, f"{config.algorithm} training", total, "steps")


@dataclasses.dataclass
class Collected:
    """One round's experience and the training episodes that finished in it."""

    batch: JointExperience  # E = all workers' copies side by side
    returns: np.ndarray  # [K, agents] summed rewards of finished episodes
    lengths: np.ndarray  # [K]
    env_steps: int  # joint steps taken (steps x copies)
    seconds: float


class LearnerHandle(Protocol):
    """The learner as the round's steps reach it: here (`LocalLearner`) or as a Ray actor
    (`RayLearner`). It publishes its acting networks to a pool's parameter
    store, so the workers pull the weights once per request and nothing else carries them."""

    def specs(self) -> dict[str, LearnerSpec]: ...

    def publish(self, pool, version: int) -> None: ...

    def learn(self, batch: JointExperience) -> dict[str, float]: ...


class LocalLearner:
    def __init__(self, learner, threads: int = 1):
        self.learner = learner
        self.threads = threads
        self._specs = learner_specs(learner)  # a network's architecture never changes

    def specs(self) -> dict[str, LearnerSpec]:
        return self._specs

    def publish(self, pool, version: int) -> None:
        publish(self.learner, pool, version)

    def learn(self, batch: JointExperience) -> dict[str, float]:
        with torch_threads(self.threads):  # the workers of this process wait meanwhile
            return self.learner.learn(batch)


@contextlib.contextmanager
def torch_threads(threads: int):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class LearnerActor:
    """The learner as a Ray actor: it keeps its networks, optimizers and buffers between rounds,
    and publishes its acting networks to the pool's parameter store itself. It lives here, not
    beside the flows, so that its process imports no Prefect."""

    def __init__(self, config: MARLConfig, state: dict | None):
        import torch

        torch.set_num_threads(config.learner_threads)
        layout, spec = layout_and_spec(config)
        self.learner = make_learner(config, layout, spec.state_size)
        if state is not None:
            self.learner.load_state_dict(state)

    def adopt(self, config: MARLConfig, state: dict) -> None:
        """Become a learner built from `config` that goes on from another's training `state`,
        its optimizers keeping `config`'s hyperparameters (PBT's exploit, in place)."""
        from marl_core.rl.optimizers import load_keeping_hyperparameters

        layout, spec = layout_and_spec(config)
        self.learner = make_learner(config, layout, spec.state_size)
        load_keeping_hyperparameters(self.learner, state)

    def specs(self):
        return learner_specs(self.learner)

    def publish(self, pool, version: int) -> None:
        publish(self.learner, pool, version)

    def learn(self, batch) -> dict[str, float]:
        return self.learner.learn(batch)

    def state(self) -> dict:
        return self.learner.state_dict()

    def checkpoint(self) -> tuple[dict, dict]:
        """(training state, policy id -> acting weights)."""
        return self.learner.state_dict(), {p: policy.get_weights() for p, policy in self.learner.policies.items()}


class RayLearner:
    """`LearnerHandle` over the learner actor; it pickles, so the round's tasks reach
    the actor. The workers' build specs are read once: a network's architecture never changes."""

    def __init__(self, actor):
        self.actor = actor
        self._specs = _ray_get(actor.specs.remote())

    def specs(self):
        return self._specs

    def publish(self, pool, version: int) -> None:
        _ray_get(self.actor.publish.remote(pool, version))

    def learn(self, batch) -> dict[str, float]:
        return _ray_get(self.actor.learn.remote(batch))


def _ray_get(ref):
    import ray

    return ray.get(ref)


def learner_specs(learner) -> dict[str, LearnerSpec]:
    """Policy id -> how a worker builds and refreshes that policy's acting network."""
    import copy

    from marl_core.rollout.worker import LearnerSpec, NetworkCopy

    # The workers' copies are built on the CPU, wherever the learner's networks live.
    return {
        policy: LearnerSpec(_weights_key(policy), NetworkCopy(copy.deepcopy(network).cpu()))
        for policy, network in learner.policies.items()
    }


def publish(learner, pool, version: int) -> None:
    publish_weights(pool, version, {policy: network.get_weights() for policy, network in learner.policies.items()})


def publish_weights(pool, version: int, weights: dict) -> None:
    """Policy id -> acting weights, into the pool's parameter store."""
    for policy, policy_weights in weights.items():
        pool.push(_weights_key(policy), version, policy_weights)


def _weights_key(policy: str) -> str:
    return f"marl/{policy}"


# --- the three steps of a round ---------------------------------------------------------------
# A round's weights version is its index: the learner has learned `round` times when the
# round's rollouts start, and `round + 1` times when its evaluation starts.


def collect_rollouts(config: MARLConfig, pool, learner: LearnerHandle, round: int) -> Collected:
    """Every worker plays `steps_per_round` joint steps per copy, its episodes running on from
    the previous round's (one fragment stream per worker)."""
    from marl_core.marl.batch import JointExperience
    from marl_core.rollout.worker import Fragment, RolloutRequest

    started = time.perf_counter()
    learner.publish(pool, round)
    specs = learner.specs()
    requests = [
        RolloutRequest(
            roles=policy_mapping(config),
            learners=specs,
            fragment=Fragment(f"train/{worker}", round, config.steps_per_round),
            seed=(config.seed, 1, round, worker),
            weights_version=round,
            agent_ids=config.agent_ids,
            global_state=uses_global_state(config),
        )
        for worker in range(pool.size)
    ]
    results = pool.collect(requests, progress=TRAINING_PROGRESS)
    return Collected(
        batch=JointExperience.concat_envs([r.joint for r in results]),
        returns=np.concatenate([r.episode_returns for r in results]),
        lengths=np.concatenate([r.episode_lengths for r in results]),
        env_steps=sum(r.env_steps for r in results),
        seconds=time.perf_counter() - started,
    )


def update_learner(learner: LearnerHandle, collected: Collected) -> dict[str, float]:
    return learner.learn(collected.batch)


@dataclasses.dataclass
class Evaluation:
    """What `evaluate-policies` played: [episodes, agents] summed rewards of the learners'
    greedy episodes against one another, and, with `eval_versus_uniform`, column k of
    `versus_uniform` is agent k's return in episodes where it alone played its policy."""

    returns: np.ndarray
    versus_uniform: np.ndarray | None = None


UNIFORM_ROLE = "uniform"  # `uniform/<agent>`: the role of an agent that plays uniformly at random in `versus_uniform`


def evaluate_policies(config: MARLConfig, pool, learner: LearnerHandle, round: int) -> Evaluation:
    """`eval_episodes` whole episodes from fresh resets (greedy unless `eval_greedy` is off),
    split over the workers, and as many per agent against uniform play when asked. Each copy
    plays an exact share, so which episodes count never depends on their outcome or length."""
    from marl_core.rollout.worker import RolloutRequest

    learner.publish(pool, round + 1)
    specs = learner.specs()
    version = NEWEST if asynchronous(config) else round + 1  # an asynchronous learner versions its own weights
    shares = [len(share) for share in np.array_split(np.arange(config.eval_episodes), pool.size)]
    mapping = policy_mapping(config)

    def requests(roles, learners, populations, stream: int) -> list[RolloutRequest]:
        return [
            RolloutRequest(
                roles=roles,
                episodes=share,
                seed=(config.seed, 4, round, worker, *([stream] if stream else [])),
                learners=learners,
                populations=populations,
                weights_version=version,
                explore=not config.eval_greedy,
                agent_ids=config.agent_ids,
                experience=False,
            )
            for worker, share in enumerate(shares)
            if share
        ]

    batches = [requests(mapping, specs, {}, 0)]
    if config.eval_versus_uniform:
        layout, _ = layout_and_spec(config)
        for k, agent in enumerate(layout.agents):
            alone = UniformInSeats(tuple(other for other in layout.agents if other != agent), mapping)
            batches.append(requests(alone, {mapping(agent): specs[mapping(agent)]}, alone.populations(), k + 1))
    results = pool.collect([request for batch in batches for request in batch])
    returns, offset = [], 0
    for batch in batches:
        returns.append(np.concatenate([r.episode_returns for r in results[offset : offset + len(batch)]]))
        offset += len(batch)
    if not config.eval_versus_uniform:
        return Evaluation(returns[0])
    return Evaluation(returns[0], np.stack([played[:, k] for k, played in enumerate(returns[1:])], axis=1))


@dataclasses.dataclass(frozen=True)
class UniformInSeats:
    """Agent -> role: the agents in `seats` play uniformly at random, each under a role of its
    own (agents of different observation or action sizes cannot share one), the others the
    policies `policy_of` maps them to."""

    seats: tuple[str, ...]  # in the layout's order: the populations', and so the draws', order
    policy_of: Callable[[str], str]

    def __call__(self, agent: str) -> str:
        return f"{UNIFORM_ROLE}/{agent}" if agent in self.seats else self.policy_of(agent)

    def populations(self) -> dict:
        """Role -> uniform play, for a request's `populations`."""
        from marl_core.policies.base import UniformPolicy
        from marl_core.rollout.worker import PolicyMixture

        uniform = PolicyMixture((UniformPolicy(),), np.ones(1))
        return {self(agent): uniform for agent in self.seats}


@dataclasses.dataclass
class RoundRecord:
    round: int
    env_steps: int  # since the run started
    train_returns: dict[str, float]  # per agent and per policy ("policy/<id>"): finished training episodes
    eval_returns: dict[str, float] | None  # same keys, greedy evaluation; None when not due
    eval_stderr: dict[str, float] | None
    learner: dict[str, float]  # the learner's metrics (losses, ...)
    steps_per_second: float  # joint environment steps per second of collection
    seconds: dict[str, float]  # collect / learn / evaluate
    staleness: dict[int, int] | None = None  # asynchronous rounds: fragments taken, by staleness

    @property
    def metrics(self) -> dict[str, float]:
        """Everything as flat MLflow metric names."""
        out = {f"train_return/{k}": v for k, v in self.train_returns.items()}
        if self.eval_returns:
            out.update({f"eval_return/{k}": v for k, v in self.eval_returns.items()})
            out.update({f"eval_return_stderr/{k}": v for k, v in self.eval_stderr.items()})
        out.update({f"learner/{k}": v for k, v in self.learner.items()})
        out.update(env_steps=float(self.env_steps), env_steps_per_second=self.steps_per_second)
        out.update({f"seconds/{k}": v for k, v in self.seconds.items()})
        return out


def summarize(returns: np.ndarray, agents, groups) -> tuple[dict[str, float], dict[str, float]]:
    """Mean and standard error of episode returns per agent and per policy."""
    if len(returns) == 0:
        return {}, {}
    mean, stderr = {}, {}
    for k, agent in enumerate(agents):
        mean[agent] = float(returns[:, k].mean())
        stderr[agent] = float(returns[:, k].std(ddof=1) / np.sqrt(len(returns))) if len(returns) > 1 else 0.0
    for policy, members in groups.items():
        per_episode = returns[:, [agents.index(a) for a in members]].mean(axis=1)
        mean[f"policy/{policy}"] = float(per_episode.mean())
        stderr[f"policy/{policy}"] = float(per_episode.std(ddof=1) / np.sqrt(len(returns))) if len(returns) > 1 else 0.0
    return mean, stderr


def evaluation_due(config: MARLConfig, round: int) -> bool:
    return (round + 1) % config.eval_every == 0 or round == config.rounds - 1


def evaluate_when_due(
    config: MARLConfig, round: int, runner, pool, learner, layout
) -> tuple[dict | None, dict | None, float]:
    """The round's `evaluate-policies` step through `runner` when it is due: the greedy returns'
    mean and standard error per agent and policy, and per agent against uniform play
    (`vs_uniform/<agent>`) when asked (None, None when not due), and its seconds."""
    if not evaluation_due(config, round):
        return None, None, 0.0
    started = time.perf_counter()
    evaluation = runner.result(runner.submit("evaluate-policies", config, pool, learner, round))
    return (*summarize_evaluation(evaluation, layout), time.perf_counter() - started)


def summarize_evaluation(evaluation: Evaluation, layout) -> tuple[dict[str, float], dict[str, float]]:
    """An evaluation's mean returns and their standard errors, per agent and policy, and per
    agent against uniform play (`vs_uniform/<agent>`) where it played that."""
    mean, stderr = summarize(evaluation.returns, list(layout.agents), layout.groups)
    if evaluation.versus_uniform is not None:
        versus, versus_stderr = summarize(evaluation.versus_uniform, list(layout.agents), {})
        mean.update({f"vs_uniform/{agent}": value for agent, value in versus.items()})
        stderr.update({f"vs_uniform/{agent}": value for agent, value in versus_stderr.items()})
    return mean, stderr


def checkpoint_due(config: MARLConfig, round: int) -> bool:
    return (round + 1) % config.checkpoint_every == 0 or round == config.rounds - 1


NEWEST = sys.maxsize  # an asynchronous round's requests ask for the newest weights there are


def asynchronous(config: MARLConfig) -> AsyncConfig | None:
    """The run's asynchronous settings (`marl_core.marl.async_rounds`), or None for
    collect-then-learn rounds."""
    return getattr(config.algorithm_settings, "asynchronous", None)


def uses_global_state(config: MARLConfig) -> bool:
    """Whether the run's learner reads the global state (centralized critics and mixers do;
    independent learners do not, and their fragments leave it out)."""
    return getattr(MARL_ALGORITHMS[config.algorithm].learner, "uses_global_state", True)


def make_learner(config: MARLConfig, layout, state_size: int):
    return MARL_ALGORITHMS[config.algorithm].learner(layout, state_size, config.algorithm_settings)
