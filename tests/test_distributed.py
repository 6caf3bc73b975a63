"""The dataset server's bound and sampling, and the parameter server's strategies: BSP's step is
one learner's step on the union of the batches, BAP's bound holds against a slow learner, and a
learner that stops pushing holds up neither BSP nor BAP for longer than the iteration timeout."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from marl_core.distributed.dataset_server import CLOSED, FULL, RESERVED, STORED, DatasetServer
from marl_core.distributed.parameter_server import ParameterServer
from marl_core.distributed.settings import DatasetConfig, StrategyConfig  # noqa: F401
from marl_core.rl.batch import Experience
from marl_core.rl.gradient_steps import gradients
from marl_core.rl.impala import IMPALATrainer
from marl_core.rl.settings import IMPALAConfig

# --- the dataset server ------------------------------------------------------------------------


def test_a_fast_producer_waits_on_a_full_fifo_buffer_that_never_outgrows_its_bound():
    server = DatasetServer(DatasetConfig(kind="fifo", capacity=3))
    sizes, taken = [], []

    def produce():
        for i in range(40):
            assert server.put(i, version=i // 4, timeout=10.0) == STORED

    producer = threading.Thread(target=produce)
    producer.start()
    while len(taken) < 40:
        sizes.append(server.stats().size)
        time.sleep(0.002)  # the slow consumer
        fragments = server.take(2 if len(taken) < 38 else 1, learner_version=len(taken) // 4 + 1, timeout=10.0)
        taken.extend(fragments)
    producer.join(timeout=10)
    stats = server.stats()
    assert [f.item for f in taken] == list(range(40))  # oldest first, each once
    assert max(sizes) == 3 and stats.size == 0 and stats.inserted == stats.taken == 40
    assert stats.put_wait_seconds > 0  # the producer was held back
    assert sum(stats.staleness.values()) == 40 and min(stats.staleness) >= 0


def test_a_closed_server_releases_a_waiting_producer_and_consumer():
    full = DatasetServer(DatasetConfig(capacity=1))
    assert full.put("a", 0, timeout=1.0) == STORED
    assert full.put("b", 0, timeout=0.01) == FULL
    empty = DatasetServer(DatasetConfig(capacity=1))
    outcomes = {}
    waiters = [
        threading.Thread(target=lambda: outcomes.update(put=full.put("b", 0, timeout=30.0))),
        threading.Thread(target=lambda: outcomes.update(take=empty.take(1, 0, timeout=30.0))),
    ]
    for waiter in waiters:
        waiter.start()
    full.close()
    empty.close()
    for waiter in waiters:
        waiter.join(timeout=5.0)
    assert outcomes == {"put": CLOSED, "take": None}


def test_room_reserved_before_playing_counts_against_the_bound_and_keeps_a_fragment_played_past_close():
    """The workers' fragments in play count as held, so they are never more than capacity ahead;
    one whose room was reserved is stored even after the server closed (its play is not lost);
    a stream's new reservation replaces its last (a restarted worker's)."""
    server = DatasetServer(DatasetConfig(capacity=2))
    assert server.put("old", 0, timeout=0.0, origin=("a", 0)) == STORED
    assert server.reserve("a", 1, timeout=0.0) == RESERVED
    assert server.reserve("b", 0, timeout=0.01) == FULL  # one held and one in play: no room
    assert server.put("other", 0, timeout=0.01) == FULL  # nor for a fragment that reserved none
    assert server.reserve("a", 1, timeout=0.0) == RESERVED  # replaced, not doubled
    server.close()
    assert server.reserve("b", 0, timeout=0.0) == CLOSED
    assert server.put("played", 1, timeout=0.0, origin=("a", 1)) == STORED
    assert [f.item for f in server.take(2, learner_version=1, timeout=0.0)] == ["old", "played"]
    server.open()
    assert server.reserve("b", 0, timeout=0.0) == RESERVED and server.reserve("a", 2, timeout=0.0) == RESERVED


def test_a_new_rounds_learners_take_the_last_rounds_fragments_once_a_worker_of_theirs_has_begun():
    """Fragments left from the last round are kept, but a reopened server serves them only once a
    producer of the new round has room (else a round could end having played nothing), or at
    once when the buffer is full (no producer can begin until a learner takes)."""
    server = DatasetServer(DatasetConfig(capacity=3))
    assert server.put("left", 0, timeout=0.0) == STORED
    server.close()
    server.open()
    taken = []
    learner = threading.Thread(target=lambda: taken.append(server.take(1, learner_version=1, timeout=30.0)))
    learner.start()
    learner.join(timeout=0.3)
    assert learner.is_alive() and taken == []  # the fragment is there, but no worker of this round began
    assert server.reserve("worker", 0, timeout=0.0) == RESERVED
    learner.join(timeout=5.0)
    assert [f.item for f in taken[0]] == ["left"]

    full = DatasetServer(DatasetConfig(capacity=1))
    assert full.put("left", 0, timeout=0.0) == STORED
    full.close()
    full.open()
    started = time.monotonic()
    assert [f.item for f in full.take(1, learner_version=1, timeout=30.0)] == ["left"]
    assert time.monotonic() - started < 10.0  # served at once, not after the wait ran out


def test_replay_keeps_the_newest_fragments_up_to_capacity_without_waiting():
    server = DatasetServer(DatasetConfig(kind="uniform", capacity=4))
    for i in range(10):
        assert server.put(i, version=i, timeout=0.0) == STORED
    sampled = server.take(4, learner_version=10, timeout=0.0)
    assert server.stats().size == 4 and {f.item for f in sampled} <= {6, 7, 8, 9}


def test_prioritized_replay_samples_in_proportion_to_priority_to_the_alpha():
    """Priorities 1 and 9 with alpha 0.5: weights 1 and 3, so the second is drawn 3/4 of the time."""
    server = DatasetServer(DatasetConfig(kind="prioritized", capacity=2, priority_exponent=0.5), seed=0)
    server.put("low", 0, timeout=0.0)
    server.put("high", 0, timeout=0.0)
    server.update_priorities([0, 1], [1.0, 9.0])
    draws = server.take(2, 0, timeout=0.0)
    counts = {"low": 0, "high": 0}
    for _ in range(2000):
        for fragment in server.take(1, 0, timeout=0.0):
            counts[fragment.item] += 1
    assert len(draws) == 2
    assert counts["high"] / 2000 == pytest.approx(0.75, abs=0.03)


# --- the parameter server ----------------------------------------------------------------------


def _batch(seed: int, streams: int = 3, length: int = 6) -> Experience:
    """Random streams for a 4-input, 3-action actor-critic, the behaviour policy's logp included."""
    rng = np.random.default_rng(seed)
    n = streams * length
    last = np.zeros(n, bool)
    last[length - 1 :: length] = True
    done = last & (rng.random(n) < 0.5)
    return Experience(
        obs=rng.normal(size=(n, 4)).astype(np.float32),
        mask=np.ones((n, 3), bool),
        action=rng.integers(3, size=n),
        reward=rng.normal(size=n).astype(np.float32),
        next_obs=rng.normal(size=(n, 4)).astype(np.float32),
        next_mask=np.ones((n, 3), bool),
        done=done,
        last=last,
        extras={"logp": np.log(rng.uniform(0.2, 0.5, size=n))},
    )


def _trainer() -> IMPALATrainer:
    return IMPALATrainer(4, 3, IMPALAConfig(lr=1e-2, max_grad_norm=0.5))  # a clip that bites, so it is checked too


def _server(strategy: str, **settings) -> ParameterServer:
    master = _trainer()
    return ParameterServer(master, {"policy": master.policy}, StrategyConfig(strategy=strategy, **settings))


def _learn(server: ParameterServer, learner: int, trainer: IMPALATrainer, batch: Experience, version: int):
    """One learner iteration: pull, gradient of the batch's one loss step, push."""
    pulled = server.pull(learner, version)
    if pulled is not None:
        version, weights = pulled
        trainer.policy.set_weights(weights["policy"])
    (step,) = trainer.loss_steps(batch)
    return server.push(learner, version, gradients(trainer.optimized_groups(), step), step.samples)


def test_bsp_with_two_learners_steps_exactly_as_one_learner_on_the_union_of_their_batches():
    server = _server("bsp", learners=2)
    alone = _trainer()
    learners, versions = [_trainer(), _trainer()], [-1, -1]

    def learn(results: list, i: int, batch: Experience, version: int):  # a thread's target: keeps learner i's outcome
        results[i] = _learn(server, i, learners[i], batch, version)

    for round in range(3):  # Adam's moments carry over, so later steps check them too
        batches = [_batch(10 * round), _batch(10 * round + 1, streams=5)]  # unequal sizes: weighted by samples
        results = [None, None]
        threads = [threading.Thread(target=learn, args=(results, i, batches[i], versions[i])) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert [r.applied for r in results] == [True, True] and server.version == round + 1
        versions = [round, round]  # the weights each learner computed with
        alone.update(Experience.concat(batches))
        for name, weight in alone.policy.state_dict().items():
            torch.testing.assert_close(server.learner.policy.state_dict()[name], weight, rtol=1e-5, atol=1e-6)


def test_asp_applies_each_gradient_as_it_arrives():
    server = _server("asp", learners=2)
    alone = _trainer()
    learners = [_trainer(), _trainer()]
    for k in range(4):
        assert _learn(server, k % 2, learners[k % 2], _batch(k), version=-1).version == k + 1
        alone.update(_batch(k))
    for name, weight in alone.policy.state_dict().items():
        torch.testing.assert_close(server.learner.policy.state_dict()[name], weight)


@pytest.mark.parametrize("staleness", [0, 2])
def test_bap_never_lets_a_learner_get_more_than_its_staleness_ahead_of_a_slow_one(staleness):
    server = _server("bap", learners=3, staleness=staleness, iteration_timeout=30.0)
    leads, lock = [], threading.Lock()

    def learn(learner: int, iterations: int, pause: float):
        trainer, version = _trainer(), -1
        for k in range(iterations):
            time.sleep(pause)
            result = _learn(server, learner, trainer, _batch(k), version)
            version = result.version
            with lock:
                clocks = server.stats().clocks
                leads.append(max(clocks) - min(clocks))

    threads = [threading.Thread(target=learn, args=(i, 8, 0.03 if i == 2 else 0.0)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    stats = server.stats()
    assert stats.clocks == [8, 8, 8] and stats.applied == 24 and stats.dropped == 0
    assert stats.max_lead == staleness  # the fast learners did run ahead, as far as allowed
    assert max(leads) <= staleness + 1  # clocks seen between pushes: one push past the bound at most
    assert stats.push_seconds > 0.03


def test_a_learner_that_stops_pushing_holds_up_bsp_and_bap_only_for_the_iteration_timeout():
    for strategy in ("bsp", "bap"):
        server = _server(strategy, learners=2, staleness=0, iteration_timeout=0.2)
        gone, alive = _trainer(), _trainer()
        server.pull(1, -1)  # learner 1 starts an iteration and never pushes
        started = time.monotonic()
        for k in range(3):
            assert _learn(server, 0, alive, _batch(k), version=server.version).applied
        assert time.monotonic() - started < 5.0
        (step,) = gone.loss_steps(_batch(9))  # computed on version 0's weights, pushed late
        late = server.push(1, 0, gradients(gone.optimized_groups(), step), step.samples)
        assert not late.applied and late.why in {"stale", "interrupted"}, strategy
