"""The two kinds of network neural CFR trains, both on OpenSpiel's information-state tensors.

- `AdvantageNetwork`: one output per action, the (scaled) cumulative regret of taking it. Regret
  matching on its outputs is the player's current CFR strategy; it is never a population member.
- `AveragePolicyNetwork` (`marl_core.rl.average_policy`): the masked softmax of its logits is
  the player's average strategy, the part of CFR that converges to an equilibrium. It is the
  member that is measured and kept, a `NetworkPolicy` like the project's other acting networks.
"""

from __future__ import annotations

import torch
from torch import nn

from marl_core.rl.networks import mlp


class AdvantageNetwork(nn.Module):
    def __init__(self, obs_size: int, num_actions: int, hidden: tuple[int, ...]):
        super().__init__()
        self.body = mlp(obs_size, tuple(hidden), num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.body(obs)


def regret_matching(advantages: torch.Tensor, mask: torch.Tensor, no_regret_action: str) -> torch.Tensor:
    """[B, A] strategy proportional to the positive advantages of the legal actions.

    Where no legal action has a positive advantage the row plays the legal action of highest
    advantage ("argmax", Deep CFR's choice: the network's best guess of the least-bad action) or
    every legal action alike ("uniform", tabular CFR's choice).
    """
    positive = advantages.clamp(min=0) * mask
    total = positive.sum(dim=1, keepdim=True)
    if no_regret_action == "argmax":
        best = torch.where(mask, advantages, torch.full_like(advantages, -torch.inf)).argmax(dim=1)
        fallback = nn.functional.one_hot(best, advantages.shape[1]).to(advantages.dtype)
    else:
        fallback = mask / mask.sum(dim=1, keepdim=True)
    return torch.where(total > 0, positive / total.clamp(min=1e-30), fallback)


def hedge(advantages: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """[B, A] softmax of `scale` times the advantages over the legal actions (Hedge).

    Why not always regret matching: it maps small positive advantages to large probabilities,
    so where a network's estimate of an average regret near zero is off by a little, the
    strategy is off by a lot. Hedge's probabilities move smoothly with the estimate; with
    `scale` growing as sqrt(iteration) (the caller's choice) it is a no-regret rule like
    regret matching.
    """
    logits = torch.where(mask, advantages * scale, torch.full_like(advantages, -torch.inf))
    return torch.softmax(logits, dim=1)
