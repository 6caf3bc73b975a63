"""An update as a sequence of losses, so that whoever holds the optimizer applies them.

The on-policy trainers (PPO, A2C, IMPALA, APPO) describe an update on a batch as `loss_steps`:
a generator of `LossStep`s, each a loss to take one gradient step on before the next is
computed (the generator is lazy, so the next loss sees the weights the step produced). A trainer
that learns alone applies them with its own optimizer (`apply_locally`). Several learners of one
policy instead send each step's gradients to a parameter server, which aggregates them by its
distributed strategy and applies them with *its* optimizer (`marl_core.distributed`); the learner
pulls the new weights before the generator goes on. One description of the algorithm serves both.

A step's loss is a mean over its `samples` transitions with no statistic of the batch as a
whole in it, so the sample-weighted mean of several learners' gradients is the gradient of the
loss on the union of their batches (BSP's exactness rests on it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np
import torch


@dataclasses.dataclass
class LossStep:
    loss: torch.Tensor  # a scalar with a graph back to the policy's parameters
    samples: int  # transitions it is the mean over
    metrics: dict[str, float]


def gradients(parameters: Sequence[torch.nn.Parameter], step: LossStep) -> list[torch.Tensor]:
    """The step's gradient of every parameter (zeros where the loss does not reach one)."""
    grads = torch.autograd.grad(step.loss, list(parameters), allow_unused=True)
    return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(parameters, grads)]


def apply_gradients(
    parameters: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer, grads: Sequence[torch.Tensor], max_grad_norm: float
) -> float:
    """One optimizer step along `grads`, clipped to `max_grad_norm` as a whole; the norm before clipping."""
    for parameter, grad in zip(parameters, grads):
        parameter.grad = grad.clone()
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def mean_gradient(pushed: Sequence[tuple[Sequence[torch.Tensor], int]]) -> list[torch.Tensor]:
    """The sample-weighted mean of several (gradients, samples): the gradient on their union."""
    total = sum(samples for _, samples in pushed)
    return [sum(grads[i] * (samples / total) for grads, samples in pushed) for i in range(len(pushed[0][0]))]


def apply_locally(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: Iterable[LossStep], max_grad_norm: float) -> dict[str, float]:
    """Take every step with this trainer's own optimizer; the mean of each metric over the steps."""
    parameters = list(policy.parameters())
    totals: dict[str, list[float]] = {}
    for step in steps:
        optimizer.zero_grad()
        step.loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
        optimizer.step()
        for name, number in step.metrics.items():
            totals.setdefault(name, []).append(number)
    return {name: float(np.mean(numbers)) for name, numbers in totals.items()}
