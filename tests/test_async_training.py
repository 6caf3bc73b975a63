"""Asynchronous MARL rounds: the workers stream into the dataset server while the learner trains,
in this process and on Ray, where a worker and a learner killed mid-round are replaced without
losing the run (the learner goes on from the state it last left, not from the start)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import ray
import torch
from processes import poll, start_bare_ray

from marl_core.marl import rounds
from marl_core.marl.async_learners import RayAsyncLearners
from marl_core.marl.config import MARLConfig, layout_and_spec, pool_config
from marl_core.marl.rounds import iterate_marl_local
from marl_core.rollout.pool import WorkerPool
from marl_core.runner import LocalRunner

SPREAD = "pettingzoo:mpe2.simple_spread_v3"
SMALL = {"impala": {"hidden": (16,)}}

torch.set_num_threads(1)


def _config(**overrides) -> MARLConfig:
    settings = dict(
        env=SPREAD,
        algorithm="impala",
        settings=SMALL,
        rounds=4,
        workers=2,
        envs_per_worker=2,
        steps_per_round=16,
        eval_every=2,
        eval_episodes=4,
    )
    return MARLConfig(**{**settings, **overrides})


def test_an_asynchronous_round_streams_and_learns_at_once_and_reports_it():
    records = [record for record, _ in iterate_marl_local(_config())]
    fragment = 2 * 16  # copies x steps: the joint steps of one fragment
    for record in records:
        async_metrics = {k: v for k, v in record.learner.items() if k.startswith("async/")}
        assert async_metrics["async/samples_out_per_second"] > 0 and 0 < async_metrics["async/learner_utilisation"] <= 1
        assert async_metrics["async/staleness_mean"] >= 0 and "agent/rho_mean" in record.learner
    steps = [r.env_steps for r in records]
    assert all(b > a for a, b in zip([0, *steps], steps)) and all(s % fragment == 0 for s in steps)
    # the learner's version counts its optimizer steps: one per fragment taken (IMPALA), 2 a round
    assert [r.learner["async/weights_version"] for r in records] == [2, 4, 6, 8]
    assert [r.eval_returns is not None for r in records] == [False, True, False, True]


def test_the_workers_play_what_the_learners_take_and_throw_no_fragment_away():
    """A fragment finished as a round closes is stored and learned from in the next round, not
    dropped: over a run the workers play what the learners took (2 fragments a round, one per
    worker), plus at most the buffer's capacity (2) ahead."""
    config = _config(rounds=6, eval_every=6)
    records = [record for record, _ in iterate_marl_local(config)]
    played = records[-1].env_steps // (2 * 16)
    taken = 6 * 2
    assert taken <= played <= taken + 2


def test_bsp_learners_of_one_policy_take_their_steps_together_in_a_run():
    config = _config(rounds=2, settings={**SMALL, "asynchronous": {"distributed": {"strategy": "bsp", "learners": 2}}})
    records = [record for record, _ in iterate_marl_local(config)]
    # two learners, one fragment each per round, one IMPALA step each: one BSP step a round
    assert [r.learner["async/weights_version"] for r in records] == [1, 2]
    assert all(r.learner["async/dropped_steps"] == 0 for r in records)


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    start_bare_ray(tmp_path_factory.mktemp("ray"))
    yield
    ray.shutdown()


@pytest.mark.end_to_end
def test_a_worker_and_a_learner_killed_mid_round_are_replaced_and_the_run_goes_on(local_ray):
    config = _config(rounds=5, steps_per_round=32, eval_every=5)
    layout, _ = layout_and_spec(config)
    pool = WorkerPool(pool_config(config), on_ray=True)
    learners = RayAsyncLearners(config, None, pool)
    try:
        records, env_steps, killed = [], 0, {}
        for round in range(config.rounds):
            killer = None
            if round == 3:
                inserted = learners.dataset.stats().inserted
                killer = threading.Thread(target=_kill_mid_round, args=(learners, pool, inserted, killed))
                killer.start()
            record = rounds.run_round(config, round, env_steps, LocalRunner(rounds.STEPS), pool, learners, layout)
            if killer is not None:
                killer.join(timeout=60)
            env_steps = record.env_steps
            records.append(record)
        replaced = _pids(learners, pool)
    finally:
        learners.close()
        pool.close()
    assert killed.get("pids") and all(before != after for before, after in zip(killed["pids"], replaced))
    versions = [r.learner["async/weights_version"] for r in records]
    assert versions[3] > versions[2] and versions[4] > versions[3], versions  # not back to 0 after the kill
    assert np.isfinite(records[-1].eval_returns["policy/agent"])


@pytest.mark.end_to_end
def test_bsp_learners_on_ray_step_together_through_their_parameter_server(local_ray):
    config = _config(
        rounds=2, eval_every=2, settings={**SMALL, "asynchronous": {"distributed": {"strategy": "bsp", "learners": 2}}}
    )
    layout, _ = layout_and_spec(config)
    pool = WorkerPool(pool_config(config), on_ray=True)
    learners = RayAsyncLearners(config, None, pool)
    try:
        records, env_steps = [], 0
        for round in range(config.rounds):
            records.append(
                rounds.run_round(config, round, env_steps, LocalRunner(rounds.STEPS), pool, learners, layout)
            )
            env_steps = records[-1].env_steps
        state, weights = learners.checkpoint()  # the parameter server's master
    finally:
        learners.close()
        pool.close()
    assert [r.learner["async/weights_version"] for r in records] == [1, 2]  # one step of both learners a round
    assert all(r.learner["async/dropped_steps"] == 0 for r in records)
    assert state["agent"]["optimizer"]["state"] and set(weights) == {"agent"}  # it took the steps


def _kill_mid_round(learners, pool, inserted: int, killed: dict) -> None:
    """Once this round's first fragment is in, kill worker 0 and the learner."""
    poll(lambda: learners.dataset.stats().inserted, lambda n: n > inserted, timeout=60)
    killed["pids"] = _pids(learners, pool)
    for handle in (pool.workers[0], learners._members[0]):
        ray.kill(handle, no_restart=False)


def _pids(learners, pool) -> list[int]:
    return ray.get([pool.workers[0].pid.remote(), learners._members[0].pid.remote()])
