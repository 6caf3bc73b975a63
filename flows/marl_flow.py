"""MARL training as Prefect flows: a `marl` flow that runs one `marl-round` subflow per round.

A round's tasks (`collect-rollouts`, `update-learner`, `evaluate-policies`) run on Ray through
prefect-ray's task runner; they drive actors that live for the whole run: the rollout workers
(each a `JointCollector` and a greedy evaluator) and the learner. So the learner's state never
travels between rounds, and only a round's batch and the current policies move.

Every `checkpoint_every` rounds the learner's training state and each policy's weights go to
MLflow, the policies are registered, and then the run is tagged with the round: the commit. A
killed run resumes from its last committed round (`psro marl resume RUN_ID`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Optional

import numpy as np
import ray
from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows.ray_runner import FastRayTaskRunner
from flows.patches import fresh_every_call
from flows.runtime import prefect_api, ray_session, reap_on_crash
from marl_core.marl import training
from marl_core.marl.training import MARLConfig, RoundRecord

RoundCallback = Callable[[RoundRecord], None]


class _Worker:
    """One rollout worker: training copies and a greedy evaluator (a Ray actor)."""

    def __init__(self, config: MARLConfig, index: int):
        import torch

        torch.set_num_threads(1)
        one = config.model_copy(update={"workers": 1, "seed": training._seed(config.seed, 5, index)})
        self.workers = training.Workers(one)

    def collect(self, policies, steps: int):
        return self.workers.collect(policies, steps)

    def evaluate(self, policies, episodes: int, seed: int):
        return self.workers.evaluate(policies, episodes, seed)


class RayWorkers:
    """`training.Workers`' interface on Ray actors: the workers play at the same time."""

    def __init__(self, config: MARLConfig):
        self.actors = [ray.remote(num_cpus=0)(_Worker).remote(config, i) for i in range(config.workers)]
        self.layout, self.spec = training.layout_and_spec(config)

    def collect(self, policies, steps: int) -> training.Collected:
        started = time.perf_counter()
        shared = ray.put(policies)
        parts = ray.get([a.collect.remote(shared, steps) for a in self.actors])
        merged = training._merge([(p.batch, p.returns, p.lengths) for p in parts], steps, time.perf_counter() - started)
        return merged

    def evaluate(self, policies, episodes: int, seed: int) -> np.ndarray:
        shared = ray.put(policies)
        shares = np.array_split(np.arange(episodes), len(self.actors))
        parts = [a.evaluate.remote(shared, len(s), training._seed(seed, i)) for i, (a, s) in enumerate(zip(self.actors, shares)) if len(s)]
        return np.concatenate(ray.get(parts))


class _Learner:
    """The learner as a Ray actor: it keeps its networks, optimizers and buffers between rounds."""

    def __init__(self, config: MARLConfig, state: Optional[dict]):
        import torch

        torch.set_num_threads(1)
        self.layout, spec = training.layout_and_spec(config)
        self.state_size = spec.state_size
        self.learner = training.make_learner(config, self.layout, self.state_size)
        if state is not None:
            self.learner.load_state_dict(state)

    def policies(self):
        return self.learner.policies

    def learn(self, batch) -> dict[str, float]:
        return self.learner.learn(batch)

    def checkpoint(self) -> tuple[dict, dict]:
        """(training state, policy id -> acting weights)."""
        return self.learner.state_dict(), {p: policy.get_weights() for p, policy in self.learner.policies.items()}

    def layout_of(self):
        return self.layout


@fresh_every_call
@flow(name="marl-round", task_runner=FastRayTaskRunner(), validate_parameters=False, persist_result=False)
def marl_round(config: MARLConfig, round: int, env_steps: int, workers: RayWorkers, learner) -> RoundRecord:
    from tasks import marl_tasks

    collected = marl_tasks.collect_rollouts.submit(workers, learner, config.steps_per_round).result()
    learned = time.perf_counter()
    metrics = marl_tasks.update_learner.submit(learner, collected).result()
    learned = time.perf_counter() - learned
    evaluation, evaluated = None, 0.0
    if training.evaluation_due(config, round):
        started = time.perf_counter()
        seed = training._seed(config.seed, 4, round)
        evaluation = marl_tasks.evaluate_policies.submit(workers, learner, config.eval_episodes, seed).result()
        evaluated = time.perf_counter() - started
    layout = ray.get(learner.layout_of.remote())
    seconds = {"collect": collected.seconds, "learn": learned, "evaluate": evaluated}
    return training.round_record(config, round, env_steps + collected.env_steps, collected, metrics, evaluation, seconds, layout)


@flow(name="marl", validate_parameters=False, persist_result=False)
def marl_flow(config: dict, on_round: Optional[RoundCallback] = None, resume_run_id: Optional[str] = None) -> int:
    """The whole run; returns the number of rounds the run has completed."""
    from flows.tracking.marl_tracker import MARLTracker, load_marl_checkpoint

    config = MARLConfig(**config) if isinstance(config, dict) else config
    checkpoint = load_marl_checkpoint(config.tracking_uri, resume_run_id) if resume_run_id else None
    first = checkpoint.round + 1 if checkpoint else 0
    env_steps = checkpoint.env_steps if checkpoint else 0
    with contextlib.ExitStack() as stack:
        stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        workers = RayWorkers(config)
        learner = ray.remote(num_cpus=0)(_Learner).remote(config, checkpoint.state if checkpoint else None)
        tracker = stack.enter_context(MARLTracker(config, checkpoint))
        for round in range(first, config.rounds):
            record = marl_round(config, round, env_steps, workers, learner)
            env_steps = record.env_steps
            tracker.log_round(record)
            if training.checkpoint_due(config, round):
                state, weights = ray.get(learner.checkpoint.remote())
                tracker.commit(round, env_steps, state, weights)
            if on_round:
                on_round(record)
        tracker.finish()
    return config.rounds


def run_marl(config: MARLConfig, on_round: Optional[RoundCallback] = None, resume_run_id: Optional[str] = None) -> int:
    """Start what the run needs (a Prefect server, Ray, the MLflow store), run the flow, stop all."""
    from flows.tracking.run_tracker import prepare_store

    with contextlib.ExitStack() as stack:
        stack.enter_context(reap_on_crash())
        api_url, wait_for_api = stack.enter_context(prefect_api())
        stack.enter_context(temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        prepare_store(config.tracking_uri)
        stack.enter_context(ray_session(config.ray_address, config.num_cpus, {"PREFECT_API_URL": api_url}))
        wait_for_api()
        return marl_flow(config, on_round, resume_run_id)
