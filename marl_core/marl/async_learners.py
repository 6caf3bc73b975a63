"""The learners of an asynchronous MARL run: they train while the workers play.

Each learner loops (`learn_from_dataset`): take fragments from the dataset server, take the
algorithm's gradient steps on them, and every `publish_every` batches publish its acting
networks for the workers to pull. What differs is where a step's gradient goes:

- `LocalSteps` (one learner): its own optimizers step at once.
- `ServerSteps` (several): the gradient is pushed to the `ParameterServer` under its strategy and
  the newest weights pulled back before the next step is computed.

A weights version counts optimizer steps, so a fragment's staleness (the learner's version when it
takes the fragment, minus the version that played it) is in the unit V-trace corrects for.
With several learners, learner 0 publishes.

The round's steps (`marl_core.marl.async_rounds`) reach the learners as `AsyncLearners`: in this
process, with the dataset server and the learners on threads (`LocalAsyncLearners`), or on Ray,
the dataset server, every learner and their parameter server each an actor (`RayAsyncLearners`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from marl_core.marl.config import MARLConfig, asynchronous, layout_and_spec, make_learner
from marl_core.marl.learner import learner_specs, place, publish_weights, resolve_device
from marl_core.rl.gradient_steps import LossStep, apply_gradients, gradients
from marl_core.rollout.joint_experience import JointExperience


@dataclasses.dataclass
class LearnerReport:
    """What one learner did in one call of `learn_from_dataset`."""

    learner: int
    batches: int
    version: int  # its weights version at the end
    learn_seconds: float  # computing and applying gradient steps
    wait_seconds: float  # waiting for fragments
    fragments: int
    env_steps: int  # joint steps x copies in the fragments it learned from
    metrics: dict[str, float]  # the mean of each step metric
    dropped_steps: int = 0  # gradients the parameter server did not apply

    @property
    def utilisation(self) -> float:
        return self.learn_seconds / max(self.learn_seconds + self.wait_seconds, 1e-9)


class LocalSteps:
    """One learner: its own optimizers apply each step."""

    def __init__(self, learner, version: int = 0):
        self.learner = learner
        self.groups = learner.optimized_groups()
        self.version = version
        self.dropped = 0

    def begin(self) -> None:
        pass

    def step(self, step: LossStep) -> None:
        apply_gradients(self.groups, gradients(self.groups, step))
        self.version += 1


class ServerSteps:
    """One of several learners: each step's gradient goes to the parameter server (an object or
    anything with its `pull` and `push`, such as a Ray actor's client), the newest weights come back."""

    def __init__(self, learner, server, index: int):
        self.learner, self.server, self.index = learner, server, index
        self.groups = learner.optimized_groups()
        self.version = -1
        self.dropped = 0

    def begin(self) -> None:
        self._pull()

    def step(self, step: LossStep) -> None:
        pushed = self.server.push(self.index, self.version, gradients(self.groups, step), step.samples)
        self.dropped += not pushed.applied
        self._pull()

    def _pull(self) -> None:
        pulled = self.server.pull(self.index, self.version)
        if pulled is not None:
            self.version, weights = pulled
            for name, network in self.learner.policies.items():
                network.set_weights(weights[name])


def learn_from_dataset(
    learner,
    steps: LocalSteps | ServerSteps,
    dataset,
    batches: int,
    fragments_per_batch: int,
    publish: Callable[[int], None] | None = None,
    publish_every: int = 1,
    take_timeout: float = 600.0,
    index: int = 0,
) -> LearnerReport:
    """Learn from `batches` batches of `fragments_per_batch` fragments each (their joint
    experience side by side), taken from `dataset` as they come. `publish(version)`, if given,
    makes the learner's acting networks the workers' newest."""
    report = LearnerReport(index, 0, steps.version, 0.0, 0.0, 0, 0, {})
    totals: dict[str, list[float]] = {}
    steps.begin()
    for batch_number in range(1, batches + 1):
        started = time.perf_counter()
        fragments = dataset.take(fragments_per_batch, max(steps.version, 0), take_timeout)
        taken = time.perf_counter()
        if fragments is None:
            raise TimeoutError(
                f"learner {index}: no {fragments_per_batch} fragment(s) from the dataset server within "
                f"{take_timeout:g} s"
            )
        batch = JointExperience.concat_envs([fragment.item.joint for fragment in fragments])
        for step in learner.loss_steps(batch):
            steps.step(step)
            for name, number in step.metrics.items():
                totals.setdefault(name, []).append(number)
        if publish is not None and batch_number % publish_every == 0:
            publish(steps.version)
        report.wait_seconds += taken - started
        report.learn_seconds += time.perf_counter() - taken
        report.batches += 1
        report.fragments += len(fragments)
        report.env_steps += sum(fragment.item.env_steps for fragment in fragments)
    report.version, report.dropped_steps = steps.version, steps.dropped
    report.metrics = {name: float(np.mean(numbers)) for name, numbers in totals.items()}
    return report


# --- the learners as the round's steps reach them ----------------------------------------------


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


class LocalAsyncLearners:
    """`AsyncLearners` in this process: the dataset server, and the learner(s) on threads. With
    several learners of each policy, `learner` becomes the parameter server's master copy and
    each learner a fresh copy that pulls its weights."""

    def __init__(self, config: MARLConfig, learner, make_copy):
        from marl_core.distributed.dataset_server import DatasetServer
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


# --- on Ray: the dataset server, the learners and their parameter server as actors ------------


LEARNER_STATE = "async/learner-state"  # weight-store key of a lone learner's whole training state


class _LearnerActor:
    """One learner of an asynchronous run, restarted by Ray if its process dies.

    Alone, it is also the master (its weights are the workers'), and whenever it publishes its
    weights it also leaves its whole training state in the pool's weight store: a restarted
    learner goes on from there, not from the run's start. One of several, it pulls from and
    pushes to the parameter server actor, which holds the training state; a restarted one pulls
    the weights and rejoins with a fresh clock."""

    def __init__(self, config: MARLConfig, state: dict | None, store: str, index: int = 0, server: str | None = None):
        import torch

        from marl_core.rollout.weight_store import WeightStoreClient

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
        left = WeightStoreClient(store).pull(LEARNER_STATE, -1)
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
