"""Prefect tasks of a MARL training round: one per step of `marl_core.marl.rounds.STEPS`.

The rollout workers and the learner are Ray actors that live for the whole run (see
`flows/scenarios/marl.py`); a task drives them and hands on what they return, so one round is three
coarse tasks, never one per episode or step. An asynchronous round's `stream-rollouts` and
`train-learner` tasks run at once, each for the whole round.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from marl_core.marl import rounds

_options = dict(cache_policy=NO_CACHE, persist_result=False)


@task(name="collect-rollouts", **_options)
def collect_rollouts(config, pool, learner, round: int):
    """Every worker plays `steps_per_round` joint steps per copy with the learner's current policies."""
    return rounds.STEPS["collect-rollouts"](config, pool, learner, round)


@task(name="update-learner", **_options)
def update_learner(learner, collected) -> dict[str, float]:
    return rounds.STEPS["update-learner"](learner, collected)


@task(name="evaluate-policies", **_options)
def evaluate_policies(config, pool, learner, round: int):
    """Greedy episodes from fresh resets: [episodes, agents] summed rewards."""
    return rounds.STEPS["evaluate-policies"](config, pool, learner, round)


@task(name="stream-rollouts", **_options)
def stream_rollouts(config, pool, learners):
    """Every worker streams fragments into the dataset server until the round's learners are done."""
    return rounds.STEPS["stream-rollouts"](config, pool, learners)


@task(name="train-learner", **_options)
def train_learner(config, pool, learners, member: int):
    """One learner trains on fragments from the dataset server while the workers play."""
    return rounds.STEPS["train-learner"](config, pool, learners, member)


# One task per step of `marl_core.marl.rounds.STEPS`, under the same names.
TASKS = {
    "collect-rollouts": collect_rollouts,
    "update-learner": update_learner,
    "evaluate-policies": evaluate_policies,
    "stream-rollouts": stream_rollouts,
    "train-learner": train_learner,
}
