"""Which policy each agent acts with, and the input and output sizes of each policy.

Agents mapped to one policy id share that policy (parameter sharing). A network shared by
several agents cannot tell them apart from their observations alone in general, so with
`agent_ids` each one sees its observation followed by a one-hot of its index among the agents
of its policy; rollout workers record what the policy saw, so a learner recomputes exactly
what acted. A policy's agents share its actions too: the same number of discrete ones, or the
same box of continuous ones (`action_boxes`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from marl_core.envs import AgentID, Box, EnvSpec
from marl_core.envs.agent_mapping import AgentMapping, group_by_policy


@dataclasses.dataclass(frozen=True)
class PolicyLayout:
    agents: tuple[AgentID, ...]
    policy_of: dict[AgentID, str]
    groups: dict[str, tuple[AgentID, ...]]  # policy -> its agents, in environment order
    obs_size: dict[str, int]  # policy -> input size (agent one-hot included)
    num_actions: dict[str, int]
    agent_ids: bool
    action_boxes: dict[str, Box]  # the policies whose actions are continuous

    @classmethod
    def of(cls, spec: EnvSpec, mapping: AgentMapping, agent_ids: bool) -> PolicyLayout:
        groups = {policy: tuple(agents) for policy, agents in group_by_policy(spec.agents, mapping).items()}
        obs_size, num_actions, action_boxes = {}, {}, {}
        for policy, agents in groups.items():
            sizes = {(spec.observation_size[a], spec.num_actions[a], spec.action_boxes.get(a)) for a in agents}
            if len(sizes) > 1:
                shapes = {a: (spec.observation_size[a], spec.num_actions[a] or spec.action_boxes[a]) for a in agents}
                raise ValueError(
                    f"{spec.name}: agents {list(agents)} share policy {policy!r} but differ in (observation size, "
                    f"actions): {shapes}; map them to separate policies"
                )
            ((size, actions, box),) = sizes
            obs_size[policy] = size + (len(agents) if agent_ids and len(agents) > 1 else 0)
            num_actions[policy] = actions
            if box is not None:
                action_boxes[policy] = box
        policy_of = {a: p for p, agents in groups.items() for a in agents}
        return cls(spec.agents, policy_of, groups, obs_size, num_actions, agent_ids, action_boxes)

    def one_hot(self, agent: AgentID) -> np.ndarray | None:
        """What this agent's observation is extended with, if anything."""
        group = self.groups[self.policy_of[agent]]
        if not self.agent_ids or len(group) == 1:
            return None
        return np.eye(len(group), dtype=np.float32)[group.index(agent)]
