"""MARL training as a scenario: one `marl-round` subflow per round (MALib's MARL scenario).

A round is `marl_core.marl.rounds.run_round`, the function the in-process loop runs: its steps
(`collect-rollouts`, `update-learner`, `evaluate-policies`) are Prefect tasks on Ray that drive
actors living for the whole run: the rollout workers (the one rollout engine's `WorkerPool`) and
the learner. So the learner's state never travels between rounds: only a round's batch moves,
and the learner publishes its weights to the pool's weight store, from which each worker pulls
them once per request. An asynchronous algorithm's round has the tasks `stream-rollouts` and one
`train-learner` per learner running at once instead: the workers stream into a dataset server
actor while the learner actors train.

Every `checkpoint_every` rounds the learner's training state and each policy's weights are
committed (`flows.tracking.marl_tracker`); a killed run resumes from its last committed round.
As in a resumed PBT run, the workers' episodes start afresh there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flows.runtime.scenario import SEED, Flag, Scenario, Step, environment_help, one_of
from flows.tracking import layout


def _algorithms() -> str:
    from marl_core.marl import MARL_ALGORITHMS

    return f"MARL algorithm, {one_of(MARL_ALGORITHMS)} (see `psro marl algorithms`)"


@dataclasses.dataclass(frozen=True)
class MARLProgress:
    """Where a MARL run stands between rounds: the joint steps played so far, and (a resumed
    run's, until its learner is rebuilt) the learner's committed training state."""

    env_steps: int
    learner_state: dict | None = None


@dataclasses.dataclass
class MARLSession:
    pool: Any
    learner: Any  # the learner handle the rounds drive
    take_checkpoint: Any  # () -> (training state, policy weights)
    layout: Any

    def progress(self) -> list:
        return self.pool.progress()


def validated(model, values: dict):
    """`model(**values)`, or its first validation error as a one-line ConfigError naming the
    setting and its value (a message that names an entry of a mapping is put under the mapping)."""
    from pydantic import ValidationError

    from marl_core.psro.config import ConfigError

    try:
        return model(**values)
    except ValidationError as error:
        first = error.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        where = ".".join(map(str, first["loc"]))
        if not first["loc"]:
            raise ConfigError(message) from None
        named = isinstance(first["input"], dict) and any(message.startswith(f"{key}=") for key in first["input"])
        raise ConfigError(f"{where}.{message}" if named else f"{where}={first['input']!r}: {message}") from None


def check_marl(config) -> None:
    """What a MARL config's settings mean together (an agent no policy takes, frames an encoder
    cannot read), each a one-line ConfigError."""
    from marl_core.marl.config import check
    from marl_core.psro.config import ConfigError

    try:
        check(config)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    except KeyError as error:  # an agent no `policies` prefix matches
        raise ConfigError(str(error.args[0])) from None


class MARLScenario(Scenario):
    name = "marl"
    summary = "MARL training: MAPPO, QMIX, MADDPG, IPPO, IMPALA, ... learners on one environment"
    step_noun = "round"
    steps_setting = "rounds"
    commit_tag = layout.MARL_COMMITTED_TAG
    flags = (
        Flag("env", str, environment_help("simultaneous environment")),
        Flag("algorithm", str, _algorithms),
        Flag("rounds", int, "training rounds"),
        SEED,
    )

    def build_config(self, values: dict):
        from marl_core.marl.config import MARLConfig
        from marl_core.psro.config import ConfigError

        if "env" not in values:
            raise ConfigError("no environment: pass --env or set env in --config")
        config = validated(MARLConfig, values)
        check_marl(config)
        return config

    def environment(self, config) -> str:
        return config.env

    def describe(self, config) -> str:
        copies = config.workers * config.envs_per_worker
        return (
            f"MARL on [bold]{config.env}[/]: {config.algorithm}, {config.rounds} rounds of "
            f"{config.steps_per_round} steps x {copies} copies; MLflow at {config.tracking_uri}"
        )

    # --- the run ------------------------------------------------------------------------------

    def initial_state(self, config) -> MARLProgress:
        return MARLProgress(0)

    def load(self, config, client, run_id: str, committed: int) -> MARLProgress:
        import tempfile

        import torch

        run = client.get_run(run_id)
        with tempfile.TemporaryDirectory() as directory:
            # map_location: a state a GPU learner saved resumes on a machine without one
            path = client.download_artifacts(run_id, layout.MARL_CHECKPOINT, directory)
            state = torch.load(path, weights_only=True, map_location="cpu")
        return MARLProgress(int(run.data.tags[layout.MARL_ENV_STEPS_TAG]), state)

    def steps(self, config, committed: int | None) -> range:
        return range(0 if committed is None else committed + 1, config.rounds)

    def open(self, config, state: MARLProgress, steps: range, stack) -> MARLSession:
        import ray

        from marl_core.marl.async_learners import RayAsyncLearners
        from marl_core.marl.config import asynchronous, layout_and_spec, pool_config, training_work
        from marl_core.marl.learner_handles import LearnerActor, RayLearner
        from marl_core.rollout.pool import WorkerPool

        pool = WorkerPool(pool_config(config), on_ray=True)
        stack.callback(pool.close)
        stack.enter_context(pool.tracking(training_work(config, steps.start)))
        if asynchronous(config) is not None:
            learner = RayAsyncLearners(config, state.learner_state, pool)
            stack.callback(learner.close)
            take_checkpoint = learner.checkpoint
        else:
            actor = ray.remote(num_cpus=0)(LearnerActor).remote(config, state.learner_state)
            learner = RayLearner(actor)

            def take_checkpoint():
                return ray.get(actor.checkpoint.remote())

        layout_, _ = layout_and_spec(config)
        return MARLSession(pool, learner, take_checkpoint, layout_)

    def step(self, config, session: MARLSession, state: MARLProgress, index: int) -> Step:
        from flows.runtime.task_steps import RayTaskSteps
        from marl_core.marl import rounds
        from tasks.marl_tasks import TASKS

        # The tasks only drive actors, so they hold no CPU slot (on a small machine a waiting
        # task that held one would starve the actors).
        runner = RayTaskSteps(TASKS, driving_actors=frozenset(TASKS))
        record = rounds.run_round(config, index, state.env_steps, runner, session.pool, session.learner, session.layout)
        return Step(record, MARLProgress(record.env_steps))

    def checkpoint(self, config, session: MARLSession, index: int, step: Step):
        from marl_core.marl.config import checkpoint_due

        return session.take_checkpoint() if checkpoint_due(config, index) else None

    def tracker(self, config, resume, tags):
        from flows.tracking.marl_tracker import MARLTracker

        return MARLTracker(config, resume, tags)

    # --- the command's lines ------------------------------------------------------------------

    def line(self, record, state) -> str:
        returns = record.eval_returns or record.train_returns
        kind = "eval" if record.eval_returns else "train"
        shown = "  ".join(
            f"{k.removeprefix('policy/')} {v:8.2f}" for k, v in returns.items() if k.startswith("policy/")
        )
        return (
            f"round {record.round:4d}  steps {record.env_steps:8d}  {kind} return {shown}  "
            f"{record.steps_per_second:7.0f} steps/s"
        )

    def done(self, config, state, record, seconds: float) -> str:
        return f"done: {config.rounds} rounds in {seconds:.1f}s"


MARL = MARLScenario()
