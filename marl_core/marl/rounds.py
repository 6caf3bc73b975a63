"""A MARL run's rounds, wired once and run here or as Prefect tasks on Ray.

`STEPS` names every step a round takes (`marl_core.marl.steps` for collect-then-learn rounds,
`marl_core.marl.async_rounds` for asynchronous ones); `run_round` is the one place a round's steps
are wired, whichever kind it is; a `marl_core.runner.Runner` runs them: in this process (`LocalRunner`,
`iterate_marl_local`) or as Prefect tasks on Ray (`flows/scenarios/marl.py`), so a flow run and a
local run compute the same numbers.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from marl_core.marl.async_learners import LocalAsyncLearners
from marl_core.marl.async_rounds import run_async_round, stream_rollouts, train_learner
from marl_core.marl.config import MARLConfig, asynchronous, layout_and_spec, make_learner, pool_config, training_work
from marl_core.marl.learner_handles import LearnerHandle, LocalLearner
from marl_core.marl.steps import (
    RoundRecord,
    collect_rollouts,
    evaluate_policies,
    evaluate_when_due,
    summarize,
    update_learner,
)
from marl_core.runner import LocalRunner, Runner

if TYPE_CHECKING:
    from marl_core.rollout.layout import PolicyLayout

STEPS: dict[str, Callable] = {
    "collect-rollouts": collect_rollouts,
    "update-learner": update_learner,
    "evaluate-policies": evaluate_policies,
    # asynchronous rounds: both at once
    "stream-rollouts": stream_rollouts,
    "train-learner": train_learner,
}


def run_round(
    config: MARLConfig, round: int, env_steps: int, runner: Runner, pool, learner: LearnerHandle, layout: PolicyLayout
) -> RoundRecord:
    """One round, the one place its steps are wired: collect, learn, and evaluate when due.
    `env_steps` counts the run's joint steps before this round. An asynchronous algorithm's
    round streams and learns at once instead (`marl_core.marl.async_rounds`)."""
    if asynchronous(config) is not None:
        return run_async_round(config, round, env_steps, runner, pool, learner, layout)
    collected = runner.result(runner.submit("collect-rollouts", config, pool, learner, round))
    started = time.perf_counter()
    learner_metrics = runner.result(runner.submit("update-learner", learner, collected))
    learned = time.perf_counter() - started
    eval_mean, eval_stderr, evaluated = evaluate_when_due(config, round, runner, pool, learner, layout)
    train, _ = summarize(collected.returns, list(layout.agents), layout.groups)
    return RoundRecord(
        round=round,
        env_steps=env_steps + collected.env_steps,
        train_returns=train,
        eval_returns=eval_mean,
        eval_stderr=eval_stderr,
        learner=learner_metrics,
        steps_per_second=collected.env_steps / max(collected.seconds, 1e-9),
        seconds={"collect": collected.seconds, "learn": learned, "evaluate": evaluated},
    )


def iterate_marl_local(
    config: MARLConfig, learner=None, first_round: int = 0, env_steps: int = 0, pool=None
) -> Iterator[tuple[RoundRecord, Any]]:
    """The rounds in this process: yields (record, learner) after each round. `pool`: the
    rollout workers (a `WorkerPool` plays on Ray actors at the same time); by default one
    `WorkerPool` whose workers play here, one after another."""
    import torch

    torch.set_num_threads(1)  # small networks, many small batches: threads only contend
    layout, spec = layout_and_spec(config)
    learner = learner or make_learner(config, layout, spec.state_size)
    if asynchronous(config) is not None:
        handle = LocalAsyncLearners(config, learner, lambda: make_learner(config, layout, spec.state_size))
    else:
        handle = LocalLearner(learner, config.learner_threads)
    with contextlib.ExitStack() as stack:
        if pool is None:
            from marl_core.rollout.pool import WorkerPool

            pool = WorkerPool(pool_config(config))
            stack.callback(pool.close)
        stack.enter_context(pool.tracking(training_work(config, first_round)))
        for round in range(first_round, config.rounds):
            record = run_round(config, round, env_steps, LocalRunner(STEPS), pool, handle, layout)
            env_steps = record.env_steps
            yield record, learner
