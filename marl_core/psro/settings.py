"""Settings of learned oracles shared by every algorithm; kept free of torch so that checking a
config (and every `psro` command that does) never pays for importing it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BestResponseTraining(BaseModel):
    """How much experience one learned best response gets, and how it is split into rounds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    episodes: int = Field(20_000, gt=0, description="training episodes per best response")
    episodes_per_round: int = Field(1_000, gt=0, description="episodes between weight updates of the workers")


class RolloutSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(2, gt=0, description="rollout workers (Ray actors)")
    envs_per_worker: int = Field(32, gt=0, description="environment copies each worker steps in a batch")
    worker_cpus: float = Field(0.0, ge=0, description="CPU slots each worker reserves in Ray (0 never starves the learner)")
