"""Prefect tasks: thin wrappers that give each PSRO step a name, a state and a place on Ray.

Caching is off: inputs are whole populations, and hashing them on every call would cost more
than most steps. Every task computes through `marl_core.psro.steps` (Pipeline PSRO's `train-levels`
through `marl_core.psro.pipeline`), so the flow and the local loop cannot drift apart.

Retries: a worker process that dies under a task is retried by Ray itself; what reaches Prefect
is a failure Ray could not hide (a rollout actor out of restarts, a lost object, a dropped
connection). Those are retried after a delay. Any other exception is a deterministic error in
the inputs or the code: retrying would only repeat it, so it fails the run at once.

A learned best response is one task, `train-best-response`: the learner, holding a CPU slot,
plays its rounds on the rollout actors (`marl_core.psro.learned_oracle`). Its rounds are defined
by their index, so a retry learns what the failed attempt would have.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from marl_core.psro import steps

_options = dict(cache_policy=NO_CACHE, persist_result=False)


def _transient(task, task_run, state) -> bool:
    from marl_core.rollout.pool import is_transient

    try:
        state.result()
    except Exception as error:
        return is_transient(error)
    return False


_retrying = dict(_options, retries=2, retry_delay_seconds=5, retry_condition_fn=_transient)


_NODE_COUNT_TTL = 60.0
_node_count: tuple[float, int] = (float("-inf"), 0)  # (when counted, alive nodes) in this worker


def several_nodes() -> bool:
    """Whether the Ray cluster has more than one live node, asked of Ray at most once a minute."""
    import time

    import ray

    global _node_count
    counted_at, count = _node_count
    if time.monotonic() - counted_at > _NODE_COUNT_TTL:
        count = sum(1 for node in ray.nodes() if node.get("Alive"))
        _node_count = (time.monotonic(), count)
    return count > 1


def _log_ray_node() -> None:
    """One log line naming the Ray node the task runs on, when there is more than one: on a
    cluster, Prefect's task-run logs then show where the work went (tests/test_cluster.py reads
    them). On a single machine the line would say nothing and cost the server a row per task."""
    import ray

    if ray.is_initialized() and several_nodes():
        get_run_logger().info("on Ray node %s", ray.get_runtime_context().get_node_id())


@task(name="train-best-response", **_retrying)
def train_best_response(config, role: int, populations, meta_strategy, iteration: int, pool=None):
    _log_ray_node()
    return steps.STEPS["train-best-response"](config, role, populations, meta_strategy, iteration, pool)


@task(name="train-levels", **_options)
def train_levels(pipeline, state):
    """Pipeline PSRO's learning between two freezes. Not retried: its learners (Ray actors) went
    on from where a failed attempt left them, which a retry's copy of the pipeline does not know."""
    from marl_core.psro import pipeline as pipelines

    _log_ray_node()
    return pipelines.train_levels(pipeline, state)


@task(name="evaluate-payoffs", **_retrying)
def evaluate_payoffs(config, populations, responses, profiles, pool=None, progress=None):
    _log_ray_node()
    return steps.STEPS["evaluate-payoffs"](config, populations, responses, profiles, pool, progress)


@task(name="solve-meta-game", **_options)
def solve_meta_game(config, payoffs, chunks, evaluations):
    _log_ray_node()
    return steps.STEPS["solve-meta-game"](config, payoffs, chunks, evaluations)


@task(name="measure-exploitability", **_options)
def measure_exploitability(config, populations, responses, meta_game):
    _log_ray_node()
    return steps.STEPS["measure-exploitability"](config, populations, responses, meta_game)


@task(name="approximate-best-response", **_retrying)
def approximate_best_response(config, role: int, populations, responses, meta_game, iteration: int, pool=None):
    _log_ray_node()
    return steps.STEPS["approximate-best-response"](config, role, populations, responses, meta_game, iteration, pool)


# One task per step of `marl_core.psro.steps.STEPS`, under the same names.
TASKS = {
    "train-best-response": train_best_response,
    "train-levels": train_levels,
    "evaluate-payoffs": evaluate_payoffs,
    "solve-meta-game": solve_meta_game,
    "measure-exploitability": measure_exploitability,
    "approximate-best-response": approximate_best_response,
}
