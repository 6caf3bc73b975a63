"""Asynchronous MARL rounds: the workers stream fragments into a dataset server while the
learners train on them (MALib's decoupled actors and learners; IMPALA's architecture).

An algorithm whose settings carry `asynchronous` (IMPALA and APPO always, IPPO on request) runs
its rounds this way instead of collect-then-learn (`rounds.run_round` dispatches). A round is
two steps that run at once, then the usual evaluation:

1. `stream-rollouts`: every worker plays fragments of `steps_per_round` joint steps of all its
   copies, one after another, each with the newest weights published, into the dataset server,
   until the learners have what the round needs; a full buffer makes the workers wait.
2. `train-learner` (one per learner): take `fragments_per_batch` fragments, take the
   algorithm's gradient steps on them, repeat; publish the acting networks every
   `publish_every` batches. The learners of one policy share a parameter server under the
   distributed strategy (`marl_core.distributed`); with one learner there is none. The learners,
   here or on Ray, are `marl_core.marl.async_learners`.

A round's learners take `workers` fragments in all, as many as a synchronous round learns from,
so the two compare at equal data; the workers meanwhile play on, up to the buffer's capacity
ahead (room for each fragment is reserved before it is played). The dataset server lives for the
whole run, and a fragment a worker finishes after the round closed is stored all the same, so
what is played at the end of one round is learned from in the next, and a run's joint steps are
what its learners took plus at most the buffer's capacity.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING

import numpy as np

from marl_core.marl.config import TRAINING_PROGRESS, MARLConfig, asynchronous, policy_mapping, uses_global_state
from marl_core.marl.steps import NEWEST, RoundRecord, evaluate_when_due, summarize

if TYPE_CHECKING:
    from marl_core.marl.async_learners import AsyncLearners, LearnerReport
    from marl_core.marl.settings import AsyncConfig
    from marl_core.rollout.worker import StreamSummary


def batches_per_learner(config: MARLConfig, settings: AsyncConfig) -> int:
    """Each learner's batches in a round: the round's `workers` fragments shared out (rounded up)."""
    return math.ceil(config.workers / (settings.fragments_per_batch * settings.distributed.learners))


@dataclasses.dataclass
class StreamReport:
    summaries: list[StreamSummary]
    seconds: float

    @property
    def env_steps(self) -> int:
        return sum(s.env_steps for s in self.summaries)


def stream_rollouts(config: MARLConfig, pool, learners: AsyncLearners) -> StreamReport:
    """Every worker streams its fragments into the dataset until it is closed."""
    from marl_core.rollout.worker import Fragment, RolloutRequest

    started = time.perf_counter()
    specs = learners.specs()
    requests = [
        RolloutRequest(
            roles=policy_mapping(config),
            learners=specs,
            fragment=Fragment(f"train/{worker}", 0, config.steps_per_round),
            seed=(config.seed, 1, worker),
            weights_version=NEWEST,
            agent_ids=config.agent_ids,
            global_state=uses_global_state(config),
        )
        for worker in range(pool.size)
    ]
    summaries = pool.stream(requests, learners.sink, progress=TRAINING_PROGRESS)
    return StreamReport(summaries, time.perf_counter() - started)


def train_learner(config: MARLConfig, pool, learners: AsyncLearners, member: int) -> LearnerReport:
    settings = asynchronous(config)
    return learners.train(member, pool, batches_per_learner(config, settings))


def round_metrics(
    stream: StreamReport, reports: list[LearnerReport], staleness: dict[int, int], seconds: float
) -> dict[str, float]:
    """The round's throughput, staleness and learner utilisation, as MLflow metric names."""
    taken = sum(r.env_steps for r in reports)
    fragments = sum(staleness.values())
    metrics = {
        "async/samples_in_per_second": stream.env_steps / max(seconds, 1e-9),
        "async/samples_out_per_second": taken / max(seconds, 1e-9),
        "async/learner_utilisation": float(np.mean([r.utilisation for r in reports])),
        "async/dropped_steps": float(sum(r.dropped_steps for r in reports)),
        "async/weights_version": float(max(r.version for r in reports)),
    }
    if fragments:
        metrics["async/staleness_mean"] = sum(k * n for k, n in staleness.items()) / fragments
        metrics["async/staleness_max"] = float(max(staleness))
    return metrics


def staleness_since(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
    """The fragments taken between two snapshots of the dataset server's staleness counts."""
    return {k: n - before.get(k, 0) for k, n in after.items() if n - before.get(k, 0) > 0}


def run_async_round(config: MARLConfig, round: int, env_steps: int, runner, pool, learners: AsyncLearners, layout):
    """One asynchronous round: stream and train at once, then evaluate when due."""
    started = time.perf_counter()
    dataset = learners.dataset
    before = dataset.stats().staleness
    dataset.open()
    learners.publish(pool, round)
    # The workers stream and, beside them, every learner trains
    streaming = runner.submit("stream-rollouts", config, pool, learners)
    training = [
        runner.submit_beside(streaming, "train-learner", config, pool, learners, member)
        for member in range(learners.members())
    ]
    try:
        reports = [runner.result(handle) for handle in training]
    finally:
        dataset.close()  # the workers stop at their next fragment
        stream = runner.result(streaming)
    seconds = time.perf_counter() - started
    eval_mean, eval_stderr, evaluated = evaluate_when_due(config, round, runner, pool, learners, layout)
    returns = np.concatenate([s.episode_returns for s in stream.summaries])
    train, _ = summarize(returns, list(layout.agents), layout.groups)
    metrics = {
        name: float(np.mean([r.metrics[name] for r in reports if name in r.metrics])) for name in reports[0].metrics
    }
    staleness = staleness_since(before, dataset.stats().staleness)
    metrics.update(round_metrics(stream, reports, staleness, seconds))
    return RoundRecord(
        round=round,
        env_steps=env_steps + stream.env_steps,
        train_returns=train,
        eval_returns=eval_mean,
        eval_stderr=eval_stderr,
        learner=metrics,
        steps_per_second=stream.env_steps / max(seconds, 1e-9),
        seconds={"collect": stream.seconds, "learn": max(r.learn_seconds for r in reports), "evaluate": evaluated},
        staleness=staleness,
    )
