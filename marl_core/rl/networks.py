"""Small torch building blocks shared by the policies: MLPs, Atari's convolutions, action masking,
and the tanh activation the actor-critics use.

Games have actions that are illegal in some states. Every place that turns network outputs into
actions or probabilities goes through `masked_logits` or `masked_argmax`, so an illegal action
can never be chosen and never receives probability, gradient or value.
"""

from __future__ import annotations

import torch
from torch import nn

# The most negative float32: exp(MASKED - anything finite) is exactly 0, yet unlike -inf it keeps
# log-softmax finite, so 0 * log p stays 0 instead of becoming nan in the entropy.
MASKED_LOGIT = torch.finfo(torch.float32).min


def _sigmoid_tanh(x: torch.Tensor) -> torch.Tensor:
    return x.mul(2).sigmoid_().mul_(2).sub_(1)  # one new tensor, the rest in place


class _SigmoidTanh(torch.autograd.Function):
    """tanh(x) = 2 sigmoid(2x) - 1, with tanh's own derivative 1 - tanh(x)^2 from the output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = _sigmoid_tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)  # grad * (1 - y^2), fused as torch.tanh's own


class Tanh(nn.Module):
    """`nn.Tanh` through the sigmoid identity, for float tensors on the CPU.

    torch's CPU kernel for tanh is not vectorized in the wheels this project installs, while the
    sigmoid is: the identity computes the same function (within float32's rounding) in a
    fraction of the time, and the actor-critics' forward passes spend most of theirs in their
    activations (docs/performance.md, "The policies' tanh and log-softmax"). Elsewhere (another
    device or dtype) it is torch's own tanh. It holds no parameters, so checkpoints are the same
    either way.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dtype != torch.float32:
            return torch.tanh(x)
        if x.requires_grad and torch.is_grad_enabled():
            return _SigmoidTanh.apply(x)
        return _sigmoid_tanh(x)  # acting: no graph, none of apply's overhead


def features(in_size: int, hidden: tuple[int, ...], activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Linear layers of the given widths, each followed by the activation."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_size, width), activation()]
        in_size = width
    return nn.Sequential(*layers)


def mlp(in_size: int, hidden: tuple[int, ...], out_size: int, activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """`features` followed by a linear output layer (no activation on the output)."""
    body = features(in_size, hidden, activation)
    body.append(nn.Linear(hidden[-1] if hidden else in_size, out_size))
    return body


class NatureCNN(nn.Module):
    """The convolutions of Mnih et al. (2015) over a flat observation of stacked frames
    [channels, size, size] (channels first, as `marl_core.envs.atari` lays them out), pixels
    0..255 scaled to 0..1; `out_size` features, flattened."""

    def __init__(self, obs_size: int, frame_size: int = 84):
        super().__init__()
        channels, remainder = divmod(obs_size, frame_size * frame_size)
        if remainder or not channels:
            raise ValueError(
                f"nature_cnn needs observations of [channels, {frame_size}, {frame_size}] pixels; "
                f"observation size {obs_size} is not a multiple of {frame_size * frame_size}"
            )
        self.shape = (channels, frame_size, frame_size)
        self.convolutions = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            self.out_size = self.convolutions(torch.zeros(1, *self.shape)).shape[1]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.convolutions(obs.view(-1, *self.shape) * (1.0 / 255.0))


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Logits with illegal actions (mask False) set to MASKED_LOGIT: softmax gives them exactly 0.

    `torch.where` also stops the gradient to the masked entries, so the network is never pushed
    around by actions it could not have taken.
    """
    return torch.where(mask, logits, torch.full_like(logits, MASKED_LOGIT))


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Log-probabilities over the last dimension: `torch.log_softmax(logits, -1)` as `logits`
    minus their log-sum-exp. The same function, written so because torch's CPU kernel for a
    softmax over a short last dimension (a policy's handful of actions) is several times slower
    than the reduction, forward and backward. Masked entries stay finite, as there."""
    return logits - torch.logsumexp(logits, dim=-1, keepdim=True)


def masked_argmax(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Index of the largest legal value per row; ties go to the lowest index (torch.argmax's rule)."""
    return torch.where(mask, values, torch.full_like(values, -torch.inf)).argmax(dim=-1)
