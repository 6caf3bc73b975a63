"""Prefect tasks of a league generation: one per step of `marl_core.league.generation.STEPS`.

A learning player's role is two tasks that run at the same time, as a PSRO learned response
is: `train-player` (the learner, holding a CPU slot, going on from the trainer state it is
given) and `collect-experience` (driving the rollout actors, holding none). Either may be
retried alone after one of Ray's transient failures: the other waits for it.
"""

from __future__ import annotations

from prefect import task

from marl_core.league import generation
from tasks.psro_tasks import _log_ray_node, _options, _retrying


@task(name="train-player", **_retrying)
def train_player(config, matchup, role: int, trainer_state, generation_index: int, pool=None):
    _log_ray_node()
    return generation.STEPS["train-player"](config, matchup, role, trainer_state, generation_index, pool)


@task(name="collect-experience", **_retrying)
def collect_experience(config, matchup, role: int, generation_index: int, pool):
    _log_ray_node()
    return generation.STEPS["collect-experience"](config, matchup, role, generation_index, pool)


@task(name="measure-players", **_options)
def measure_players(config, members, generation_index: int, pool=None):
    _log_ray_node()
    return generation.STEPS["measure-players"](config, members, generation_index, pool)


# One task per step of `marl_core.league.generation.STEPS`, under the same names.
TASKS = {
    "train-player": train_player,
    "collect-experience": collect_experience,
    "measure-players": measure_players,
}
