"""Where rollout workers live: in this process, or as Ray actors beside a parameter-store actor.

The learner talks to a pool through two calls: `push` its newest weights to the parameter
store, and `collect` a list of requests, dealt round-robin to the workers, which run them in
parallel (a learner sends one per worker; a sampled evaluation one per profile). The learner
never waits on a worker per step, and a worker never waits on the learner per step. A request
is answered the same by any worker, so results never depend on the pool's size.

On Ray the workers reserve no CPU slot (``num_cpus=0`` by default). The learner that drives
them runs in a task that holds a slot; on a 2-core machine, workers that each reserved a core
would leave no slot for that task and the run would hang (MALib's PSRO example does).
A worker that dies is restarted by Ray and its request replayed: requests are deterministic
and return whole episodes, so nothing is lost or counted twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from marl_core.rollout.worker import EnvSource, RolloutRequest, RolloutResult, RolloutWorker


class ParameterStore:
    """The newest weights of each learner, by key, with a version number."""

    def __init__(self):
        self._weights: dict[str, tuple[int, Any]] = {}

    def push(self, key: str, version: int, weights) -> None:
        self._weights[key] = (version, weights)

    def pull(self, key: str, have_version: int) -> tuple[int, Any] | None:
        """The stored weights if newer than the caller's, else None (nothing is copied)."""
        stored = self._weights.get(key)
        if stored is None or stored[0] <= have_version:
            return None
        return stored

    def drop(self, key: str) -> None:
        self._weights.pop(key, None)


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    env: EnvSource
    workers: int
    envs_per_worker: int
    worker_cpus: float = 0.0


class LocalWorkerPool:
    """Workers in this process, run one after another: for tests and the local loop."""

    def __init__(self, config: PoolConfig):
        self.store = ParameterStore()
        self.workers = [RolloutWorker(config.env, config.envs_per_worker, self.store) for _ in range(config.workers)]

    @property
    def size(self) -> int:
        return len(self.workers)

    def push(self, key: str, version: int, weights) -> None:
        self.store.push(key, version, weights)

    def drop(self, key: str) -> None:
        self.store.drop(key)

    def collect(self, requests: list[RolloutRequest]) -> list[RolloutResult]:
        return [self.workers[i % self.size].collect(r) for i, r in enumerate(requests)]

    def close(self) -> None:
        pass


class _StoreClient:
    """A worker's view of the store actor: same methods as `ParameterStore`, over Ray.

    Workers find the store by name rather than receiving its handle: Ray keeps a handle passed
    to a constructor in the object store, and a restarted worker could lose it.
    """

    def __init__(self, store_name: str):
        import ray

        self.handle = ray.get_actor(store_name)

    def pull(self, key: str, have_version: int):
        import ray

        return ray.get(self.handle.pull.remote(key, have_version))


class _RayRolloutWorker(RolloutWorker):
    def __init__(self, env: EnvSource, envs_per_worker: int, store_name: str):
        import torch

        torch.set_num_threads(1)  # many small forward passes: threads only contend
        super().__init__(env, envs_per_worker, _StoreClient(store_name))

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        import os

        return os.getpid()


class RayWorkerPool:
    """Rollout workers as Ray actors; handles pickle, so learner tasks can drive the pool.

    Workers are dealt round-robin over the cluster's nodes that have CPUs, each pinned softly to
    its node (a restarted worker may go elsewhere if its node is gone). Ray's own placement
    does not spread them: their `num_cpus` is 0 by default, so nothing pushes them off the
    driver's node, and its SPREAD strategy put both workers of a two-node test cluster on one
    node in about one run of three. Ray also ignores a soft node affinity for an actor that
    requests no resources at all (honoured in 5 of 10 placements here), so each worker
    requests a token 1 MiB of Ray's `memory` resource (10 of 10). On one machine every worker
    lands on that machine.
    """

    def __init__(self, config: PoolConfig, max_restarts: int = 3):
        import uuid

        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        store_name = f"parameter-store-{uuid.uuid4().hex}"
        self.store_handle = ray.remote(num_cpus=0)(ParameterStore).options(name=store_name).remote()
        actor = ray.remote(
            num_cpus=config.worker_cpus, memory=1024**2, max_restarts=max_restarts, max_task_retries=max_restarts
        )
        nodes = _nodes_with_cpus()
        self.workers = [
            actor(_RayRolloutWorker)
            .options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=True))
            .remote(config.env, config.envs_per_worker, store_name)
            for i in range(config.workers)
        ]

    @property
    def size(self) -> int:
        return len(self.workers)

    def push(self, key: str, version: int, weights) -> None:
        import ray

        ray.get(self.store_handle.push.remote(key, version, weights))

    def drop(self, key: str) -> None:
        self.store_handle.drop.remote(key)

    def collect(self, requests: list[RolloutRequest]) -> list[RolloutResult]:
        import ray

        return ray.get([self.workers[i % self.size].collect.remote(r) for i, r in enumerate(requests)])

    def node_ids(self) -> list[str]:
        import ray

        return ray.get([w.node_id.remote() for w in self.workers])

    def close(self) -> None:
        import ray

        for handle in [*self.workers, self.store_handle]:
            ray.kill(handle)


def _nodes_with_cpus() -> list[str]:
    import ray

    nodes = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) > 0)
    return nodes or [ray.get_runtime_context().get_node_id()]


@contextlib.contextmanager
def pool_or_local(pool, env: EnvSource, envs_per_worker: int = 32):
    """`pool` (the run's rollout workers) where there is one, else one worker in this process
    for the duration of the block."""
    if pool is not None:
        yield pool
        return
    local = LocalWorkerPool(PoolConfig(env, 1, envs_per_worker))
    try:
        yield local
    finally:
        local.close()
