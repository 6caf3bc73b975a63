"""A single-agent Gymnasium environment as a `MultiAgentEnv` with one agent, "agent_0".

Useful to check a learner on a known task (CartPole) through the same interface it meets in
multi-agent games. Only Discrete action spaces fit the interface; observations are flattened to
float32 and an `info["action_mask"]`, when the environment gives one, becomes the mask.
"""

from __future__ import annotations

import gymnasium
import numpy as np

from marl_core.envs.api import AgentID, EnvSpec, MultiAgentEnv, TimeStep, check_actions, check_rewards

AGENT: AgentID = "agent_0"


class GymnasiumEnv(MultiAgentEnv):
    def __init__(self, env: gymnasium.Env):
        name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
        if not isinstance(env.action_space, gymnasium.spaces.Discrete):
            raise ValueError(
                f"{name}: action space {env.action_space} is not Discrete; only discrete actions are supported"
            )
        self.env = env
        self._action_offset = int(env.action_space.start)  # our actions count from 0, Discrete's from start
        self.spec = EnvSpec(
            name=name,
            agents=(AGENT,),
            observation_size={AGENT: gymnasium.spaces.flatdim(env.observation_space)},
            num_actions={AGENT: int(env.action_space.n)},
            simultaneous=True,  # its one agent acts every step
        )
        self._masks: dict[AgentID, np.ndarray] = {}
        self._steps = 0

    def reset(self, seed: int | None = None) -> TimeStep:
        observation, info = self.env.reset(seed=seed)
        self._steps = 0
        return self._timestep(observation, 0.0, False, False, info)

    def step(self, actions: dict[AgentID, int]) -> TimeStep:
        check_actions(self.spec.name, self._masks, actions)
        self._steps += 1
        observation, reward, terminated, truncated, info = self.env.step(int(actions[AGENT]) + self._action_offset)
        check_rewards(self.spec.name, self._steps, {AGENT: float(reward)})
        return self._timestep(observation, float(reward), bool(terminated), bool(truncated), info)

    def close(self) -> None:
        self.env.close()

    def _timestep(self, observation, reward: float, terminated: bool, truncated: bool, info: dict) -> TimeStep:
        observations, masks = {}, {}
        if not (terminated or truncated):
            flat = gymnasium.spaces.flatten(self.env.observation_space, observation)
            observations[AGENT] = np.asarray(flat, dtype=np.float32)
            mask = info.get("action_mask")
            masks[AGENT] = np.ones(self.spec.num_actions[AGENT], dtype=bool) if mask is None else np.asarray(mask, bool)
        self._masks = masks
        self._last = TimeStep(
            observations, masks, {AGENT: reward}, {AGENT: terminated}, {AGENT: truncated}, {AGENT: info}
        )
        return self._last
