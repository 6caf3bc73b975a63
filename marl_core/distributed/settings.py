"""Typed settings of the dataset server and of the distributed strategy of a parameter server.

They live apart from the code that uses them so that checking a run's settings imports no torch
and no Ray; the asynchronous learners' own settings, which hold these, are
`marl_core.marl.settings.AsyncConfig`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class DatasetConfig(BaseModel):
    """The dataset server's buffer of fragments (`marl_core.distributed.dataset_server`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fifo", "uniform", "prioritized"] = Field(
        "fifo",
        description="fifo: each fragment is taken once, oldest first (on-policy); uniform or prioritized: replay",
    )
    capacity: int = Field(
        2,
        gt=0,
        description="fragments held at most; a full FIFO buffer makes the workers wait "
        "(on-policy: small, or the data goes stale)",
    )
    priority_exponent: float = Field(0.6, ge=0, description="prioritized: alpha, how much priorities skew sampling")


class StrategyConfig(BaseModel):
    """How several learners of one policy combine their gradients (MALib's distributed strategies).

    - bsp: the parameter server steps only once every learner's gradient for the current
      weights has arrived, along their sample-weighted mean; all learners always hold the same
      weights. A learner that does not push within `iteration_timeout` is left out of that step.
    - asp: each gradient is applied as it arrives.
    - bap: as asp, but no learner gets more than `staleness` iterations ahead of the slowest
      (stale synchronous parallel, Ho et al. 2013): a faster learner's push waits. An iteration
      that outlives `iteration_timeout` is interrupted: its gradient is dropped when it comes,
      and the others stop waiting for it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    strategy: Literal["bsp", "asp", "bap"] = Field("asp", description="bsp, asp or bap")
    learners: int = Field(1, gt=0, description="learners of each policy, each a Ray actor")
    staleness: int = Field(2, ge=0, description="bap: iterations a learner may run ahead of the slowest")
    iteration_timeout: float = Field(60.0, gt=0, description="bsp, bap: seconds one learner iteration may take")
