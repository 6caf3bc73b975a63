"""The MARL training scenario (MALib's `MARLScenario`): a fixed set of learners on one environment.

A run is a sequence of *rounds*, each three named steps, written once here and run either in
this process (`iterate_marl_local`) or as Prefect tasks on Ray (`flows/marl_flow.py`):

1. `collect`: the rollout workers play `steps_per_round` joint steps in each of their
   environment copies with the learner's current policies (exploring);
2. `learn`: the learner trains on that segment;
3. `evaluate` (every `eval_every` rounds and at the end): the workers play `eval_episodes` whole
   episodes greedily, from fresh resets, so the figure does not depend on where training
   episodes happened to stop.

Returns are reported per agent and per policy (the agents that share it), summed over an
episode; a policy's return is the mean over its agents.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from marl_core.marl import MARL_ALGORITHMS


class MARLConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str = Field(description="a simultaneous environment: pettingzoo:<module with parallel_env()>")
    algorithm: str = Field("mappo", description="MARL algorithm (see marl_core.marl.MARL_ALGORITHMS)")
    settings: dict[str, Any] = Field(default_factory=dict, description="the algorithm's hyperparameters")
    policies: Optional[dict[str, str]] = Field(
        None, description="agent-name prefix -> policy id; default: agents named <role>_<n> share the policy <role>"
    )
    agent_ids: bool = Field(True, description="agents that share a policy see a one-hot of their index")
    rounds: int = Field(100, gt=0, description="training rounds")
    steps_per_round: int = Field(128, gt=0, description="joint steps per environment copy per round")
    workers: int = Field(1, gt=0, description="rollout workers (Ray actors in a flow)")
    envs_per_worker: int = Field(8, gt=0, description="environment copies per worker")
    eval_every: int = Field(10, gt=0, description="rounds between greedy evaluations (and after the last)")
    eval_episodes: int = Field(32, gt=0, description="greedy episodes per evaluation")
    checkpoint_every: int = Field(10, gt=0, description="rounds between committed checkpoints (and after the last)")
    seed: int = 0
    # where the flow runs and tracks; unused by the in-process loop
    tracking_uri: str = "sqlite:///mlflow.db"
    experiment: str = "marl"
    ray_address: Optional[str] = None
    num_cpus: Optional[int] = Field(None, gt=0)

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
    policy id that is not in the layout) before any server, actor or run starts."""
    from marl_core.marl.collector import JointCollector

    collector = JointCollector(config.env, 1, policy_mapping(config), config.agent_ids, config.seed)
    collector.close()
    unknown = sorted(set(getattr(config.algorithm_settings, "frozen", ())) - set(collector.layout.groups))
    if unknown:
        raise ValueError(f"settings.frozen={unknown}: no such policy; the policies are {sorted(collector.layout.groups)}")


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


# --- the rollout workers: JointCollectors here, or Ray actors holding them --------------------


@dataclasses.dataclass
class Collected:
    """One round's experience and the training episodes that finished in it."""

    batch: Any  # JointExperience, E = all workers' copies side by side
    returns: np.ndarray  # [K, agents] summed rewards of finished episodes
    lengths: np.ndarray  # [K]
    env_steps: int  # joint steps taken (steps x copies)
    seconds: float


class Workers:
    """Rollout workers: `workers` collectors of `envs_per_worker` copies each, plus one greedy
    evaluation collector per worker. In this process they run one after another; see
    `flows.marl_flow.RayWorkers` for the same interface on Ray actors."""

    def __init__(self, config: MARLConfig):
        from marl_core.marl.collector import JointCollector

        mapping = policy_mapping(config)
        make = lambda i, seed: JointCollector(config.env, config.envs_per_worker, mapping, config.agent_ids, seed)  # noqa: E731
        self.collectors = [make(i, _seed(config.seed, 1, i)) for i in range(config.workers)]
        self.evaluators = [make(i, _seed(config.seed, 2, i)) for i in range(config.workers)]
        self.layout = self.collectors[0].layout
        self.spec = self.collectors[0].spec

    def collect(self, policies, steps: int) -> Collected:
        started = time.perf_counter()
        parts = [collector.collect(policies, steps) for collector in self.collectors]
        return _merge(parts, steps, time.perf_counter() - started)

    def evaluate(self, policies, episodes: int, seed: int) -> np.ndarray:
        shares = np.array_split(np.arange(episodes), len(self.evaluators))
        return np.concatenate([
            evaluator.play_episodes(policies, len(share), seed=_seed(seed, 3, i))
            for i, (evaluator, share) in enumerate(zip(self.evaluators, shares)) if len(share)
        ])


def layout_and_spec(config: MARLConfig):
    """The policy layout and environment spec of `config`, read from one environment copy: what a
    learner or a pool of remote workers needs to know without stepping anything."""
    from marl_core.marl.collector import JointCollector

    probe = JointCollector(config.env, 1, policy_mapping(config), config.agent_ids, config.seed)
    probe.close()
    return probe.layout, probe.spec


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


def _merge(parts, steps: int, seconds: float) -> Collected:
    from marl_core.marl.batch import JointExperience

    batch = JointExperience.concat_envs([p[0] for p in parts])
    returns = np.concatenate([p[1] for p in parts])
    lengths = np.concatenate([p[2] for p in parts])
    return Collected(batch, returns, lengths, steps * batch.envs, seconds)


# --- one round ---------------------------------------------------------------------------------


@dataclasses.dataclass
class RoundRecord:
    round: int
    env_steps: int  # since the run started
    train_returns: dict[str, float]  # per agent and per policy ("policy/<id>"): finished training episodes
    eval_returns: Optional[dict[str, float]]  # same keys, greedy evaluation; None when not due
    eval_stderr: Optional[dict[str, float]]
    learner: dict[str, float]  # the learner's metrics (losses, ...)
    steps_per_second: float  # joint environment steps per second of collection
    seconds: dict[str, float]  # collect / learn / evaluate

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


def checkpoint_due(config: MARLConfig, round: int) -> bool:
    return (round + 1) % config.checkpoint_every == 0 or round == config.rounds - 1


def make_learner(config: MARLConfig, layout, state_size: int):
    return MARL_ALGORITHMS[config.algorithm].learner(layout, state_size, config.algorithm_settings)


def round_record(config, round: int, env_steps: int, collected: Collected, learner_metrics, evaluation, seconds, layout) -> RoundRecord:
    agents, groups = list(layout.agents), layout.groups
    train, _ = summarize(collected.returns, agents, groups)
    eval_mean = eval_stderr = None
    if evaluation is not None:
        eval_mean, eval_stderr = summarize(evaluation, agents, groups)
    return RoundRecord(
        round=round, env_steps=env_steps, train_returns=train, eval_returns=eval_mean, eval_stderr=eval_stderr,
        learner=learner_metrics, steps_per_second=collected.env_steps / max(collected.seconds, 1e-9), seconds=seconds,
    )


def iterate_marl_local(config: MARLConfig, learner=None, first_round: int = 0, env_steps: int = 0, workers=None) -> Iterator[tuple[RoundRecord, Any]]:
    """The rounds in this process: yields (record, learner) after each round. `workers`: anything
    with `Workers`' interface (`flows.marl_flow.RayWorkers` plays on Ray actors at the same time);
    by default the workers play here, one after another."""
    import torch

    torch.set_num_threads(1)  # small networks, many small batches: threads only contend
    workers = workers or Workers(config)
    learner = learner or make_learner(config, workers.layout, workers.spec.state_size)
    for round in range(first_round, config.rounds):
        collected = workers.collect(learner.policies, config.steps_per_round)
        started = time.perf_counter()
        learner_metrics = learner.learn(collected.batch)
        learned = time.perf_counter() - started
        evaluation, evaluated = None, 0.0
        if evaluation_due(config, round):
            started = time.perf_counter()
            evaluation = workers.evaluate(learner.policies, config.eval_episodes, _seed(config.seed, 4, round))
            evaluated = time.perf_counter() - started
        env_steps += collected.env_steps
        seconds = {"collect": collected.seconds, "learn": learned, "evaluate": evaluated}
        yield round_record(config, round, env_steps, collected, learner_metrics, evaluation, seconds, workers.layout), learner
