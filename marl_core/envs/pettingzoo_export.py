"""Any `MultiAgentEnv` as a PettingZoo AEC environment, for tools that speak PettingZoo.

Observations are Box(-inf, inf, float32) vectors and actions Discrete. The acting agent's mask
is `infos[agent]["action_mask"]` (int8, as `Discrete.sample(mask=...)` wants). PettingZoo asks
for an observation of any agent at any time, while our TimeSteps only observe the agents that
act: `observe` returns the agent's latest observation (zeros before its first turn).

When several agents act in one step (a simultaneous game), PettingZoo's turn order collects
their actions one by one and the wrapped environment steps once all are in, as PettingZoo's own
parallel-to-AEC conversion does.
"""

from __future__ import annotations

import gymnasium
import numpy as np
from pettingzoo import AECEnv

from marl_core.envs.api import AgentID, MultiAgentEnv, TimeStep


def to_pettingzoo(env: MultiAgentEnv) -> AECEnv:
    return _ExportedAECEnv(env)


class _ExportedAECEnv(AECEnv):
    def __init__(self, env: MultiAgentEnv):
        super().__init__()
        self.env = env
        spec = env.spec
        if spec.action_boxes:
            raise ValueError(f"{spec.name} has continuous actions; to_pettingzoo exports discrete actions only")
        self.metadata = {"name": spec.name, "render_modes": [], "is_parallelizable": False}
        self.possible_agents = list(spec.agents)
        self.observation_spaces = {
            a: gymnasium.spaces.Box(-np.inf, np.inf, (spec.observation_size[a],), np.float32) for a in spec.agents
        }
        self.action_spaces = {a: gymnasium.spaces.Discrete(spec.num_actions[a]) for a in spec.agents}

    def observation_space(self, agent: AgentID) -> gymnasium.spaces.Box:
        return self.observation_spaces[agent]

    def action_space(self, agent: AgentID) -> gymnasium.spaces.Discrete:
        return self.action_spaces[agent]

    def observe(self, agent: AgentID) -> np.ndarray:
        return self._observations[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        step = self.env.reset(seed)
        self.agents = list(step.rewards)  # the agents of this episode
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {} for agent in self.agents}
        self._observations = {a: np.zeros(self.observation_spaces[a].shape, np.float32) for a in self.agents}
        self._absorb(step)

    def step(self, action: int | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._remove_dead(agent, action)
            return
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        self._pending[agent] = int(action)
        if len(self._pending) == len(self._acting):
            self._absorb(self.env.step(self._pending))
        else:
            self._select_next()

    def close(self) -> None:
        self.env.close()

    def _absorb(self, step: TimeStep) -> None:
        """Take in a TimeStep from the wrapped environment and choose who moves next."""
        self._acting = step.acting
        self._pending: dict[AgentID, int] = {}
        for agent in self.agents:
            self.rewards[agent] = float(step.rewards.get(agent, 0.0))
            self.terminations[agent] = bool(step.terminations.get(agent, False))
            self.truncations[agent] = bool(step.truncations.get(agent, False))
            self.infos[agent] = dict(step.infos.get(agent, {}))
        for agent in self._acting:
            self.infos[agent]["action_mask"] = step.action_masks[agent].astype(np.int8)
        self._observations.update(step.observations)
        self._accumulate_rewards()
        self._select_next()

    def _remove_dead(self, agent: AgentID, action: int | None) -> None:
        """PettingZoo's last step of a finished agent: it takes None and leaves."""
        if action is not None:
            raise ValueError(f"agent {agent!r} is done; its only valid action is None")
        for table in (self.rewards, self._cumulative_rewards, self.terminations, self.truncations, self.infos):
            del table[agent]
        self.agents.remove(agent)
        self._clear_rewards()
        if self.agents:
            self._select_next()

    def _select_next(self) -> None:
        """Finished agents step out first (PettingZoo's rule), then acting agents not yet moved."""
        dead = [a for a in self.agents if self.terminations[a] or self.truncations[a]]
        waiting = [a for a in self._acting if a not in self._pending]
        self.agent_selection = (dead or waiting)[0]
