"""Best-response oracles, looked up by name.

An oracle answers "what should this player add to its population?" given the current
populations and meta-strategy. `exact` computes the true best response to the opponents'
meta-strategy mixture by one backward pass over the tree. `dqn` and `ppo` learn one from
episodes played by rollout workers (`marl_core.psro.learned_oracle`); their torch code is imported
only when they run, so choosing or validating an oracle stays cheap.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np

from marl_core.games.exploitability import mixed_reach
from marl_core.games.tree import GameTree, best_response
from marl_core.registry import Registry


@dataclasses.dataclass(frozen=True)
class BestResponse:
    player: int
    policy: np.ndarray  # [I, A] tabular: a learned network is asked at every information state
    value: float  # exact expected return of the response against the opponents' mixture
    weights: Optional[dict[str, Any]] = None  # a learned network's state_dict (tensors only)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class OracleCall:
    """Everything an oracle may use; `pool` holds the rollout workers of learned oracles."""

    config: Any  # PSROConfig
    tree: GameTree
    player: int
    populations: list[np.ndarray]
    meta_strategy: list[np.ndarray]
    iteration: int
    pool: Any = None


def exact_oracle(call: OracleCall) -> BestResponse:
    reaches = mixed_reach(call.tree, call.populations, call.meta_strategy)
    value, policy = best_response(call.tree, call.player, reaches)
    return BestResponse(player=call.player, policy=policy, value=value)


def learned_oracle(call: OracleCall) -> BestResponse:
    from marl_core.psro.learned_oracle import train_best_response

    policy, value, weights, metrics = train_best_response(
        call.config, call.tree, call.player, call.populations, call.meta_strategy,
        iteration=call.iteration, pool=call.pool,
    )
    return BestResponse(player=call.player, policy=policy, value=value, weights=weights, metrics=metrics)


@dataclasses.dataclass(frozen=True)
class Oracle:
    name: str
    summary: str
    compute: Callable[[OracleCall], BestResponse]
    learns: bool = False  # needs rollout workers and has hyperparameters under its own name


class OracleError(ValueError):
    pass


ORACLES: Registry[Oracle] = Registry("oracle", OracleError)
ORACLES.add("exact", Oracle("exact", "exact best response by a backward pass over the game tree", exact_oracle))
ORACLES.add("dqn", Oracle("dqn", "double DQN with a target network and replay, trained on rollouts", learned_oracle, learns=True))
ORACLES.add("ppo", Oracle("ppo", "PPO with GAE, clipping and an entropy bonus, trained on rollouts", learned_oracle, learns=True))


def get_oracle(name: str) -> Oracle:
    return ORACLES[name]
