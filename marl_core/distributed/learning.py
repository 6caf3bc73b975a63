"""A learner that trains while the workers play: batches come from the dataset server, gradient
steps go to its own optimizers or, with several learners of one policy, to their parameter server.

One loop serves both (`learn_from_dataset`); what differs is where a step's gradient goes:

- `LocalSteps` (one learner): its own optimizers step at once.
- `ServerSteps` (several): the gradient is pushed to the `ParameterServer` under its strategy and
  the newest weights pulled back before the next step is computed.

A weights version counts optimizer steps, so a fragment's staleness (the learner's version when it
takes the fragment, minus the version that played it) is in the unit V-trace corrects for.
Every `publish_every` batches the learner publishes its acting networks, with their version, for
the workers to pull (with several learners, learner 0 does).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from marl_core.rl.gradient_steps import LossStep, apply_gradients, gradients


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


def resolve_device(device: str) -> str:
    """ "auto" -> "cuda" where torch sees a GPU, else "cpu"; "cuda" without one is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda': torch sees no GPU here; use 'auto' or 'cpu'")
    return device


def place(learner, device: str):
    """Move a fresh learner's networks (its trainers' policies) to `device`; before any step or
    loaded state, so its optimizers still hold the same parameters and load state onto them."""
    for network in learner.policies.values():
        network.to(device)
    return learner


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
    from marl_core.marl.batch import JointExperience

    report = LearnerReport(index, 0, steps.version, 0.0, 0.0, 0, 0, {})
    totals: dict[str, list[float]] = {}
    steps.begin()
    for batch_number in range(1, batches + 1):
        started = time.perf_counter()
        fragments = dataset.take(fragments_per_batch, max(steps.version, 0), take_timeout)
        taken = time.perf_counter()
        if fragments is None:
            raise TimeoutError(
                f"learner {index}: no {fragments_per_batch} fragment(s) from the dataset server within {take_timeout:g} s"
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
