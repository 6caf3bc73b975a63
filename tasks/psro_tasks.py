"""Prefect tasks: thin wrappers that give each PSRO step a name, a state and a place on Ray.

Caching is off: inputs are whole populations, and hashing them on every call would cost more
than most steps. Every task computes through `marl_core.psro`, so the flow and the local loop
cannot drift apart.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from marl_core import psro

_options = dict(cache_policy=NO_CACHE, persist_result=False)


def _log_ray_node() -> None:
    """One log line naming the Ray node the task runs on: on a cluster, Prefect's task-run logs
    then show where the work went (tests/test_cluster.py reads them)."""
    import ray

    if ray.is_initialized():
        get_run_logger().info("on Ray node %s", ray.get_runtime_context().get_node_id())


@task(name="train-best-response", **_options)
def train_best_response(config, player: int, populations, meta_strategy, iteration: int, pool=None):
    _log_ray_node()
    return psro.best_response(config, player, populations, meta_strategy, iteration, pool)


@task(name="expand-population", **_options)
def expand_population(populations, responses):
    _log_ray_node()
    return psro.expand_population(populations, responses)


@task(name="evaluate-payoffs", **_options)
def evaluate_payoffs(config, populations, profiles):
    _log_ray_node()
    return psro.evaluate_payoffs(config, populations, profiles)


@task(name="solve-meta-game", **_options)
def solve_meta_game(config, payoffs, chunks, evaluations):
    _log_ray_node()
    return psro.solve_meta_game(config, payoffs, chunks, evaluations)


@task(name="measure-exploitability", **_options)
def measure_exploitability(config, populations, meta_game):
    _log_ray_node()
    return psro.measure(config, populations, meta_game)
