"""PBT over multi-agent learners: a population of `psro marl` learners of one algorithm on one
environment, each with its own hyperparameters, trained round by round through the one rollout
engine; every `perturbation_interval` rounds the members are ranked by their greedy evaluation
return and the bottom ones copy a top one's learner and explored hyperparameters
(`marl_core.pbt.schedule`).

A copied learner is rebuilt with its new hyperparameters, then given the source's whole
training state (networks, optimizers, buffers); its optimizers keep the new learning rates,
which loading an optimizer's state would otherwise put back (`load_keeping_hyperparameters`).
With `exploit: false` the same population trains untouched: the baseline PBT is measured
against, from the same seeds.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from marl_core.marl.training import MARLConfig
from marl_core.pbt.schedule import LineageEntry, due, exploit_and_explore
from marl_core.pbt.settings import PBTSettings


class PBTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    marl: MARLConfig = Field(..., description="the learners' MARL settings; member i's seed is marl.seed + i")
    population: int = Field(4, ge=2, description="members")
    members: list[dict[str, Any]] = Field(
        default_factory=list, description="per member, settings that override marl.settings (the first members; the rest take marl.settings)"
    )
    pbt: PBTSettings
    exploit: bool = Field(True, description="false: train the population without exploit/explore (the baseline)")

    @model_validator(mode="after")
    def _members_fit(self) -> "PBTConfig":
        if len(self.members) > self.population:
            raise ValueError(f"members: {len(self.members)} given for a population of {self.population}")
        for i in range(self.population):
            self.member_config(i)  # each member's settings must be valid for the algorithm
        settings = self.marl.algorithm_settings.model_dump()
        unknown = sorted(set(self.pbt.hyperparam_mutations) - set(settings))
        if unknown:
            raise ValueError(f"pbt.hyperparam_mutations: {unknown} are not settings of {self.marl.algorithm}; it has {sorted(settings)}")
        return self

    def member_config(self, member: int, settings: Optional[dict] = None) -> MARLConfig:
        """Member `member`'s MARL config: its own seed, its settings (`settings`, else the
        configured ones), and greedy evaluations at every perturbation point."""
        own = settings if settings is not None else {**self.marl.settings, **(self.members[member] if member < len(self.members) else {})}
        return self.marl.model_copy(update={"settings": own, "seed": self.marl.seed + member, "eval_every": self.pbt.perturbation_interval})

    def hyperparameters(self, member: int) -> dict[str, Any]:
        """Member `member`'s starting values of the mutated hyperparameters."""
        values = self.member_config(member).algorithm_settings.model_dump()
        return {name: values[name] for name in self.pbt.hyperparam_mutations}


def load_keeping_hyperparameters(learner, state: dict) -> None:
    """`learner.load_state_dict(state)`, but every optimizer keeps the hyperparameters (learning
    rate, ...) it was built with: loading an optimizer's state also loads its param groups'."""
    optimizers = _optimizers(learner)
    kept = [[{k: v for k, v in group.items() if k != "params"} for group in o.param_groups] for o in optimizers]
    learner.load_state_dict(state)
    for optimizer, groups in zip(optimizers, kept):
        for group, values in zip(optimizer.param_groups, groups):
            group.update(values)


def _optimizers(learner) -> list:
    import torch

    found = []
    for value in vars(learner).values():
        candidates = value.values() if isinstance(value, dict) else [value]
        found.extend(o for o in candidates if isinstance(o, torch.optim.Optimizer))
    return found


@dataclasses.dataclass(frozen=True)
class PBTRound:
    round: int
    records: list  # per member, its `RoundRecord`
    hyperparameters: list[dict[str, Any]]  # per member, after this round's exploit/explore
    lineage: list[LineageEntry]  # copies made at the end of this round

    def scores(self) -> Optional[list[float]]:
        """Per member, its greedy return (the mean over its policies), where this round evaluated."""
        if any(r.eval_returns is None for r in self.records):
            return None
        return [score_of(r) for r in self.records]


def score_of(record) -> float:
    returns = [v for k, v in record.eval_returns.items() if k.startswith("policy/")]
    return float(np.mean(returns))


def iterate_pbt_local(config: PBTConfig) -> Iterator[PBTRound]:
    """Every round of every member in this process, exploit/explore at each perturbation point."""
    import torch

    from marl_core.marl import training
    from marl_core.rollout.pool import WorkerPool

    torch.set_num_threads(1)
    layout, spec = training.layout_and_spec(config.marl)
    configs = [config.member_config(i) for i in range(config.population)]
    learners = [training.make_learner(c, layout, spec.state_size) for c in configs]
    handles = [training.LocalLearner(learner) for learner in learners]
    hyperparameters = [config.hyperparameters(i) for i in range(config.population)]
    env_steps = [0] * config.population
    rng = np.random.default_rng([config.marl.seed, 8])
    with contextlib.ExitStack() as stack:
        pools = []
        for c in configs:
            pool = WorkerPool(training.pool_config(c))
            stack.callback(pool.close)
            pools.append(pool)
        for round in range(config.marl.rounds):
            records = []
            for i in range(config.population):
                record = training.run_round(configs[i], round, env_steps[i], training.LocalRunner(), pools[i], handles[i], layout)
                env_steps[i] = record.env_steps
                records.append(record)
            lineage = []
            step = round + 1
            if config.exploit and due(config.pbt, step) and all(r.eval_returns is not None for r in records):
                scores = [score_of(r) for r in records]
                lineage = exploit_and_explore(step, scores, hyperparameters, config.pbt, rng)
                states = {e.source: learners[e.source].state_dict() for e in lineage}
                for entry in lineage:
                    settings = {**configs[entry.member].settings, **entry.after}
                    configs[entry.member] = config.member_config(entry.member, settings)
                    learner = training.make_learner(configs[entry.member], layout, spec.state_size)
                    load_keeping_hyperparameters(learner, states[entry.source])
                    learners[entry.member], handles[entry.member] = learner, training.LocalLearner(learner)
                    hyperparameters[entry.member] = dict(entry.after)
            yield PBTRound(round, records, [dict(h) for h in hyperparameters], lineage)
