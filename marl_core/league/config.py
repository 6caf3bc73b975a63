"""The one typed place for a league run's settings, validated before any work starts.

A league plays a two-sided game (two roles: an OpenSpiel two-player game, or a PettingZoo
environment whose agents map to two roles). Every league member holds one policy per role and
a match between two members is played both ways round: each of a learner's roles trains
against the other role's policies of the opponents it draws. Learners are any RL algorithm of
`marl_core.rl` (`algorithm`), with its settings in the section named after it, as in a PSRO
config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PositiveInt, ValidationError, field_validator, model_validator

from marl_core.empirical_game.game import psro_game_of
from marl_core.league.ratings import RatingSettings
from marl_core.league.settings import LeagueSettings
from marl_core.pbt.settings import PBTSettings
from marl_core.psro.config import WithAlgorithmSections, build_config, with_algorithm_sections
from marl_core.psro.settings import BestResponseTraining, RolloutSettings
from marl_core.rl import ALGORITHMS


class _LeagueConfigWithoutAlgorithms(WithAlgorithmSections):
    model_config = dict(extra="forbid", frozen=True)

    game: str = Field(
        "leduc_poker", description="a two-sided game: an OpenSpiel two-player game string or pettingzoo:<module>"
    )
    roles: dict[str, str] | None = Field(
        None, description="agent-name prefix -> role (two roles); default: one role per agent"
    )
    algorithm: str = Field("dqn", description="the learners' RL algorithm (see `psro oracles`)")
    generations: int = Field(
        20, gt=0, description="generations: every learning player trains, then snapshots are taken"
    )
    episodes: int = Field(10_000, gt=0, description="training episodes per learning player and role per generation")
    episodes_per_round: int = Field(1_000, gt=0, description="episodes between weight updates of the workers")
    opponent_epsilon: float = Field(
        0.0, ge=0, le=1, description="chance that an opponent's move, while a player trains, is uniformly random"
    )
    league: LeagueSettings = Field(default_factory=LeagueSettings)
    player_settings: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="learning player id (main_agent_0, ...) -> its own algorithm settings over the section's",
    )
    pbt: PBTSettings | None = Field(
        None, description="PBT among the learning players of each kind, ranked by rating, at generations"
    )
    ratings: RatingSettings = Field(default_factory=RatingSettings)
    eval_episodes: int = Field(
        1_000,
        ge=0,
        description="greedy episodes per main agent and seat against uniform play, each generation (0: none)",
    )
    seed: int = 0
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    tabularize: bool = Field(
        True, description="members also get their table where a game tree exists (exact exploitability)"
    )
    ray_address: str | None = Field(None, description="existing Ray cluster; default starts a local one")
    num_cpus: PositiveInt | None = Field(None, description="CPUs for the local Ray instance (default: all)")
    tracking_uri: str = Field("sqlite:///mlflow.db", description="MLflow tracking store")
    experiment: str = Field("league", min_length=1, description="MLflow experiment name")
    register_models: bool = Field(True, description="register snapshots in the MLflow model registry")
    export: Path | None = Field(
        None, description="directory for an OpenSpiel-checkable export of the newest main agent"
    )

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, algorithm: str) -> str:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown RL algorithm; choose one of: {', '.join(sorted(ALGORITHMS))}")
        return algorithm

    @model_validator(mode="after")
    def _two_sided(self) -> LeagueConfig:
        game = psro_game_of(self)  # makes the environment once: a bad name or role table fails here
        if game.num_roles != 2:
            raise ValueError(
                f"game {self.game!r} has {game.num_roles} roles {list(game.roles)}; a league plays two-sided games "
                "(map agents to two roles with `roles`)"
            )
        self.oracle_config()  # what its learners are built from must be a valid learned-oracle setup
        self._check_players()
        return self

    def _check_players(self) -> None:
        from marl_core.league.players import League

        players = [p.id for p in League.seeded(self.league).players]
        unknown = sorted(set(self.player_settings) - set(players))
        if unknown:
            raise ValueError(f"player_settings: {unknown} are not learning players of this league; they are {players}")
        for player, settings in self.player_settings.items():
            try:
                self.settings_of(settings)
            except ValidationError as error:
                first = error.errors()[0]
                raise ValueError(
                    f"player_settings.{player}.{'.'.join(map(str, first['loc']))}={first['input']!r}: {first['msg']}"
                ) from None
        if self.pbt is None:
            return
        unknown = sorted(set(self.pbt.hyperparam_mutations) - set(self.learner_settings.model_dump()))
        if unknown:
            raise ValueError(
                f"pbt.hyperparam_mutations: {unknown} are not settings of {self.algorithm}; it has "
                f"{sorted(self.learner_settings.model_dump())}"
            )
        if self.pbt.metric not in (None, "mu", "elo"):
            raise ValueError(
                f"pbt.metric={self.pbt.metric!r}: a league's players are ranked by mu (skill rating) or elo"
            )

    @property
    def learner_settings(self):
        return getattr(self, self.algorithm)

    def settings_of(self, overrides: dict | None = None):
        """The algorithm's settings with a player's own `overrides` over the section's."""
        if not overrides:
            return self.learner_settings
        return type(self.learner_settings)(**{**self.learner_settings.model_dump(), **overrides})

    def oracle_config(self, overrides: dict | None = None):
        """The learned-oracle setup its learners train with (`marl_core.psro.learned_oracle`),
        a player's own settings (`overrides`) over the section's."""
        from marl_core.psro.config import PSROConfig

        return PSROConfig(
            game=self.game,
            roles=self.roles,
            oracle=self.algorithm,
            eval="sampled",
            seed=self.seed,
            best_response=BestResponseTraining(
                episodes=self.episodes,
                episodes_per_round=self.episodes_per_round,
                opponent_epsilon=self.opponent_epsilon,
            ),
            rollout=self.rollout,
            tabularize=self.tabularize,
            **{self.algorithm: self.settings_of(overrides)},
        )


LeagueConfig = with_algorithm_sections(
    _LeagueConfigWithoutAlgorithms,
    "LeagueConfig",
    "A league run's settings, with a section of settings per RL algorithm (its learners').",
)


def build_league_config(values: dict) -> LeagueConfig:
    """A league config, any validation failure as a one-line ConfigError."""
    return build_config(values, LeagueConfig)
