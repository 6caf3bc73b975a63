"""The one task-runner adapter: a scenario's steps (`marl_core.runner.Runner`) as Prefect tasks on Ray.

Every scenario wires its step once, over a runner (`marl_core.psro.steps.run_iteration`,
`marl_core.marl.rounds.run_round`, `marl_core.league.generation.run_generation`); in one process
a `LocalRunner` calls the step functions, here each is submitted as the Prefect task of the same
name (`tasks.*.TASKS`) inside the step's subflow, whose task runner puts it on Ray.
"""

from __future__ import annotations

import ray
from prefect.utilities.annotations import opaque

from flows.services.ray_session import result_unless_ray_stops


class RayTaskSteps:
    """The flow's runner: every step is a Prefect task on Ray, all submitted at once.

    Ray starts each task as soon as its inputs exist, so no stage waits for a round trip through
    this process. Tasks get object references: each shared value is put in Ray's object store
    once instead of being pickled into every task that reads it, and marked `opaque` so Prefect
    takes it whole. `tasks`: the step name -> Prefect task table; steps named in
    `driving_actors` only drive actors (rollout workers, learners) and hold no CPU slot.
    """

    def __init__(self, tasks: dict, driving_actors: frozenset[str] = frozenset()):
        self.tasks = tasks
        self.driving_actors = driving_actors

    def share(self, value):
        return opaque(ray.put(value))

    def submit(self, step: str, *args):
        if step in self.driving_actors:
            return self.submit_driving_actors(step, *args)
        return self.tasks[step].submit(*_opaque_futures(args))

    def submit_beside(self, partner, step: str, *args):
        """The step only waits on its partner and on actors, so it holds no CPU slot: it starts
        at once beside its partner however busy the cores are. (Holding one, it would wait until
        Ray lent it the slot of a task blocked in `ray.get`, such as its learner's first wait.)"""
        return self.submit_driving_actors(step, *args)

    def submit_driving_actors(self, step: str, *args):
        """A step whose work is done by actors it waits on holds no CPU slot (see `submit_beside`)."""
        from prefect_ray.context import remote_options

        with remote_options(num_cpus=0):
            return self.tasks[step].submit(*_opaque_futures(args))

    def result(self, future):
        """The task's result, waited for in slices that end when the run stops Ray
        (`flows.services.ray_session.result_unless_ray_stops`)."""
        return result_unless_ray_stops(future)

    def parallelism(self) -> int:
        return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _opaque_futures(args: tuple) -> tuple:
    """Earlier tasks' futures (alone or in a list) wrapped in `opaque`, as `share` wraps what it
    puts in Ray's object store: Prefect resolves them and records them as the task's inputs, but
    does not walk every value inside a population or a table looking for more futures, which it
    otherwise does three times per task (it was a fifth of a worker's time on Leduc)."""
    from prefect.futures import PrefectFuture

    def wrap(value):
        if isinstance(value, PrefectFuture):
            return opaque(value)
        if isinstance(value, list) and value and all(isinstance(item, PrefectFuture) for item in value):
            return [opaque(item) for item in value]
        return value

    return tuple(wrap(arg) for arg in args)
