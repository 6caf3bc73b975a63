"""Hyperparameters of neural CFR, in one typed place.

Kept free of torch (like the project's other settings modules), so a config is checked before
anything heavy is imported. The defaults are the settings `docs/neural-equilibria.md` chose on
Leduc poker by measuring exact exploitability against single-core wall time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class NeuralCFRSettings(BaseModel):
    """One run of neural CFR: how much play each iteration samples, how the networks learn from
    it, and how much of it they remember."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    traversals: int = Field(
        3_000, gt=0, description="external-sampling traversals per player per iteration (played through the state API)"
    )
    advantage_hidden: tuple[int, ...] = Field(
        (128, 128, 128), min_length=1, description="hidden layer widths of each player's advantage network"
    )
    policy_hidden: tuple[int, ...] = Field(
        (128, 128, 128), min_length=1, description="hidden layer widths of each player's average-policy network"
    )
    advantage_steps: int = Field(200, gt=0, description="gradient steps per player's advantage network per iteration")
    policy_steps: int = Field(100, ge=0, description="gradient steps per average-policy network per iteration")
    batch_size: int = Field(512, gt=0, description="samples per gradient step")
    advantage_lr: float = Field(1e-3, gt=0, description="Adam learning rate of the advantage networks")
    policy_lr: float = Field(1e-3, gt=0, description="Adam learning rate of the average-policy networks")
    advantage_memory: int = Field(1_000_000, gt=0, description="capacity of each player's reservoir of sampled regrets")
    policy_memory: int = Field(1_000_000, gt=0, description="capacity of each player's reservoir of played strategies")
    regret_weighting: float = Field(
        1.0,
        ge=0,
        description="iteration t's sampled regrets weigh t ** this in the advantage loss "
        "(0: vanilla CFR, 1: linear CFR)",
    )
    strategy_weighting: float = Field(
        1.0,
        ge=0,
        description="iteration t's strategies weigh t ** this in the average-policy loss (1: linear averaging)",
    )
    merge_samples: bool = Field(
        True,
        description="store one iteration's samples of one information state as one entry (their mean, "
        "weighted by their count)",
    )
    reinitialize: bool = Field(
        False, description="train each advantage network from fresh weights every iteration (Deep CFR's choice)"
    )
    strategy: Literal["regret_matching", "hedge"] = Field(
        "hedge",
        description="the current strategy from the advantages: regret matching (Deep CFR) or Hedge, a softmax of "
        "hedge_scale * sqrt(iteration) * advantage / (the game's largest absolute payoff)",
    )
    hedge_scale: float = Field(10.0, gt=0, description="Hedge's inverse temperature before the sqrt(iteration) growth")
    no_regret_action: Literal["argmax", "uniform"] = Field(
        "argmax",
        description="what regret matching plays where no action has positive advantage: the highest "
        "advantage (Deep CFR) or uniform",
    )
    max_grad_norm: float = Field(10.0, gt=0, description="gradient-norm clip of every network")
    encoding_cache: int = Field(
        1_000_000,
        gt=0,
        description="information states whose tensor is kept between iterations (a cache of play, "
        "refilled from play when full)",
    )
    seed: int = Field(0, description="seeds the networks, the traversals and the memories' sampling")

    @model_validator(mode="after")
    def _memories_hold_a_batch(self) -> NeuralCFRSettings:
        smallest = min(self.advantage_memory, self.policy_memory)
        if smallest < self.batch_size:
            raise ValueError(f"memory capacity {smallest} is smaller than batch_size {self.batch_size}")
        return self
