"""What a best-response oracle is asked (`OracleCall`) and what it answers (`BestResponse`).

They live apart from the oracles themselves so that an oracle's implementation
(`marl_core.psro.learned_oracle`) and the registry that names it (`marl_core.psro.oracles`)
both import them without importing each other.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from marl_core.policies.base import Policy
from marl_core.policies.population import Population


@dataclasses.dataclass(frozen=True)
class TrainingGames:
    """The episodes a learned response trained on, in the order they were played: which member
    of each opponent mixture each one drew, and every agent's return."""

    draws: np.ndarray  # [episodes, opponent roles] member index, the mixtures in role order
    returns: np.ndarray  # [episodes, agents] summed rewards, agents in the environment's order


@dataclasses.dataclass(frozen=True)
class BestResponse:
    role: int  # index into the game's roles
    policy: Policy
    value: float | None  # exact expected return against the opponents' mixture, where a tree gives it
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    # where the call asks for them (`report_training`): the trainer's state to go on from, and its games
    trainer_state: dict | None = None
    games: TrainingGames | None = None


@dataclasses.dataclass(frozen=True)
class OracleCall:
    """Everything an oracle may use. `budget` is the training episodes of a learned response (the
    run's `best_response.episodes`, or the approximate-exploitability budget); `pool` holds the
    rollout workers of learned oracles; `seed_key` makes each response's randomness its own;
    `opponent_epsilon` makes the opponents tremble while a learned response trains (the run's responses do, the
    approximate-exploitability ones train against the mixture as it is); `purpose` names the
    response where its progress is shown, and `stage` what `iteration` counts.

    A league player goes on training across generations: `trainer_state` is where its trainer
    left off (else a learned response starts from a fresh network), and `report_training` asks
    for the trainer's state and the games it trained on in the answer."""

    config: Any  # PSROConfig
    role: int
    populations: list[Population]
    meta_strategy: list
    iteration: int
    pool: Any = None
    budget: int | None = None
    seed_key: tuple[int, ...] = ()
    opponent_epsilon: float = 0.0
    purpose: str = "best response"
    stage: str = "iteration"
    trainer_state: dict | None = None
    report_training: bool = False
