"""The one typed place for a PSRO run's settings, validated before any work starts."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from marl_core.empirical_game.game import is_openspiel_name, psro_game_of
from marl_core.empirical_game.meta_solvers import check_meta_solver
from marl_core.games.openspiel import is_zero_sum, load_game
from marl_core.psro.oracles import ORACLES, get_oracle
from marl_core.psro.settings import ApproxExploitability, BestResponseTraining, PipelineSettings, RolloutSettings
from marl_core.rl import ALGORITHMS
from marl_core.rl.settings import (
    A2CConfig,
    APPOConfig,
    DQNConfig,
    IMPALAConfig,
    PPOConfig,
    TabularQConfig,
    over_defaults,
)


class ConfigError(ValueError):
    """Bad configuration; the message is one line naming the value and what is allowed."""


# Learned oracles answer short episodic games whose payoffs are the returns themselves: no
# discounting (gamma 1, so values are exact expected payoffs), small networks, and a few
# gradient steps per batch of experience. Each setting can still be overridden, e.g. in YAML:
#   dqn: {lr: 0.0005}
# An algorithm without game defaults here starts from its own defaults.
GAME_DQN = DQNConfig(
    hidden=(64, 64),
    gamma=1.0,
    batch_size=128,
    train_every=4,
    learning_starts=1000,
    epsilon_decay_steps=8000,
    epsilon_end=0.02,
    target_update_interval=200,
)
# PPO: a best response should end near-deterministic, so a small entropy bonus, and more
# optimisation per batch (Kuhn, 20,000 episodes: gap to the exact response 0.018 -> 0.012).
GAME_PPO = PPOConfig(gamma=1.0, lr=1e-3, epochs=8, entropy_coef=0.001)
GAME_A2C = A2CConfig(gamma=1.0)  # the rest: A2C's own defaults
GAME_IMPALA = IMPALAConfig(gamma=1.0)
GAME_APPO = APPOConfig(gamma=1.0)
GAME_TABULAR_Q = TabularQConfig(gamma=1.0)
GAME_DEFAULTS = {
    "dqn": GAME_DQN,
    "ppo": GAME_PPO,
    "a2c": GAME_A2C,
    "impala": GAME_IMPALA,
    "appo": GAME_APPO,
    "tabular_q": GAME_TABULAR_Q,
}  # RL algorithm name -> its game defaults


class WithAlgorithmSections(BaseModel):
    """A config that takes one section of settings per RL algorithm (`with_algorithm_sections`):
    settings given for an algorithm override its game defaults one by one."""

    @field_validator(*GAME_DEFAULTS, mode="before", check_fields=False)
    @classmethod
    def _override_game_defaults(cls, value, info):
        return over_defaults(GAME_DEFAULTS[info.field_name], value)


class _PSROConfigWithoutAlgorithms(WithAlgorithmSections):
    """Every setting of a run but the learned oracles' own, which `PSROConfig` adds: one section
    per RL algorithm, named after it and checked by its settings class."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    game: str = Field(
        "kuhn_poker", description="OpenSpiel game string (leduc_poker, kuhn_poker(players=3)) or pettingzoo:<module>"
    )
    roles: dict[str, str] | None = Field(
        None, description="agent-name prefix -> role (population); default: one role per agent"
    )
    oracle: str = Field("exact", description="best-response oracle")
    meta_solver: str = Field(
        None,
        description="meta-solver for the empirical game "
        "(default: nash for two-player zero-sum OpenSpiel games, else prd)",
    )
    iterations: int = Field(30, gt=0, description="PSRO iterations (best responses added per player)")
    eval: Literal["exact", "sampled"] = Field(
        None, description="payoff evaluator (default: exact where the game tree fits, else sampled)"
    )
    episodes: int = Field(
        1000,
        ge=2,
        description="episodes per profile for the sampled evaluator (2 or more: one episode has no standard error)",
    )
    seed: int = Field(0, description="seed for sampled evaluation and tie-free reproducibility")
    stop_exploitability: float | None = Field(None, ge=0, description="stop early at this exploitability")
    ray_address: str | None = Field(None, description="existing Ray cluster; default starts a local one")
    num_cpus: PositiveInt | None = Field(None, description="CPUs for the local Ray instance (default: all)")
    tracking_uri: str = Field("sqlite:///mlflow.db", description="MLflow tracking store")
    experiment: str = Field("psro", min_length=1, description="MLflow experiment name")
    register_models: bool = Field(True, description="register population members in the MLflow model registry")
    export: Path | None = Field(None, description="directory for an OpenSpiel-checkable export")
    # learned oracles (--oracle dqn, ppo, ...): rollout workers and training budget; their
    # hyperparameters are the sections named after the algorithms (added below)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    best_response: BestResponseTraining = Field(default_factory=BestResponseTraining)
    tabularize: bool = Field(
        True, description="learned members also get their table where a game tree exists (exact payoffs and NashConv)"
    )
    approx_exploitability: ApproxExploitability = Field(default_factory=ApproxExploitability)
    pipeline: PipelineSettings | None = Field(
        None, description="Pipeline PSRO: several learned best responses per role at once (learned oracles)"
    )

    @property
    def oracle_settings(self) -> BaseModel:
        """The learned oracle's settings: the section named after it."""
        if not get_oracle(self.oracle).learns:
            raise ValueError(f"oracle {self.oracle!r} is not learned and has no settings")
        return getattr(self, self.oracle)

    @field_validator("iterations", "episodes", "num_cpus", mode="before")
    @classmethod
    def _not_a_boolean(cls, value):
        return not_a_boolean(value)

    @model_validator(mode="before")
    @classmethod
    def _defaults_that_depend_on_the_game(cls, values):
        """`eval`, `meta_solver` and `approx_exploitability.every` default by what the game offers."""
        if not isinstance(values, dict):
            return values
        values = dict(values)
        game = str(values.get("game", "kuhn_poker"))
        openspiel = is_openspiel_name(game)
        if values.get("eval") is None:
            values["eval"] = "exact" if openspiel else "sampled"
        if values.get("meta_solver") is None:
            values["meta_solver"] = "nash" if openspiel and _two_player_zero_sum(game) else "prd"
        approx = values.get("approx_exploitability")
        learns = values.get("oracle", "exact") in ORACLES and get_oracle(values.get("oracle", "exact")).learns
        if learns and not openspiel and (approx is None or (isinstance(approx, dict) and "every" not in approx)):
            values["approx_exploitability"] = {**(approx or {}), "every": 5}
        return values

    @model_validator(mode="after")
    def _fits_the_game(self) -> PSROConfig:
        oracle = get_oracle(self.oracle)
        if is_openspiel_name(self.game):
            if self.roles is not None:
                raise ValueError(
                    "roles: an OpenSpiel game's roles are its players; roles are for PettingZoo environments"
                )
            game = load_game(self.game)
            if oracle.learns and not game.get_type().provides_information_state_tensor:
                raise ValueError(
                    f"oracle {self.oracle!r} needs a game with information-state tensors (network inputs); "
                    f"{self.game!r} has none: use oracle 'exact'"
                )
            zero_sum = is_zero_sum(game)
        else:
            networks = ", ".join(
                name for name in sorted(ALGORITHMS) if not ALGORITHMS.settings(name).keyed_by_observation
            )
            if not oracle.learns:
                raise ValueError(
                    f"oracle {self.oracle!r} walks a game tree; {self.game!r} has none: use a learned oracle "
                    f"({networks})"
                )
            if ALGORITHMS.settings(self.oracle).keyed_by_observation:
                raise ValueError(
                    f"oracle {self.oracle!r} keeps a table row per information state; {self.game!r} has none: use a "
                    f"network oracle ({networks})"
                )
            zero_sum = False
        played = psro_game_of(self)  # makes the environment once: a bad name or role table fails here
        if self.eval == "exact" or self.oracle == "exact":
            if not played.has_tree:
                what = "eval 'exact'" if self.eval == "exact" else f"oracle {self.oracle!r}"
                raise ValueError(
                    f"{what} needs an OpenSpiel game whose tree fits in memory; {self.game!r} has none: "
                    "use eval 'sampled' and a learned oracle"
                )
            if self.eval == "exact" and oracle.learns and not self.tabularize:
                raise ValueError(
                    "eval 'exact' needs tables of the learned members: set tabularize true or use eval 'sampled'"
                )
        check_meta_solver(self.meta_solver, played.num_roles, zero_sum)
        if self.pipeline is not None and not oracle.learns:
            learned = ", ".join(sorted(ALGORITHMS))
            raise ValueError(
                f"pipeline: oracle {self.oracle!r} computes each best response at once; a pipeline needs a learned "
                f"oracle ({learned})"
            )
        return self

    @property
    def psro_game(self):
        return psro_game_of(self)

    @property
    def num_players(self) -> int:
        """The number of roles (populations): an OpenSpiel game's players."""
        return psro_game_of(self).num_roles


def with_algorithm_sections(base: type[WithAlgorithmSections], name: str, doc: str) -> type:
    """`base` with one config section per RL algorithm, named after it, of its settings class;
    its default is the algorithm's game defaults where `GAME_DEFAULTS` has them."""
    sections = {}
    for algorithm in ALGORITHMS:
        if algorithm in base.model_fields:
            raise ValueError(
                f"RL algorithm {algorithm!r} has the name of a {name} setting; "
                "its config section needs a name of its own"
            )
        settings = ALGORITHMS.settings(algorithm)
        default = GAME_DEFAULTS[algorithm] if algorithm in GAME_DEFAULTS else settings()
        sections[algorithm] = (
            settings,
            Field(default, description=f"{algorithm} settings ({ALGORITHMS.summary(algorithm)})"),
        )
    return create_model(name, __base__=base, __module__=base.__module__, __doc__=doc, **sections)


PSROConfig = with_algorithm_sections(
    _PSROConfigWithoutAlgorithms,
    "PSROConfig",
    "A PSRO run's settings, with a section of settings per RL algorithm (its learned oracle's).",
)


def _two_player_zero_sum(game: str) -> bool:
    try:
        loaded = load_game(game)
    except ValueError:
        return False  # the game's own check reports it
    return loaded.num_players() == 2 and is_zero_sum(loaded)


def one_line(error: ValidationError, model: type[BaseModel]) -> str:
    """A config's validation error as one line naming the setting, its value and what is allowed."""
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if not location:
        return message
    if isinstance(first.get("input"), dict):  # a check across a section's fields: name the section
        return f"{location}: {message}"
    if first["type"] == "extra_forbidden" and len(first["loc"]) == 2:  # a misspelt setting of a section
        section = first["loc"][0]
        message += f"; {section} takes: {', '.join(model.model_fields[section].annotation.model_fields)}"
    return f"{location}={first.get('input')!r}: {message}"


def not_a_boolean(value):
    """A whole-number setting's check: YAML's `yes` would otherwise count as 1."""
    if isinstance(value, bool):
        raise ValueError(f"expected a whole number, got {value!r}")
    return value


def build_config(values: dict, model: type[BaseModel] = None) -> BaseModel:
    """Build a config (default a `PSROConfig`), turning any validation failure into a one-line ConfigError."""
    model = model or PSROConfig
    try:
        return model(**values)
    except ValidationError as error:
        raise ConfigError(one_line(error, model)) from None
    except ValueError as error:  # games, oracles and solvers raise their own one-liners
        raise ConfigError(str(error)) from None


def load_config_file(path: Path) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(f"cannot read config file {str(path)!r}: {error.strerror}") from None
    try:
        values = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        mark, problem = getattr(error, "problem_mark", None), getattr(error, "problem", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        detail = problem or str(error).splitlines()[0]
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{where}: {detail}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of settings, got {type(values).__name__}")
    for key in values:
        if not isinstance(key, str):
            raise ConfigError(f"config file {str(path)!r} has a setting named {key!r}; names are text such as 'game'")
    return {key.replace("-", "_"): value for key, value in values.items()}
