"""Settings of learned oracles shared by every algorithm; kept free of torch so that checking a
config (and every `psro` command that does) never pays for importing it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BestResponseTraining(BaseModel):
    """How much experience one learned best response gets, and how it is split into rounds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    episodes: int = Field(20_000, gt=0, description="training episodes per best response")
    episodes_per_round: int = Field(1_000, gt=0, description="episodes between weight updates of the workers")
    opponent_epsilon: float = Field(
        0.0,
        ge=0,
        le=1,
        description="chance that an opponent's move, while a response trains, is a uniformly random legal one "
        "(trembling opponents: the response also meets positions its opponents' greedy members never reach)",
    )


class RolloutSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(2, gt=0, description="rollout workers (Ray actors)")
    envs_per_worker: int = Field(32, gt=0, description="environment copies each worker steps in a batch")
    worker_cpus: float = Field(
        0.0, ge=0, description="CPU slots each worker reserves in Ray (0 never starves the learner)"
    )


class ApproxExploitability(BaseModel):
    """Approximate NashConv: per role, a fresh best response learned by the run's oracle against
    the current mixture, its gain over the mixture's value estimated from rollouts.

    It is what there is where no game tree exists; on a game with a tree it is reported beside
    the exact NashConv, so the two can be compared.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    every: int = Field(
        0,
        ge=0,
        description="measure every N iterations and at the last "
        "(0: never; default 5 for learned oracles where no game tree exists)",
    )
    episodes: int = Field(20_000, gt=0, description="training episodes of each approximate best response")
    eval_episodes: int = Field(
        2_000, ge=2, description="episodes that estimate each response's value against the mixture"
    )


class Plateau(BaseModel):
    """When Pipeline PSRO freezes its lowest level before its budget is spent: McAleer et al.'s
    rule for Leduc, on the level's training return. Every `window` episodes from `check_from` on,
    the mean return of its last `window` episodes is compared with that of the `window` before;
    a gain below `threshold` freezes it, once it has learned `min_episodes`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(
        0.01, description="gain in mean training return per window below which the level has plateaued"
    )
    check_from: int = Field(7_500, ge=0, description="episodes a level learns before its gain is checked")
    min_episodes: int = Field(10_000, ge=0, description="episodes a level learns at least before it is frozen")


class PipelineSettings(BaseModel):
    """Pipeline PSRO: `active_levels` best responses per role learn at once (see `marl_core.psro.pipeline`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    active_levels: int = Field(2, ge=1, description="levels learning at once; 1 with no plateau is sequential PSRO")
    window: int = Field(
        2_500,
        gt=0,
        description="episodes between refreshes of the lower levels' weights and meta-strategies, and between "
        "plateau checks (rounded up to whole rounds of best_response.episodes_per_round)",
    )
    plateau: Plateau | None = Field(
        default_factory=Plateau,
        description="when the lowest level freezes early (null: each level learns its whole budget)",
    )
