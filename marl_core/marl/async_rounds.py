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
   distributed strategy (`marl_core.distributed`); with one learner there is none.

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
from typing import TYPE_CHECKING, Protocol

import numpy as np

from marl_core.marl.training import (
    NEWEST,
    TRAINING_PROGRESS,
    MARLConfig,
    RoundRecord,
    asynchronous,
    evaluate_when_due,
    layout_and_spec,
    learner_specs,
    make_learner,
    policy_mapping,
    publish_weights,
    summarize,
    uses_global_state,
)

if TYPE_CHECKING:
    from marl_core.distributed.learning import LearnerReport
    from marl_core.distributed.settings import AsyncConfig
    from marl_core.rollout.worker import StreamSummary


def batches_per_learner(config: MARLConfig, settings: AsyncConfig) -> int:
    """Each learner's batches in a round: the round's `workers` fragments shared out (rounded up)."""
    return math.ceil(config.workers / (settings.fragments_per_batch * settings.distributed.learners))


class AsyncLearners(Protocol):
    """The learners of an asynchronous run as a round reaches them: here (`LocalAsyncLearners`) or
    on Ray. `master` holds the weights the workers act with (the one learner, or the parameter
    server's copy) and is what `publish`, `specs`, evaluation and checkpoints use."""

    dataset: object  # the dataset server (or its actor's client)
    sink: object  # what the workers stream into: the dataset server, or its actor's name

    def specs(self): ...

    def publish(self, pool, version: int) -> None: ...

    def members(self) -> int: ...

    def train(self, member: int, pool, batches: int) -> LearnerReport: ...


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


class LocalAsyncLearners:
    """`AsyncLearners` in this process: the dataset server, and the learner(s) on threads. With
    several learners of each policy, `learner` becomes the parameter server's master copy and
    each learner a fresh copy that pulls its weights."""

    def __init__(self, config: MARLConfig, learner, make_copy):
        from marl_core.distributed.dataset_server import DatasetServer
        from marl_core.distributed.learning import LocalSteps, ServerSteps, place, resolve_device
        from marl_core.distributed.parameter_server import ParameterServer

        self.settings = settings = asynchronous(config)
        device = resolve_device(settings.device)
        self.dataset = self.sink = DatasetServer(settings.dataset, seed=config.seed)
        self.master = learner = place(learner, device)
        self._specs = learner_specs(learner)
        self.server = None
        if settings.distributed.learners == 1:
            self._learners, self._steps = [learner], [LocalSteps(learner)]
        else:
            self.server = ParameterServer(learner, learner.policies, settings.distributed)
            self._learners = [place(make_copy(), device) for _ in range(settings.distributed.learners)]
            self._steps = [ServerSteps(copy, self.server, i) for i, copy in enumerate(self._learners)]

    def specs(self):
        return self._specs

    def publish(self, pool, version: int) -> None:
        """The master's acting networks under their own version (its optimizer steps): `version`
        is not used, since the workers of an asynchronous run ask for the newest."""
        if self.server is None:
            publish_weights(pool, self._steps[0].version, {p: n.get_weights() for p, n in self.master.policies.items()})
        else:
            publish_weights(pool, *self.server.weights())

    def members(self) -> int:
        return len(self._learners)

    def checkpoint(self) -> tuple[dict, dict]:
        if self.server is not None:
            return self.server.checkpoint()
        return self.master.state_dict(), {p: n.get_weights() for p, n in self.master.policies.items()}

    def train(self, member: int, pool, batches: int) -> LearnerReport:
        from marl_core.distributed.learning import learn_from_dataset

        publish = (lambda version: self.publish(pool, version)) if member == 0 else None
        return learn_from_dataset(
            self._learners[member],
            self._steps[member],
            self.dataset,
            batches,
            self.settings.fragments_per_batch,
            publish,
            self.settings.publish_every,
            index=member,
        )


def run_async_round(config: MARLConfig, round: int, env_steps: int, runner, pool, learners: AsyncLearners, layout):
    """One asynchronous round: stream and train at once, then evaluate when due."""
    started = time.perf_counter()
    dataset = learners.dataset
    before = dataset.stats().staleness
    dataset.open()
    learners.publish(pool, round)
    streaming = runner.submit("stream-rollouts", config, pool, learners)
    training = [runner.submit("train-learner", config, pool, learners, member) for member in range(learners.members())]
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


# --- on Ray: the dataset server, the learners and their parameter server as actors ------------


LEARNER_STATE = "async/learner-state"  # parameter-store key of a lone learner's whole training state


class _LearnerActor:
    """One learner of an asynchronous run, restarted by Ray if its process dies.

    Alone, it is also the master (its weights are the workers'), and whenever it publishes its
    weights it also leaves its whole training state in the pool's parameter store: a restarted
    learner goes on from there, not from the run's start. One of several, it pulls from and
    pushes to the parameter server actor, which holds the training state; a restarted one pulls
    the weights and rejoins with a fresh clock."""

    def __init__(
        self, config: MARLConfig, state: dict | None, store: str, index: int = 0, server: str | None = None
    ):
        import torch

        from marl_core.distributed.learning import LocalSteps, ServerSteps, place, resolve_device
        from marl_core.rollout.store import StoreClient

        torch.set_num_threads(1)
        layout, spec = layout_and_spec(config)
        self.settings = asynchronous(config)
        self.learner = place(make_learner(config, layout, spec.state_size), resolve_device(self.settings.device))
        self.index = index
        self.server = None if server is None else _ServerClient(server)
        if server is not None:
            self.steps = ServerSteps(self.learner, self.server, index)
            self.server.join(index)
            return
        self.steps = LocalSteps(self.learner)
        left = StoreClient(store).pull(LEARNER_STATE, -1)
        if left is not None:  # restarted
            self.steps.version, state = left
        if state is not None:
            self.learner.load_state_dict(state)

    def specs(self):
        return learner_specs(self.learner)

    def publish(self, pool) -> None:
        if self.server is not None:
            publish_weights(pool, *self.server.weights())
            return
        publish_weights(pool, self.steps.version, {p: n.get_weights() for p, n in self.learner.policies.items()})
        pool.push(LEARNER_STATE, self.steps.version, self.learner.state_dict())

    def train(self, pool, dataset: str, batches: int) -> LearnerReport:
        from marl_core.distributed.dataset_server import DatasetClient
        from marl_core.distributed.learning import learn_from_dataset

        publish = (lambda version: self.publish(pool)) if self.index == 0 else None
        return learn_from_dataset(
            self.learner,
            self.steps,
            DatasetClient(dataset),
            batches,
            self.settings.fragments_per_batch,
            publish,
            self.settings.publish_every,
            index=self.index,
        )

    def checkpoint(self) -> tuple[dict, dict]:
        """(training state, policy id -> acting weights)."""
        return self.learner.state_dict(), {p: n.get_weights() for p, n in self.learner.policies.items()}

    def pid(self) -> int:
        import os

        return os.getpid()


class _ServerActor:
    """The parameter server of an asynchronous run's learners, holding the master learner."""

    def __init__(self, config: MARLConfig, state: dict | None):
        import torch

        from marl_core.distributed.learning import place, resolve_device
        from marl_core.distributed.parameter_server import ParameterServer

        torch.set_num_threads(1)
        layout, spec = layout_and_spec(config)
        self.learner = place(make_learner(config, layout, spec.state_size), resolve_device(asynchronous(config).device))
        if state is not None:
            self.learner.load_state_dict(state)
        self.server = ParameterServer(self.learner, self.learner.policies, asynchronous(config).distributed)

    def pull(self, learner: int, have_version: int):
        return self.server.pull(learner, have_version)

    def push(self, learner: int, base_version: int, grads, samples: int):
        return self.server.push(learner, base_version, grads, samples)

    def weights(self):
        return self.server.weights()

    def join(self, learner: int) -> None:
        self.server.join(learner)

    def specs(self):
        return learner_specs(self.learner)

    def publish(self, pool) -> None:
        publish_weights(pool, *self.server.weights())

    def checkpoint(self) -> tuple[dict, dict]:
        return self.server.checkpoint()


class _ServerClient:
    """The parameter server actor seen as a `ParameterServer` by a learner, found by name."""

    def __init__(self, name: str):
        import ray

        self.handle = ray.get_actor(name)

    def _call(self, method: str, *args):
        import ray

        return ray.get(getattr(self.handle, method).remote(*args))

    def pull(self, learner: int, have_version: int):
        return self._call("pull", learner, have_version)

    def push(self, learner: int, base_version: int, grads, samples: int):
        return self._call("push", learner, base_version, grads, samples)

    def weights(self):
        return self._call("weights")

    def join(self, learner: int) -> None:
        self._call("join", learner)


class RayAsyncLearners:
    """`AsyncLearners` on Ray: a dataset server actor, one learner actor per learner, and with
    several, a parameter server actor. Every actor reserves no CPU slot, as the rollout workers
    do, and the learners are dealt over the cluster's nodes as the workers are
    (`marl_core.rollout.pool`). Its handles pickle, so the round's tasks reach the actors.
    A learner whose process dies is restarted and its round's training call retried: a
    retried call learns its round's batches afresh."""

    def __init__(self, config: MARLConfig, state: dict | None, pool, max_restarts: int = 3):
        import uuid

        import ray

        from marl_core.distributed.dataset_server import DatasetClient, DatasetServer

        settings = asynchronous(config)
        learners = settings.distributed.learners
        self.sink = f"dataset-server-{uuid.uuid4().hex}"
        threads = config.workers + learners + 4  # every blocking put and take at once, and the rest
        self._dataset = (
            ray.remote(num_cpus=0, max_concurrency=threads)(DatasetServer)
            .options(name=self.sink)
            .remote(settings.dataset, config.seed)
        )
        self.dataset = DatasetClient(self._dataset)
        actor = ray.remote(num_cpus=0, memory=1024**2, max_restarts=max_restarts, max_task_retries=max_restarts)(
            _LearnerActor
        )
        on_node = _spread_over_nodes()
        if learners == 1:
            self._members = [actor.options(scheduling_strategy=on_node(0)).remote(config, state, pool.store_name)]
            self._master = self._members[0]
        else:
            server = f"parameter-server-{uuid.uuid4().hex}"
            self._master = (
                ray.remote(num_cpus=0, max_concurrency=2 * learners + 4)(_ServerActor)
                .options(name=server)
                .remote(config, state)
            )
            ray.get(self._master.specs.remote())  # started, so the learners find it by name
            self._members = [
                actor.options(scheduling_strategy=on_node(i)).remote(config, None, pool.store_name, i, server)
                for i in range(learners)
            ]
        self._specs = ray.get(self._master.specs.remote())

    def specs(self):
        return self._specs

    def publish(self, pool, version: int) -> None:
        import ray

        ray.get(self._master.publish.remote(pool))

    def members(self) -> int:
        return len(self._members)

    def train(self, member: int, pool, batches: int) -> LearnerReport:
        import ray

        return ray.get(self._members[member].train.remote(pool, self.sink, batches))

    def checkpoint(self) -> tuple[dict, dict]:
        import ray

        return ray.get(self._master.checkpoint.remote())

    def close(self) -> None:
        import ray

        for handle in {*self._members, self._master, self._dataset}:
            ray.kill(handle)


def _spread_over_nodes():
    """Learner i's scheduling strategy: soft affinity to the i-th node with CPUs, round robin."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from marl_core.rollout.pool import nodes_with_cpus

    nodes = nodes_with_cpus()
    return lambda i: NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=True)
