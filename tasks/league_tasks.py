"""Prefect tasks of a league generation: one per step of `marl_core.league.generation.STEPS`.

A learning player's role is one task, as a PSRO learned response is: `train-player`, going on
from the trainer state it is given and playing its rounds on the rollout actors; it is retried
after one of Ray's transient failures, as `tasks.psro_tasks` says.
"""

from __future__ import annotations

from prefect import task

from marl_core.league import generation
from tasks.psro_tasks import _log_ray_node, _options, _retrying


@task(name="train-player", **_retrying)
def train_player(config, matchup, role: int, trainer_state, generation_index: int, pool=None):
    _log_ray_node()
    return generation.STEPS["train-player"](config, matchup, role, trainer_state, generation_index, pool)


@task(name="measure-players", **_options)
def measure_players(config, members, generation_index: int, pool=None):
    _log_ray_node()
    return generation.STEPS["measure-players"](config, members, generation_index, pool)


# One task per step of `marl_core.league.generation.STEPS`, under the same names.
TASKS = {
    "train-player": train_player,
    "measure-players": measure_players,
}
