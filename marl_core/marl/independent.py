"""Independent learners (IPPO, IQL, A2C): the single-agent PPO, DQN and A2C, one trainer per policy id.

Each agent treats the others as part of its environment (de Witt et al. 2020 show how far this
goes with PPO). Agents mapped to one policy id pool their transitions into that id's trainer, so
parameter sharing needs nothing more. The acting networks are the trainers' own policies. Of
these trainers only PPO's takes continuous actions (its Gaussian actor, given the policy's box).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from marl_core.marl import MARLAlgorithm
from marl_core.marl.settings import IA2CConfig, IAPPOConfig, IIMPALAConfig, IPPOConfig, IQLConfig
from marl_core.rl import ALGORITHMS
from marl_core.rl.gradient_steps import LossStep, OptimizedGroup
from marl_core.rollout.joint_experience import JointExperience
from marl_core.rollout.layout import PolicyLayout


class IndependentLearner:
    algorithm = ""  # the single-agent algorithm in marl_core.rl.ALGORITHMS
    uses_global_state = False  # each policy learns from its agents' own observations

    def __init__(self, layout: PolicyLayout, state_size: int, config):
        self.layout = layout
        self.config = config
        self.trainers = {policy: self._trainer(policy) for policy in layout.groups}
        self.policies = {policy: trainer.policy for policy, trainer in self.trainers.items()}

    def _trainer(self, policy: str):
        trainer = ALGORITHMS[self.algorithm].trainer
        return trainer(self.layout.obs_size[policy], self.layout.num_actions[policy], self._settings())

    def _settings(self):
        raise NotImplementedError

    def learn(self, batch: JointExperience) -> dict[str, float]:
        metrics = {}
        for policy, trainer in self.trainers.items():
            experience = batch.agent_experience(list(self.layout.groups[policy]))
            for name, value in trainer.learn(experience).items():
                metrics[f"{policy}/{name}"] = value
        return metrics

    def optimized_groups(self) -> list[OptimizedGroup]:
        """Every policy id's optimizer and parameters (`marl_core.rl.gradient_steps`)."""
        return [group for trainer in self.trainers.values() for group in trainer.optimized_groups()]

    def loss_steps(self, batch: JointExperience) -> Iterator[LossStep]:
        """The policy ids' updates side by side: step k adds up each one's k-th loss. Their
        parameters are disjoint, so each still gets the gradient of its own loss; metrics are
        named `<policy>/<metric>` as `learn` names them."""
        steps = {
            policy: trainer.loss_steps(batch.agent_experience(list(self.layout.groups[policy])))
            for policy, trainer in self.trainers.items()
        }
        for side_by_side in itertools.zip_longest(*steps.values()):
            present = [(policy, step) for policy, step in zip(steps, side_by_side) if step is not None]
            yield LossStep(
                loss=sum(step.loss for _, step in present),
                samples=sum(step.samples for _, step in present),
                metrics={f"{policy}/{name}": value for policy, step in present for name, value in step.metrics.items()},
            )

    def state_dict(self) -> dict:
        return {policy: trainer.state_dict() for policy, trainer in self.trainers.items()}

    def load_state_dict(self, state: dict) -> None:
        for policy, trainer in self.trainers.items():
            trainer.load_state_dict(state[policy])


class IndependentPPO(IndependentLearner):
    algorithm = "ppo"

    def _trainer(self, policy: str):
        trainer = ALGORITHMS[self.algorithm].trainer
        layout = self.layout
        return trainer(
            layout.obs_size[policy], layout.num_actions[policy], self._settings(), layout.action_boxes.get(policy)
        )

    def _settings(self):
        return self.config.ppo


class IndependentDQN(IndependentLearner):
    algorithm = "dqn"

    def _settings(self):
        return self.config.dqn


class IndependentIMPALA(IndependentLearner):
    algorithm = "impala"

    def _settings(self):
        return self.config.impala


class IndependentAPPO(IndependentLearner):
    algorithm = "appo"

    def _settings(self):
        return self.config.appo


class IndependentA2C(IndependentLearner):
    algorithm = "a2c"

    def _settings(self):
        return self.config.a2c


IPPO = MARLAlgorithm(IPPOConfig, IndependentPPO)
A2C = MARLAlgorithm(IA2CConfig, IndependentA2C)
IQL = MARLAlgorithm(IQLConfig, IndependentDQN)
IMPALA = MARLAlgorithm(IIMPALAConfig, IndependentIMPALA)
APPO = MARLAlgorithm(IAPPOConfig, IndependentAPPO)
