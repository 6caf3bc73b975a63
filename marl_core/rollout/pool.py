"""Where rollout workers live: in this process, or as Ray actors beside a weight-store actor.

Two calls reach the workers: `push` a learner's newest weights to the weight store, and
`collect` a list of requests, dealt round-robin to the workers, which run them in parallel (a
learned response sends one per worker; a sampled evaluation one per profile). No worker ever
waits on the learner per step. A request is answered the same by any worker, so results never
depend on the pool's size.

The store (`marl_core.rollout.weight_store`) also keeps the progress of the run's long work,
counted here as each request's rollouts come back (`marl_core.rollout.progress`).

On Ray the workers reserve no CPU slot (``num_cpus=0`` by default). The learner runs in a task
that holds a slot; on a 2-core machine, workers that each reserved a core would leave no slot
for that task and the run would hang (MALib's PSRO example does).
A worker that dies is restarted by Ray and its request replayed: requests are deterministic
and return whole episodes, so nothing is lost or counted twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

from marl_core.rollout.progress import Progress, Work
from marl_core.rollout.weight_store import WeightStore, WeightStoreClient
from marl_core.rollout.worker import EnvSource, RolloutRequest, RolloutResult, RolloutWorker, StreamSummary


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    env: EnvSource
    workers: int
    envs_per_worker: int
    worker_cpus: float = 0.0


class WorkerPool:
    """The rollout workers of a run and their weight store, in this process or on Ray.

    In this process (`on_ray=False`: tests and the local loops) the workers run one after
    another; a learner and its collector may use the pool from two threads, one `collect` at a
    time. On Ray every worker is an actor and the store a threaded actor; the pool's handles
    pickle, so tasks can drive it.

    Ray workers are dealt round-robin over the cluster's nodes that have CPUs, each pinned softly
    to its node (a restarted worker may go elsewhere if its node is gone). Ray's own placement
    does not spread them: their `num_cpus` is 0 by default, so nothing pushes them off the
    driver's node, and its SPREAD strategy often put both workers of a two-node test cluster on
    one node. Ray also ignores a soft node affinity for an actor that requests no resources at
    all, so each worker requests a token 1 MiB of Ray's `memory` resource (how often each was
    honoured: docs/performance.md, "Figures behind choices in the code"). On one machine every
    worker lands on that machine.
    """

    def __init__(self, config: PoolConfig, on_ray: bool = False, max_restarts: int = 3):
        self.on_ray = on_ray
        if not on_ray:
            self.store = WeightStore()
            self.workers = [
                RolloutWorker(config.env, config.envs_per_worker, self.store) for _ in range(config.workers)
            ]
            self._collecting = threading.Lock()
            return
        import uuid

        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.store_name = store_name = f"weight-store-{uuid.uuid4().hex}"
        # Threads enough that no call waits behind another: every worker's pull, the learners'
        # pushes and the progress readers at once.
        self.store_handle = ray.remote(num_cpus=0, max_concurrency=64)(WeightStore).options(name=store_name).remote()
        self.store = WeightStoreClient(self.store_handle)
        actor = ray.remote(
            num_cpus=config.worker_cpus, memory=1024**2, max_restarts=max_restarts, max_task_retries=max_restarts
        )
        nodes = nodes_with_cpus()
        self.workers = [
            actor(RolloutWorker)
            .options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=True))
            .remote(config.env, config.envs_per_worker, store_name, torch_threads=1)
            for i in range(config.workers)
        ]

    @property
    def size(self) -> int:
        return len(self.workers)

    def push(self, key: str, version: int, weights) -> None:
        self.store.push(key, version, weights)

    def drop(self, key: str) -> None:
        if self.on_ray:
            self.store_handle.drop.remote(key)
        else:
            self.store.drop(key)

    def collect(self, requests: list[RolloutRequest], progress: str | None = None) -> list[RolloutResult]:
        """Request i goes to worker i modulo the pool's size. `progress`: the id of open work
        (`tracking`) that each request's rollouts count towards as it comes back."""
        if not self.on_ray:
            with self._collecting:
                results = []
                for i, request in enumerate(requests):
                    results.append(self.workers[i % self.size].collect(request))
                    self._count(progress, request, results[-1])
                return results
        import ray

        pending = [self.workers[i % self.size].collect.remote(r) for i, r in enumerate(requests)]
        if progress is None:
            return ray.get(pending)
        position = {ref: i for i, ref in enumerate(pending)}
        results: list[RolloutResult | None] = [None] * len(pending)
        while pending:
            (ready,), pending = ray.wait(pending, num_returns=1)
            i = position[ready]
            results[i] = ray.get(ready)
            self._count(progress, requests[i], results[i])
        return results

    def stream(self, requests: list[RolloutRequest], dataset, progress: str | None = None) -> list[StreamSummary]:
        """Worker i plays request i's fragment stream into `dataset` (a `DatasetServer` here, the
        name of its actor on Ray) until the dataset stops taking fragments; one summary per
        worker. `progress`: open work that the streams' joint steps count towards once they end."""
        if self.on_ray:
            import ray

            summaries = ray.get([self.workers[i].stream.remote(r, dataset) for i, r in enumerate(requests)])
        else:
            summaries = self._stream_here(requests, dataset)
        if progress is not None:
            self.store.advance(progress, sum(summary.env_steps for summary in summaries))
        return summaries

    def _stream_here(self, requests: list[RolloutRequest], dataset) -> list[StreamSummary]:
        """Each worker streams from a thread of its own; one that fails closes the dataset, so the
        others stop too, and its error is raised."""

        def play(worker: RolloutWorker, request: RolloutRequest) -> StreamSummary:
            try:
                return worker.stream(request, dataset)
            except BaseException:
                dataset.close()
                raise

        with ThreadPoolExecutor(len(requests), thread_name_prefix="stream") as threads:
            futures = [threads.submit(play, self.workers[i], request) for i, request in enumerate(requests)]
            return [future.result() for future in futures]

    def _count(self, progress: str | None, request: RolloutRequest, result: RolloutResult) -> None:
        """A fragment counts its joint steps (over all copies), whole-episode requests their episodes."""
        if progress is not None:
            self.store.advance(progress, result.env_steps if request.fragment else len(result.episode_returns))

    @contextlib.contextmanager
    def tracking(self, work: Work):
        """`work` is shown in progress for the duration of the block."""
        self.store.begin(work)
        try:
            yield work
        finally:
            self.store.end_work(work.id)

    def progress(self) -> list[Progress]:
        """The open work as it stands now (one call to the store)."""
        return self.store.progress()

    def node_ids(self) -> list[str]:
        """The Ray node of each worker (on Ray)."""
        import ray

        return ray.get([w.node_id.remote() for w in self.workers])

    def close(self) -> None:
        if not self.on_ray:
            for worker in self.workers:
                worker.close()
            return
        import ray

        for handle in [*self.workers, self.store_handle]:
            ray.kill(handle)


def nodes_with_cpus() -> list[str]:
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
    local = WorkerPool(PoolConfig(env, 1, envs_per_worker))
    try:
        yield local
    finally:
        local.close()


def ray_losses() -> tuple[type[BaseException], ...]:
    """Ray's errors for work lost with a process or node: an actor gone (out of restarts, or
    with its node), a lost object, a crashed worker."""
    import ray.exceptions

    return ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.WorkerCrashedError


def is_transient(error: BaseException) -> bool:
    """A failure Ray could not hide (a loss, `ray_losses`, or a dropped connection): a retry may
    succeed. The tasks are retried for exactly these (`tasks/psro_tasks.py`)."""
    return isinstance(error, (*ray_losses(), ConnectionError))
