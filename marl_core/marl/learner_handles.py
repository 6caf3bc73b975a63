"""The learner of a collect-then-learn MARL run as the round's steps reach it: in this process
(`LocalLearner`), or as a Ray actor that keeps its networks, optimizers and buffers for the
whole run (`LearnerActor`, reached through `RayLearner`). An asynchronous run's learners are
`marl_core.marl.async_learners`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Protocol

from marl_core.marl.config import MARLConfig, layout_and_spec, make_learner
from marl_core.marl.learner import learner_specs, publish

if TYPE_CHECKING:
    from marl_core.rollout.joint_experience import JointExperience
    from marl_core.rollout.worker import LearnerSpec


class LearnerHandle(Protocol):
    """The learner as the round's steps reach it: here (`LocalLearner`) or as a Ray actor
    (`RayLearner`). It publishes its acting networks to a pool's weight store, so the workers
    pull the weights once per request and nothing else carries them."""

    def specs(self) -> dict[str, LearnerSpec]: ...

    def publish(self, pool, version: int) -> None: ...

    def learn(self, batch: JointExperience) -> dict[str, float]: ...


class LocalLearner:
    """The learner in this process, learning on `threads` torch threads of its own."""

    def __init__(self, learner, threads: int = 1):
        self.learner = learner
        self.threads = threads
        self._specs = learner_specs(learner)  # a network's architecture never changes

    def specs(self) -> dict[str, LearnerSpec]:
        return self._specs

    def publish(self, pool, version: int) -> None:
        publish(self.learner, pool, version)

    def learn(self, batch: JointExperience) -> dict[str, float]:
        with torch_threads(self.threads):  # the workers of this process wait meanwhile
            return self.learner.learn(batch)


@contextlib.contextmanager
def torch_threads(threads: int):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class LearnerActor:
    """The learner as a Ray actor: it keeps its networks, optimizers and buffers between rounds,
    and publishes its acting networks to the pool's weight store itself. It lives here, not
    beside the flows, so that its process imports no Prefect."""

    def __init__(self, config: MARLConfig, state: dict | None):
        import torch

        torch.set_num_threads(config.learner_threads)
        layout, spec = layout_and_spec(config)
        self.learner = make_learner(config, layout, spec.state_size)
        if state is not None:
            self.learner.load_state_dict(state)

    def adopt(self, config: MARLConfig, state: dict) -> None:
        """Become a learner built from `config` that goes on from another's training `state`,
        its optimizers keeping `config`'s hyperparameters (PBT's exploit, in place)."""
        from marl_core.rl.optimizers import load_keeping_hyperparameters

        layout, spec = layout_and_spec(config)
        self.learner = make_learner(config, layout, spec.state_size)
        load_keeping_hyperparameters(self.learner, state)

    def specs(self):
        return learner_specs(self.learner)

    def publish(self, pool, version: int) -> None:
        publish(self.learner, pool, version)

    def learn(self, batch) -> dict[str, float]:
        return self.learner.learn(batch)

    def state(self) -> dict:
        return self.learner.state_dict()

    def checkpoint(self) -> tuple[dict, dict]:
        """(training state, policy id -> acting weights)."""
        return self.learner.state_dict(), {p: policy.get_weights() for p, policy in self.learner.policies.items()}


class RayLearner:
    """`LearnerHandle` over the learner actor; it pickles, so the round's tasks reach
    the actor. The workers' build specs are read once: a network's architecture never changes."""

    def __init__(self, actor):
        self.actor = actor
        self._specs = _ray_get(actor.specs.remote())

    def specs(self):
        return self._specs

    def publish(self, pool, version: int) -> None:
        _ray_get(self.actor.publish.remote(pool, version))

    def learn(self, batch) -> dict[str, float]:
        return _ray_get(self.actor.learn.remote(batch))


def _ray_get(ref):
    import ray

    return ray.get(ref)
