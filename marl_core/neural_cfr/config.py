"""A neural CFR run's settings: the game, how long, how often it is measured and committed, and
the solver's hyperparameters (`NeuralCFRSettings`, under `neural_cfr:`).

Free of torch, like every config here: a run's settings are checked before anything heavy is
imported or started.
"""

from __future__ import annotations

from pathlib import Path

import pyspiel
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from marl_core.games.openspiel import GameError, load_game
from marl_core.neural_cfr.settings import NeuralCFRSettings
from marl_core.psro.config import not_a_boolean


def check_game(game: pyspiel.Game, game_string: str) -> None:
    """Neural CFR needs two players, zero-sum payoffs and information-state tensors."""
    game_type = game.get_type()
    if game.num_players() != 2:
        raise GameError(f"neural CFR needs a two-player game; {game_string!r} has {game.num_players()} players")
    if game_type.utility not in (pyspiel.GameType.Utility.ZERO_SUM, pyspiel.GameType.Utility.CONSTANT_SUM):
        raise GameError(f"neural CFR needs a zero-sum game; {game_string!r} is not")
    if not game_type.provides_information_state_tensor:
        raise GameError(f"neural CFR acts on information-state tensors; {game_string!r} provides none")


class NeuralCFRConfig(BaseModel):
    """`psro cfr run` (or `psro run --config` on a file that says `scenario: cfr`)."""

    model_config = ConfigDict(extra="forbid")

    game: str = Field("leduc_poker", description="a two-player zero-sum OpenSpiel game with information-state tensors")
    rounds: PositiveInt = Field(60, description="rounds; each is a Prefect flow run of iterations_per_round iterations")
    iterations_per_round: PositiveInt = Field(10, description="CFR iterations per round")
    exact: bool = Field(
        True, description="measure the members' exact exploitability every round on the enumerated tree (must fit)"
    )
    stop_exploitability: float | None = Field(None, ge=0, description="stop after the round that reaches this")
    checkpoint_every: PositiveInt = Field(1, description="commit the solver's whole state every this many rounds")
    threads: PositiveInt = Field(1, description="torch threads of the solver's actor")
    neural_cfr: NeuralCFRSettings = Field(default_factory=NeuralCFRSettings)
    ray_address: str | None = Field(None, description="existing Ray cluster; default starts a local one")
    num_cpus: PositiveInt | None = Field(None, description="CPUs for the local Ray instance (default: all)")
    tracking_uri: str = Field("sqlite:///mlflow.db", description="MLflow tracking store")
    experiment: str = Field("neural-cfr", min_length=1, description="MLflow experiment name")
    export: Path | None = Field(None, description="directory for an OpenSpiel-checkable export")

    @field_validator("rounds", "iterations_per_round", "checkpoint_every", "threads", "num_cpus", mode="before")
    @classmethod
    def _not_a_boolean(cls, value):
        return not_a_boolean(value)

    @model_validator(mode="after")
    def _fits_the_game(self) -> NeuralCFRConfig:
        check_game(load_game(self.game), self.game)
        if self.stop_exploitability is not None and not self.exact:
            raise ValueError("stop_exploitability needs exact: true (it is the exact exploitability)")
        if self.export is not None and not self.exact:
            raise ValueError("export needs exact: true (the export holds the members' tables)")
        return self

    def checkpoint_due(self, round: int) -> bool:
        return (round + 1) % self.checkpoint_every == 0 or round == self.rounds - 1
