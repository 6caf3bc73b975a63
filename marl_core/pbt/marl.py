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

A round is wired once, for this module's in-process loop (`iterate_pbt_local`) and the `pbt`
flow (`flows/pbt_flow.py`): `run_pbt_round` plays every member's MARL round, `PBTState.advance`
takes their records, and `perturb` decides the copies at a perturbation point and takes the
copies' settings into the state; the caller copies the learners, in process or inside Ray.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from marl_core.marl.config import MARLConfig, asynchronous
from marl_core.pbt.schedule import LineageEntry, due, exploit_and_explore
from marl_core.pbt.settings import PBTSettings, dotted, merged
from marl_core.rl.optimizers import load_keeping_hyperparameters


class PBTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    marl: MARLConfig = Field(..., description="the learners' MARL settings; member i's seed is marl.seed + i")
    population: int = Field(4, ge=2, description="members")
    members: list[dict[str, Any]] = Field(
        default_factory=list,
        description="per member, settings that override marl.settings (the first members; the rest take marl.settings)",
    )
    pbt: PBTSettings
    exploit: bool = Field(True, description="false: train the population without exploit/explore (the baseline)")

    @model_validator(mode="before")
    @classmethod
    def _own_experiment(cls, values):
        """A PBT run is tracked under the experiment "pbt" unless its MARL settings name one."""
        if isinstance(values, dict) and isinstance(values.get("marl"), dict) and "experiment" not in values["marl"]:
            values = {**values, "marl": {**values["marl"], "experiment": "pbt"}}
        return values

    @model_validator(mode="after")
    def _members_fit(self) -> PBTConfig:
        if len(self.members) > self.population:
            raise ValueError(f"members: {len(self.members)} given for a population of {self.population}")
        for i in range(self.population):
            self.member_config(i)  # each member's settings must be valid for the algorithm
        settings = dotted(self.marl.algorithm_settings.model_dump())
        unknown = sorted(set(self.pbt.hyperparam_mutations) - set(settings))
        if unknown:
            raise ValueError(
                f"pbt.hyperparam_mutations: {unknown} are not settings of {self.marl.algorithm}; it has "
                f"{sorted(settings)}"
            )
        if self.pbt.metric not in (None, "return"):
            raise ValueError(
                f"pbt.metric={self.pbt.metric!r}: a MARL population is ranked by return (its greedy return)"
            )
        if asynchronous(self.marl) is not None:
            raise ValueError(
                f"marl.algorithm={self.marl.algorithm!r} with asynchronous rounds: PBT trains collect-then-learn "
                "rounds only (ippo, mappo, a2c, iql, vdn, qmix, maddpg without `asynchronous`)"
            )
        return self

    def member_config(self, member: int, settings: dict | None = None) -> MARLConfig:
        """Member `member`'s MARL config: its own seed, its settings (`settings`, else the
        configured ones), and greedy evaluations at every perturbation point."""
        own = (
            settings
            if settings is not None
            else merged(self.marl.settings, self.members[member] if member < len(self.members) else {})
        )
        return self.marl.model_copy(
            update={"settings": own, "seed": self.marl.seed + member, "eval_every": self.pbt.perturbation_interval}
        )

    def hyperparameters(self, member: int) -> dict[str, Any]:
        """Member `member`'s starting values of the mutated hyperparameters."""
        values = dotted(self.member_config(member).algorithm_settings.model_dump())
        return {name: values[name] for name in self.pbt.hyperparam_mutations}


@dataclasses.dataclass
class PBTState:
    """Where a PBT run stands: everything but the learners that the next round starts from, and
    what a checkpoint stores beside them (plain values, so it is JSON)."""

    round: int  # rounds completed
    settings: list[dict[str, Any]]  # per member, its algorithm settings now
    hyperparameters: list[dict[str, Any]]  # per member, the mutated hyperparameters' values now
    env_steps: list[int]  # per member, joint steps since the run started
    rng: dict  # the exploit/explore generator's state
    lineage: list[LineageEntry]  # every copy so far

    @classmethod
    def initial(cls, config: PBTConfig) -> PBTState:
        members = range(config.population)
        return cls(
            0,
            [config.member_config(i).settings for i in members],
            [config.hyperparameters(i) for i in members],
            [0] * config.population,
            np.random.default_rng([config.marl.seed, 8]).bit_generator.state,
            [],
        )

    def member_config(self, config: PBTConfig, member: int) -> MARLConfig:
        return config.member_config(member, self.settings[member])

    def advance(self, records: list) -> None:
        """Every member finished round `self.round` (`records`, per member)."""
        self.env_steps = [r.env_steps for r in records]
        self.round += 1

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "lineage": [dataclasses.asdict(e) for e in self.lineage]}

    @classmethod
    def from_json(cls, values: dict) -> PBTState:
        return cls(**{**values, "lineage": [LineageEntry(**e) for e in values["lineage"]]})


def perturb(config: PBTConfig, state: PBTState, records: list) -> list[LineageEntry]:
    """Once `state` has advanced past a round (`records`): at a perturbation point, who copies
    whom, the copies' settings and hyperparameters taken into `state`; the caller copies the
    learners."""
    step = state.round
    if not (config.exploit and due(config.pbt, step) and all(r.eval_returns is not None for r in records)):
        return []
    rng = np.random.default_rng()
    rng.bit_generator.state = state.rng
    lineage = exploit_and_explore(step, [score_of(r) for r in records], state.hyperparameters, config.pbt, rng)
    state.rng = rng.bit_generator.state
    sources = {e.source: state.settings[e.source] for e in lineage}  # a top member is never a bottom one
    for entry in lineage:
        state.settings[entry.member] = merged(sources[entry.source], entry.after)
        state.hyperparameters[entry.member] = dict(entry.after)
    state.lineage.extend(lineage)
    return lineage


@dataclasses.dataclass(frozen=True)
class PBTRound:
    round: int
    records: list  # per member, its `RoundRecord`
    hyperparameters: list[dict[str, Any]]  # per member, after this round's exploit/explore
    lineage: list[LineageEntry]  # copies made at the end of this round

    def scores(self) -> list[float] | None:
        """Per member, its greedy return (the mean over its policies), where this round evaluated."""
        if any(r.eval_returns is None for r in self.records):
            return None
        return [score_of(r) for r in self.records]

    def metrics(self) -> dict[str, float]:
        """Every member's round metrics under ``member_<i>/``, its mutated hyperparameters under
        ``member_<i>/hp/``, and the population's best greedy return where this round evaluated."""
        out = {}
        for i, (record, values) in enumerate(zip(self.records, self.hyperparameters)):
            out.update({f"member_{i}/{k}": v for k, v in record.metrics.items()})
            out.update({f"member_{i}/hp/{k}": float(v) for k, v in values.items() if isinstance(v, (int, float))})
        if (scores := self.scores()) is not None:
            out.update(
                {f"member_{i}/score": s for i, s in enumerate(scores)},
                best_score=max(scores),
                copies=float(len(self.lineage)),
            )
        return out

    def summary(self) -> str:
        scores = self.scores()
        if scores is None:
            return "train return " + " ".join(f"{score_of_train(r):.2f}" for r in self.records)
        shown = " ".join(f"{s:.2f}" for s in scores)
        copies = "  ".join(f"{e.member}<-{e.source}" for e in self.lineage)
        return f"eval return {shown}  best {max(scores):.2f}" + (f"  copies {copies}" if copies else "")


def score_of(record) -> float:
    returns = [v for k, v in record.eval_returns.items() if k.startswith("policy/")]
    return float(np.mean(returns))


def score_of_train(record) -> float:
    returns = [v for k, v in record.train_returns.items() if k.startswith("policy/")]
    return float(np.mean(returns)) if returns else float("nan")


def run_pbt_round(
    config: PBTConfig, state: PBTState, runner, pools: list, learners: list, layout, concurrently=None
) -> list:
    """Round `state.round` of every member (its own rollout workers and learner), their records;
    `concurrently` maps a function over the members at once (default: one after another)."""

    def member_round(i: int):
        from marl_core.marl import rounds

        return rounds.run_round(
            state.member_config(config, i), state.round, state.env_steps[i], runner, pools[i], learners[i], layout
        )

    return list((concurrently or map)(member_round, range(config.population)))


def iterate_pbt_local(config: PBTConfig) -> Iterator[PBTRound]:
    """Every round of every member in this process, exploit/explore at each perturbation point."""
    import torch

    from marl_core.marl import rounds
    from marl_core.marl.config import layout_and_spec, make_learner, pool_config
    from marl_core.marl.learner_handles import LocalLearner
    from marl_core.rollout.pool import WorkerPool
    from marl_core.runner import LocalRunner

    torch.set_num_threads(1)
    layout, spec = layout_and_spec(config.marl)
    state = PBTState.initial(config)
    learners = [make_learner(state.member_config(config, i), layout, spec.state_size) for i in range(config.population)]
    with contextlib.ExitStack() as stack:
        pools = []
        for i in range(config.population):
            pool = WorkerPool(pool_config(state.member_config(config, i)))
            stack.callback(pool.close)
            pools.append(pool)
        while state.round < config.marl.rounds:
            handles = [LocalLearner(learner) for learner in learners]
            records = run_pbt_round(config, state, LocalRunner(rounds.STEPS), pools, handles, layout)
            state.advance(records)
            lineage = perturb(config, state, records)
            sources = {e.source: learners[e.source].state_dict() for e in lineage}
            for entry in lineage:
                learners[entry.member] = make_learner(
                    state.member_config(config, entry.member), layout, spec.state_size
                )
                load_keeping_hyperparameters(learners[entry.member], sources[entry.source])
            yield PBTRound(state.round - 1, records, [dict(h) for h in state.hyperparameters], lineage)
