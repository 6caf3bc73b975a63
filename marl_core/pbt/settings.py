"""PBT's settings, under the names Ray Tune's `PopulationBasedTraining` gives them, with its
defaults where they carry over. Tune counts `perturbation_interval` in `time_attr` units
(seconds by default, 60); here it counts the scenario's steps of training (MARL rounds, league
generations), so it has no default. A mutation is written as YAML can hold it:

    hyperparam_mutations:
      lr: {loguniform: [1.0e-5, 1.0e-2]}   # resampled log-uniformly, or multiplied by a factor
      entropy_coef: {uniform: [0.0, 0.05]}
      epochs: {randint: [2, 16]}           # an integer stays an integer
      minibatch_size: [64, 128, 256]       # a list: resampled, or moved one place up or down

Kept free of torch, so a config is checked before anything loads.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class Distribution(BaseModel):
    """One of Tune's search-space samplers, as a one-key mapping."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None  # low inclusive, high exclusive, as Tune's tune.randint

    @model_validator(mode="after")
    def _one_kind(self) -> Distribution:
        given = [name for name in ("uniform", "loguniform", "randint") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "a distribution is one of uniform: [low, high], loguniform: [low, high], randint: [low, high]; got "
                f"{given or 'none'}"
            )
        low, high = getattr(self, given[0])
        if not low < high:
            raise ValueError(f"{given[0]}: low {low} must be below high {high}")
        if given[0] == "loguniform" and low <= 0:
            raise ValueError(f"loguniform: low {low} must be above 0")
        return self

    @property
    def kind(self) -> str:
        return next(name for name in ("uniform", "loguniform", "randint") if getattr(self, name) is not None)


Mutation = list | Distribution


class PBTSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    perturbation_interval: int = Field(
        ..., gt=0, description="training steps (rounds, generations) between exploit/explore points"
    )
    burn_in_period: int = Field(0, ge=0, description="no exploit/explore before this many training steps (Tune: 0)")
    quantile_fraction: float = Field(
        0.25, ge=0, le=0.5, description="the bottom fraction copies from the top fraction (Tune: 0.25)"
    )
    resample_probability: float = Field(
        0.25, ge=0, le=1, description="chance that explore resamples a value instead of perturbing it (Tune: 0.25)"
    )
    perturbation_factors: tuple[float, float] = Field(
        (1.2, 0.8), description="a perturbed value is multiplied by one of these (Tune: 1.2, 0.8)"
    )
    hyperparam_mutations: dict[str, Mutation] = Field(
        ..., min_length=1, description="hyperparameter -> list of values or distribution"
    )
    metric: str | None = Field(
        None,
        description="what members are ranked by: a MARL population by return (greedy return, its default), a league's "
        "players by mu (skill rating, its default) or elo",
    )
    mode: Literal["max", "min"] = Field("max", description="whether a higher or a lower metric is better")

    @field_validator("hyperparam_mutations", mode="before")
    @classmethod
    def _mutations(cls, mutations):
        """Each mutation read here, so a bad one is named with its own error rather than with
        the first of a union's."""
        if not isinstance(mutations, dict):
            return mutations
        kinds = ("uniform", "loguniform", "randint")
        unreadable = (
            "give a list of values or one of uniform: [low, high], loguniform: [low, high], randint: [low, high]"
        )
        checked = {}
        for name, mutation in mutations.items():
            if isinstance(mutation, list):
                if not mutation:
                    raise ValueError(f"{name}: a list of values needs at least one value")
                checked[name] = mutation
                continue
            # a logged config (model_dump) also names the kinds a distribution is not, as None
            given = {k: v for k, v in mutation.items() if v is not None} if isinstance(mutation, dict) else {}
            if len(given) != 1 or not set(given) <= set(kinds):
                raise ValueError(f"{name}={mutation!r}: {unreadable}")
            try:
                checked[name] = Distribution(**given)
            except ValidationError as error:
                raise ValueError(
                    f"{name}={mutation!r}: {error.errors()[0]['msg'].removeprefix('Value error, ')}"
                ) from None
        return checked


def dotted(settings: dict, prefix: str = "") -> dict[str, Any]:
    """Settings by dotted name: a section's settings (IPPO's `ppo: {lr: ...}`) as `ppo.lr`, the
    names mutations take and MLflow's params carry."""
    flat = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def merged(settings: dict, overrides: dict) -> dict:
    """`settings` with `overrides` over them, section by section (a member's `ppo: {lr: ...}`
    keeps the section's other settings), or by dotted name (`ppo.lr`)."""
    out = {key: merged(value, {}) if isinstance(value, dict) else value for key, value in settings.items()}
    for key, value in overrides.items():
        section, _, rest = key.partition(".")
        if rest:
            out[section] = merged(out.get(section, {}), {rest: value})
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out
