"""The two-step cooperative matrix game of the QMIX paper (Rashid et al. 2018, section 6.1).

A PettingZoo parallel environment, so it runs through the same adapter as any other:
`make_env("pettingzoo:marl_core.envs.two_step")`. Two agents, two actions each, shared reward:

- step 1 (state 1): agent_0's action picks the next state, A (action 0) or B (action 1); agent_1's
  action does not matter; no reward.
- step 2: in state 2A every joint action pays 7; in state 2B the payoff is
  [[0, 1], [1, 8]] (rows agent_0, columns agent_1). Then the episode ends.

The optimal return is 8 (B, then both pick action 1). A learner whose joint value is a sum of
per-agent utilities (VDN) cannot represent 2B's payoffs well enough to see that, and settles for 7.
Both agents observe the state as a one-hot vector, which is also the global state.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

AGENTS = ("agent_0", "agent_1")
STATE_1, STATE_2A, STATE_2B, END = range(4)
PAYOFF_2A = np.full((2, 2), 7.0)
PAYOFF_2B = np.array([[0.0, 1.0], [1.0, 8.0]])


class TwoStepGame(ParallelEnv):
    metadata = {"name": "two_step_v0", "is_parallelizable": True}

    def __init__(self):
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self._state = STATE_1
        self.state_space = spaces.Box(0.0, 1.0, (3,), np.float32)
        # each agent's spaces, built once: every call returns the same object, as PettingZoo's own
        # environments do by caching theirs
        self._observation_spaces = {agent: spaces.Box(0.0, 1.0, (3,), np.float32) for agent in AGENTS}
        self._action_spaces = {agent: spaces.Discrete(2) for agent in AGENTS}

    def observation_space(self, agent):
        return self._observation_spaces[agent]

    def action_space(self, agent):
        return self._action_spaces[agent]

    def state(self) -> np.ndarray:
        one_hot = np.zeros(3, np.float32)
        if self._state != END:
            one_hot[self._state] = 1.0
        return one_hot

    def reset(self, seed=None, options=None):
        self.agents = list(AGENTS)
        self._state = STATE_1
        return self._observations(), {a: {} for a in self.agents}

    def step(self, actions):
        first, second = int(actions["agent_0"]), int(actions["agent_1"])
        if self._state == STATE_1:
            self._state, reward, over = (STATE_2B if first == 1 else STATE_2A), 0.0, False
        else:
            payoff = PAYOFF_2B if self._state == STATE_2B else PAYOFF_2A
            self._state, reward, over = END, float(payoff[first, second]), True
        observations = self._observations()
        rewards = dict.fromkeys(self.agents, reward)
        terminations = dict.fromkeys(self.agents, over)
        truncations = dict.fromkeys(self.agents, False)
        infos = {a: {} for a in self.agents}
        if over:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def _observations(self) -> dict[str, np.ndarray]:
        return {a: self.state() for a in self.agents}


def parallel_env() -> TwoStepGame:
    return TwoStepGame()
