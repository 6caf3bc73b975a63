"""The steps of a collect-then-learn MARL round, the evaluation every round ends with when due,
and the record a round leaves.

A round is three named steps, wired once in `marl_core.marl.rounds.run_round` and run in this
process or as Prefect tasks on Ray:

1. `collect-rollouts`: the learner publishes its networks to the pool's weight store, and the
   rollout workers (the one rollout engine, `marl_core.rollout`) play `steps_per_round` joint
   steps in each of their environment copies with them (exploring), episodes running on across
   rounds;
2. `update-learner`: the learner trains on that segment;
3. `evaluate-policies` (every `eval_every` rounds and at the end): the workers play
   `eval_episodes` whole episodes greedily, from fresh resets, so the figure does not depend on
   where training episodes happened to stop.

Returns are reported per agent and per policy (the agents that share it), summed over an
episode; a policy's return is the mean over its agents. An asynchronous algorithm's rounds
stream and learn at once instead (`marl_core.marl.async_rounds`), and end with the same
evaluation and the same record.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from marl_core.marl.config import (
    TRAINING_PROGRESS,
    MARLConfig,
    asynchronous,
    evaluation_due,
    layout_and_spec,
    policy_mapping,
    uses_global_state,
)

if TYPE_CHECKING:  # the rollout engine imports torch; the steps import it where they run
    from marl_core.marl.learner_handles import LearnerHandle
    from marl_core.rollout.joint_experience import JointExperience


NEWEST = sys.maxsize  # an asynchronous round's requests ask for the newest weights there are


@dataclasses.dataclass
class Collected:
    """One round's experience and the training episodes that finished in it."""

    batch: JointExperience  # E = all workers' copies side by side
    returns: np.ndarray  # [K, agents] summed rewards of finished episodes
    lengths: np.ndarray  # [K]
    env_steps: int  # joint steps taken (steps x copies)
    seconds: float


# --- the three steps of a round ---------------------------------------------------------------
# A round's weights version is its index: the learner has learned `round` times when the
# round's rollouts start, and `round + 1` times when its evaluation starts.


def collect_rollouts(config: MARLConfig, pool, learner: LearnerHandle, round: int) -> Collected:
    """Every worker plays `steps_per_round` joint steps per copy, its episodes running on from
    the previous round's (one fragment stream per worker)."""
    from marl_core.rollout.joint_experience import JointExperience
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


# --- what a round leaves -----------------------------------------------------------------------


@dataclasses.dataclass
class RoundRecord:
    """What a round leaves, of either kind: its returns, its learners' metrics, its throughput
    and where its time went; `metrics` names them for MLflow."""

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
