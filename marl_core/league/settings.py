"""A league's constants, each a typed setting whose default is AlphaStar's (Vinyals et al. 2019,
pseudocode in its supplementary material), except the step budgets of a snapshot, which
AlphaStar set for StarCraft II (no snapshot before 2e9 agent steps, always one by 4e9) and
which here default to sizes that a card or board game reaches in a few generations.

Kept free of torch and of the rollout engine, so a config is checked before anything loads.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from marl_core.league.pfsp import WEIGHTINGS


def _known_weighting(name: str) -> str:
    if name not in WEIGHTINGS:
        raise ValueError(f"unknown PFSP weighting; choose one of: {', '.join(WEIGHTINGS)}")
    return name


Weighting = Annotated[str, AfterValidator(_known_weighting)]  # a name in `WEIGHTINGS`


class MainAgentSettings(BaseModel):
    """How a main agent picks its opponents: PFSP over every snapshot, verification of what it
    may have forgotten or left open to exploiters, and self-play against a main agent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pfsp: float = Field(0.5, ge=0, le=1, description="share of games against every snapshot by PFSP")
    verification: float = Field(
        0.15, ge=0, le=1, description="share of games that verify (exploiters' snapshots, then its own forgotten ones)"
    )
    self_play: float = Field(0.35, ge=0, le=1, description="share of games against a main agent's current weights")
    pfsp_weighting: Weighting = Field("squared", description="PFSP weighting over every snapshot")
    self_play_min_win_rate: float = Field(
        0.3,
        ge=0,
        le=1,
        description="self-play only while its win rate against that main agent is above this; "
        "else PFSP over its snapshots",
    )
    self_play_fallback_weighting: Weighting = Field("variance", description="PFSP weighting of that fallback")
    exploiter_win_rate: float = Field(
        0.3,
        ge=0,
        le=1,
        description="verify against exploiters' snapshots when its lowest win rate against them is below this",
    )
    forgetting_win_rate: float = Field(
        0.7,
        ge=0,
        le=1,
        description="else against its own past snapshots when its lowest win rate against them is below this",
    )
    verification_weighting: Weighting = Field("squared", description="PFSP weighting of verification games")

    @model_validator(mode="after")
    def _shares_sum_to_one(self) -> MainAgentSettings:
        total = self.pfsp + self.verification + self.self_play
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"pfsp + verification + self_play must sum to 1, got {total:g}")
        return self


class MainExploiterSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min_win_rate: float = Field(
        0.1,
        ge=0,
        le=1,
        description="play a main agent while its win rate against it is above this; else PFSP over its snapshots",
    )
    weighting: Weighting = Field("variance", description="PFSP weighting of that fallback")
    reset_on_snapshot: bool = Field(True, description="return to the initial weights at every snapshot")


class LeagueExploiterSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    weighting: Weighting = Field("linear_capped", description="PFSP weighting over every snapshot")
    reset_probability: float = Field(
        0.25, ge=0, le=1, description="chance of returning to the initial weights at a snapshot"
    )


class SnapshotRule(BaseModel):
    """When a learning player adds a frozen copy of itself to the league."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    win_rate: float = Field(
        0.7,
        ge=0,
        le=1,
        description="snapshot once its lowest win rate against the opponents it trains against is above this",
    )
    min_steps: int = Field(
        0, ge=0, description="environment steps since its last snapshot before one may be taken (AlphaStar: 2e9)"
    )
    max_steps: int = Field(
        200_000,
        gt=0,
        description="environment steps since its last snapshot after which one is always taken (AlphaStar: 4e9)",
    )

    @model_validator(mode="after")
    def _ordered(self) -> SnapshotRule:
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps {self.min_steps} is above max_steps {self.max_steps}")
        return self


class LeagueSettings(BaseModel):
    """Who is in the league and how each kind of player finds its opponents."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    main_agents: int = Field(1, gt=0, description="main agents (AlphaStar: one per race)")
    main_exploiters: int = Field(1, ge=0, description="main exploiters (AlphaStar: one per race)")
    league_exploiters: int = Field(2, ge=0, description="league exploiters (AlphaStar: two per race)")
    decay: float = Field(0.99, gt=0, le=1, description="match results decay by this at every game of their pair")
    main_agent: MainAgentSettings = Field(default_factory=MainAgentSettings)
    main_exploiter: MainExploiterSettings = Field(default_factory=MainExploiterSettings)
    league_exploiter: LeagueExploiterSettings = Field(default_factory=LeagueExploiterSettings)
    snapshot: SnapshotRule = Field(default_factory=SnapshotRule)
