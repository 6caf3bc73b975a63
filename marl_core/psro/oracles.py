"""Best-response oracles, looked up by name.

An oracle answers "what should this role add to its population?" given the current populations
and meta-strategy. `exact` computes the true best response to the opponents' meta-strategy
mixture by one backward pass over the game tree (OpenSpiel games whose tree fits). `dqn` and
`ppo` learn a network from episodes played by rollout workers on any environment
(`marl_core.psro.learned_oracle`: a learner, and a collector that drives the workers); their
torch code is imported only when they run, so choosing or validating an oracle stays cheap.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from marl_core.games.exploitability import mixed_reach
from marl_core.games.tree import build_tree, best_response
from marl_core.policies.base import Policy
from marl_core.policies.population import Population, stacked_tables
from marl_core.registry import Registry


@dataclasses.dataclass(frozen=True)
class BestResponse:
    role: int  # index into the game's roles
    policy: Policy
    value: Optional[float]  # exact expected return against the opponents' mixture, where a tree gives it
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class OracleCall:
    """Everything an oracle may use. `budget` is the training episodes of a learned response (the
    run's `best_response.episodes`, or the approximate-exploitability budget); `pool` holds the
    rollout workers of learned oracles; `seed_key` makes each response's randomness its own;
    `collector_step` says that a `collect-experience` step runs beside the learner and plays its
    rounds (else the learned oracle plays them from a thread of its own); `opponent_epsilon` makes
    the opponents tremble while a learned response trains (the run's responses do, the
    approximate-exploitability ones train against the mixture as it is)."""

    config: Any  # PSROConfig
    role: int
    populations: list[Population]
    meta_strategy: list
    iteration: int
    pool: Any = None
    budget: Optional[int] = None
    seed_key: tuple[int, ...] = ()
    collector_step: bool = False
    opponent_epsilon: float = 0.0


def exact_oracle(call: OracleCall) -> BestResponse:
    from marl_core.policies.tabular import TabularPolicy

    tree = build_tree(call.config.game)
    reaches = mixed_reach(tree, stacked_tables(call.populations), call.meta_strategy)
    value, table = best_response(tree, call.role, reaches)
    return BestResponse(role=call.role, policy=TabularPolicy(call.config.game, call.role, table), value=value)


def learned_oracle(call: OracleCall) -> BestResponse:
    from marl_core.psro.learned_oracle import train_best_response

    return train_best_response(call)


@dataclasses.dataclass(frozen=True)
class Oracle:
    name: str
    summary: str
    compute: Callable[[OracleCall], BestResponse]
    learns: bool = False  # needs rollout workers and has hyperparameters under its own name


class OracleError(ValueError):
    pass


ORACLES: Registry[Oracle] = Registry("oracle", OracleError)


def _oracle(name: str, summary: str, compute: Callable[[OracleCall], BestResponse], learns: bool = False) -> None:
    """`ORACLES.add`, with the name and summary written once for registry and oracle."""
    ORACLES.add(name, Oracle(name, summary, compute, learns), summary)


_oracle("exact", "exact best response by a backward pass over the game tree", exact_oracle)
_oracle("dqn", "double DQN with a target network and replay, trained on rollouts", learned_oracle, learns=True)
_oracle("ppo", "PPO with GAE, clipping and an entropy bonus, trained on rollouts", learned_oracle, learns=True)


def get_oracle(name: str) -> Oracle:
    return ORACLES[name]
