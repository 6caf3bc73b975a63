"""Prefect tasks of a MARL training round: thin wrappers over `marl_core.marl.training`.

The rollout workers and the learner are Ray actors that live for the whole run (see
`flows/marl_flow.py`); a task drives them and hands on what they return, so one round is three
coarse tasks, never one per episode or step. The tasks hold no CPU slot of their own: the work
happens in the actors, and a task that held a slot while waiting would starve them on a small
machine.
"""

from __future__ import annotations

import ray
from prefect import task
from prefect.cache_policies import NO_CACHE

_options = dict(cache_policy=NO_CACHE, persist_result=False)


@task(name="collect-rollouts", **_options)
def collect_rollouts(workers, learner, steps: int):
    """Every worker plays `steps` joint steps per copy with the learner's current policies."""
    return workers.collect(ray.get(learner.policies.remote()), steps)


@task(name="update-learner", **_options)
def update_learner(learner, collected) -> dict[str, float]:
    return ray.get(learner.learn.remote(collected.batch))


@task(name="evaluate-policies", **_options)
def evaluate_policies(workers, learner, episodes: int, seed: int):
    """Greedy episodes from fresh resets: [episodes, agents] summed rewards."""
    return workers.evaluate(ray.get(learner.policies.remote()), episodes, seed)
