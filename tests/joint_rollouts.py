"""Fragments of joint steps played by one rollout worker with networks a test holds: what the
MARL tests need to hand a learner a batch, or to watch a network act, without a learner loop.

The workers of a run rebuild each network from its spec and pull its weights from the
weight store; here the worker acts with the test's own network objects, so a test can count
their calls or train them between fragments.
"""

from __future__ import annotations

from marl_core.envs import AgentMapping
from marl_core.rollout.layout import PolicyLayout
from marl_core.rollout.worker import Fragment, LearnerSpec, RolloutRequest, RolloutWorker


class JointRollouts:
    def __init__(self, env, num_envs: int, mapping: AgentMapping, agent_ids: bool = True, seed: int = 0):
        self.worker = RolloutWorker(env, num_envs)
        self.spec = self.worker.spec
        self.mapping, self.agent_ids, self.seed = mapping, agent_ids, seed
        self.layout = PolicyLayout.of(self.spec, mapping, agent_ids)
        self.fragments = 0

    @classmethod
    def of(cls, config) -> JointRollouts:
        """One worker with a MARL config's environment, copies, policies and seed."""
        from marl_core.marl.config import policy_mapping

        return cls(config.env, config.envs_per_worker, policy_mapping(config), config.agent_ids, config.seed)

    def collect(self, policies, steps: int, explore: bool = True):
        """The next `steps` joint steps of every copy: (JointExperience, returns, lengths) of it."""
        learners = {
            policy: LearnerSpec(f"test/{policy}/{id(network)}", _Itself(network))
            for policy, network in policies.items()
        }
        request = RolloutRequest(
            roles=self.mapping,
            learners=learners,
            fragment=Fragment("test", self.fragments, steps),
            seed=(self.seed, self.fragments),
            explore=explore,
            agent_ids=self.agent_ids,
        )
        self.fragments += 1
        result = self.worker.collect(request)
        return result.joint, result.episode_returns, result.episode_lengths

    def close(self) -> None:
        self.worker.close()


class _Itself:
    """A builder that hands the worker the test's network itself, not a copy."""

    def __init__(self, network):
        self.network = network

    def __call__(self, obs_size: int, num_actions: int):
        return self.network
