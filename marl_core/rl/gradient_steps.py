"""An update as a sequence of losses, so that whoever holds the optimizer applies them.

The on-policy trainers (PPO, A2C, IMPALA, APPO) describe an update on a batch as `loss_steps`:
a generator of `LossStep`s, each a loss to take one gradient step on before the next is
computed (the generator is lazy, so the next loss sees the weights the step produced). A trainer
that learns alone applies them with its own optimizer (`apply_locally`). Several learners of one
policy instead send each step's gradients to a parameter server, which aggregates them by its
distributed strategy and applies them with *its* optimizer (`marl_core.distributed`); the learner
pulls the new weights before the generator goes on. One description of the algorithm serves both.

Where a step's loss is a mean over its `samples` transitions with no statistic of the batch as a
whole in it (advantage normalisation is one), the sample-weighted mean of several learners'
gradients is the gradient of the loss on the union of their batches: BSP's exactness rests on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np
import torch


@dataclasses.dataclass
class LossStep:
    loss: torch.Tensor  # a scalar with a graph back to the trainer's parameters
    samples: int  # transitions it is the mean over
    metrics: dict[str, float]


@dataclasses.dataclass
class OptimizedGroup:
    """Parameters stepped by one optimizer, their gradient clipped as a whole (a trainer has one
    group; a multi-agent learner one per policy id, each with its own optimizer)."""

    parameters: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    max_grad_norm: float


Gradients = list[list[torch.Tensor]]  # per group, per parameter


def single_group(trainer) -> list[OptimizedGroup]:
    """A trainer's one group: its policy's parameters and its optimizer."""
    return [OptimizedGroup(list(trainer.policy.parameters()), trainer.optimizer, trainer.config.max_grad_norm)]


def gradients(groups: Sequence[OptimizedGroup], step: LossStep) -> Gradients:
    """The step's gradient of every parameter (zeros where the loss does not reach one)."""
    flat = [p for group in groups for p in group.parameters]
    grads = iter(torch.autograd.grad(step.loss, flat, allow_unused=True))
    return [[_or_zeros(next(grads), p) for p in group.parameters] for group in groups]


def _or_zeros(grad: torch.Tensor | None, parameter: torch.nn.Parameter) -> torch.Tensor:
    return torch.zeros_like(parameter) if grad is None else grad.detach()


def apply_gradients(groups: Sequence[OptimizedGroup], grads: Gradients) -> None:
    """One step of every group's optimizer along `grads`, each group's gradient clipped as a whole."""
    for group, group_grads in zip(groups, grads, strict=True):
        for parameter, grad in zip(group.parameters, group_grads, strict=True):
            parameter.grad = grad.clone()
        torch.nn.utils.clip_grad_norm_(group.parameters, group.max_grad_norm)
        group.optimizer.step()
        group.optimizer.zero_grad(set_to_none=True)


def mean_gradient(pushed: Sequence[tuple[Gradients, int]]) -> Gradients:
    """The sample-weighted mean of several (gradients, samples): the gradient on their union."""
    total = sum(samples for _, samples in pushed)
    first, _ = pushed[0]
    return [
        [sum(grads[g][i] * (samples / total) for grads, samples in pushed) for i in range(len(first[g]))]
        for g in range(len(first))
    ]


def apply_locally(groups: Sequence[OptimizedGroup], steps: Iterable[LossStep]) -> dict[str, float]:
    """Take every step with the trainer's own optimizers; the mean of each metric over the steps."""
    totals: dict[str, list[float]] = {}
    for step in steps:
        apply_gradients(groups, gradients(groups, step))
        for name, number in step.metrics.items():
            totals.setdefault(name, []).append(number)
    return {name: float(np.mean(numbers)) for name, numbers in totals.items()}


class LossStepTrainer:
    """What a trainer that describes its update as `loss_steps` gets for free: one optimizer over
    its policy (`optimized_groups`), and `update`/`learn` applying every step with it. A subclass
    sets `policy`, `optimizer`, `config` (with `max_grad_norm`) and `updates`, and writes `loss_steps`."""

    def learn(self, experience) -> dict[str, float]:
        """The trainer interface a learner loop uses (each batch is learned from once)."""
        return self.update(experience)

    def update(self, experience) -> dict[str, float]:
        """Every loss step of the batch with this trainer's optimizer; the mean of each metric."""
        metrics = apply_locally(self.optimized_groups(), self.loss_steps(experience))
        self.updates += 1
        return metrics

    def optimized_groups(self) -> list[OptimizedGroup]:
        return single_group(self)
