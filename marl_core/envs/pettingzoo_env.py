"""Any PettingZoo environment as a `MultiAgentEnv`, turn-based (AEC) or parallel.

Observations are flattened with `gymnasium.spaces.flatten` into float32 vectors. Classic games
(tic-tac-toe, chess, ...) observe a dict {"observation", "action_mask"}: the first is the
observation and the second the mask. Other environments may put a mask in
`infos[agent]["action_mask"]`; without one every action is legal.

Rewards follow PettingZoo's own definition: after each raw `env.step`, `env.rewards` holds what
that step gave each agent, and `last()` hands an agent the sum since its previous turn (its
`_cumulative_rewards`). TimeStep.rewards[agent] is the sum of `env.rewards[agent]` over the raw
steps that one of our steps makes (the AEC adapter makes several: see PettingZooAECEnv). Hence
an agent's TimeStep rewards from just after one of its turns up to its next turn add up to what
`last()` would hand it at that turn, and over an episode to what PettingZoo paid it in total.
"""

from __future__ import annotations

import dataclasses

import gymnasium
import numpy as np
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import aec_to_parallel_wrapper, parallel_to_aec_wrapper
from pettingzoo.utils.wrappers import AssertOutOfBoundsWrapper, BaseWrapper, OrderEnforcingWrapper

from marl_core.envs.api import AgentID, EnvSpec, MultiAgentEnv, TimeStep, check_actions, check_rewards


@dataclasses.dataclass(frozen=True)
class _AgentSpaces:
    """How one agent's raw observations become our observation vector and action mask."""

    observation: gymnasium.Space  # the space flattened into the observation vector
    mask_in_observation: bool  # the raw observation is a dict {"observation", "action_mask"}
    num_actions: int

    @classmethod
    def of(cls, env_name: str, agent: AgentID, observation_space, action_space) -> _AgentSpaces:
        if not isinstance(action_space, gymnasium.spaces.Discrete):
            raise ValueError(f"{env_name}: agent {agent!r} has action space {action_space}; only Discrete is supported")
        keys = set(observation_space.spaces) if isinstance(observation_space, gymnasium.spaces.Dict) else set()
        mask_in_observation = {"observation", "action_mask"} <= keys
        space = observation_space["observation"] if mask_in_observation else observation_space
        return cls(space, mask_in_observation, int(action_space.n))

    def read(self, raw_observation, info: dict) -> tuple[np.ndarray, np.ndarray]:
        """The flat float32 observation and the bool action mask."""
        if self.mask_in_observation:
            mask = raw_observation["action_mask"]
            raw_observation = raw_observation["observation"]
        else:
            mask = info.get("action_mask")
        observation = np.asarray(gymnasium.spaces.flatten(self.observation, raw_observation), dtype=np.float32)
        mask = np.ones(self.num_actions, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        return observation, mask


def _own_state_size(env: AECEnv | ParallelEnv) -> int:
    """The length of the environment's own flat global state; 0 if it defines none."""
    try:
        space = env.state_space
    except AttributeError:
        return 0
    return gymnasium.spaces.flatdim(space)


def _spec(env_name: str, env: AECEnv | ParallelEnv, simultaneous: bool) -> tuple[EnvSpec, dict[AgentID, _AgentSpaces]]:
    agents = tuple(env.possible_agents)
    spaces = {a: _AgentSpaces.of(env_name, a, env.observation_space(a), env.action_space(a)) for a in agents}
    spec = EnvSpec(
        name=env_name,
        agents=agents,
        observation_size={a: gymnasium.spaces.flatdim(s.observation) for a, s in spaces.items()},
        num_actions={a: s.num_actions for a, s in spaces.items()},
        simultaneous=simultaneous,
        state_size=_own_state_size(env),
    )
    return spec, spaces


class PettingZooAECEnv(MultiAgentEnv):
    """A turn-based PettingZoo env: the acting agent is `agent_selection`.

    PettingZoo makes every terminated or truncated agent take one more `step(None)` before it
    leaves; the adapter does those steps itself, so agents only ever see live turns. Their
    rewards (usually none) go into the TimeStep of the step that led to them.
    """

    def __init__(self, env: AECEnv):
        self.env = env
        self.spec, self._spaces = _spec(str(env.unwrapped), env, simultaneous=False)
        self._has_own_state = _own_state_size(env) > 0
        self._masks: dict[AgentID, np.ndarray] = {}
        self._terminations: dict[AgentID, bool] = {}  # every agent of the episode, kept after it leaves
        self._truncations: dict[AgentID, bool] = {}
        self._steps = 0

    def reset(self, seed: int | None = None) -> TimeStep:
        self.env.reset(seed=seed)
        self._terminations = dict.fromkeys(self.env.agents, False)
        self._truncations = dict.fromkeys(self.env.agents, False)
        self._steps = 0
        infos = dict(self.env.infos)
        self._step_dead_agents({}, infos)
        return self._timestep(dict.fromkeys(self._terminations, 0.0), infos)

    def step(self, actions: dict[AgentID, int]) -> TimeStep:
        check_actions(self.spec.name, self._masks, actions)
        self._steps += 1
        rewards = dict.fromkeys(self._terminations, 0.0)
        infos: dict[AgentID, dict] = {}
        (action,) = actions.values()
        self._raw_step(int(action), rewards, infos)
        self._step_dead_agents(rewards, infos)
        check_rewards(self.spec.name, self._steps, rewards)
        return self._timestep(rewards, infos)

    def state(self) -> np.ndarray:
        if self._has_own_state:
            return np.asarray(self.env.state(), dtype=np.float32).reshape(-1)
        return super().state()

    def close(self) -> None:
        self.env.close()

    def _raw_step(self, action: int | None, rewards: dict[AgentID, float], infos: dict[AgentID, dict]) -> None:
        """One PettingZoo step; adds its rewards and records who is still in the game."""
        env = self.env
        env.step(action)
        for agent, reward in env.rewards.items():
            rewards[agent] = rewards.get(agent, 0.0) + float(reward)
        for agent in env.agents:
            self._terminations[agent] = bool(env.terminations[agent])
            self._truncations[agent] = bool(env.truncations[agent])
        infos.update(env.infos)  # keeps the last infos of agents that have left

    def _step_dead_agents(self, rewards: dict[AgentID, float], infos: dict[AgentID, dict]) -> None:
        env = self.env
        while env.agents and (env.terminations[env.agent_selection] or env.truncations[env.agent_selection]):
            self._raw_step(None, rewards, infos)

    def _timestep(self, rewards: dict[AgentID, float], infos: dict[AgentID, dict]) -> TimeStep:
        observations, masks = {}, {}
        if self.env.agents:
            agent = self.env.agent_selection
            raw_observation = self.env.observe(agent)
            observations[agent], masks[agent] = self._spaces[agent].read(raw_observation, self.env.infos[agent])
        self._masks = masks
        self._last = TimeStep(observations, masks, rewards, dict(self._terminations), dict(self._truncations), infos)
        return self._last


# PettingZoo wrappers that only check how the environment is called, never change what it does.
_CHECKING_WRAPPERS = (OrderEnforcingWrapper, AssertOutOfBoundsWrapper)


def without_checking_wrappers(env: ParallelEnv) -> ParallelEnv:
    """A parallel env converted from an AEC env (`parallel_wrapper_fn`, as MPE's `parallel_env()`)
    rebuilt on the raw AEC env when every wrapper in between only checks: the adapter itself checks
    each action against the agent's mask (`check_actions`) and calls reset and step in order, and
    the checks' attribute forwarding costs a large share of an MPE step. A parallel env that
    PettingZoo converted to AEC and back (Atari's `parallel_env()`) is unwrapped to itself.
    Anything else is returned as it is."""
    if not isinstance(env, aec_to_parallel_wrapper):
        return env
    inner = env.aec_env
    while isinstance(inner, _CHECKING_WRAPPERS):
        inner = inner.env
    if isinstance(inner, parallel_to_aec_wrapper):
        return inner.env
    if inner is env.aec_env or isinstance(inner, BaseWrapper):
        return env
    return aec_to_parallel_wrapper(inner)


class PettingZooParallelEnv(MultiAgentEnv):
    """A parallel PettingZoo env: every live agent acts in every step."""

    def __init__(self, env: ParallelEnv):
        self.env = env = without_checking_wrappers(env)
        self.spec, self._spaces = _spec(str(env.unwrapped), env, simultaneous=True)
        self._has_own_state = _own_state_size(env) > 0
        self._masks: dict[AgentID, np.ndarray] = {}
        self._terminations: dict[AgentID, bool] = {}
        self._truncations: dict[AgentID, bool] = {}
        self._steps = 0

    def reset(self, seed: int | None = None) -> TimeStep:
        observations, infos = self.env.reset(seed=seed)
        self._terminations = dict.fromkeys(self.env.agents, False)
        self._truncations = dict.fromkeys(self.env.agents, False)
        self._steps = 0
        return self._timestep(observations, dict.fromkeys(self._terminations, 0.0), infos)

    def step(self, actions: dict[AgentID, int]) -> TimeStep:
        check_actions(self.spec.name, self._masks, actions)
        self._steps += 1
        observations, raw_rewards, terminations, truncations, infos = self.env.step(
            {agent: int(action) for agent, action in actions.items()}
        )
        self._terminations.update((agent, bool(done)) for agent, done in terminations.items())
        self._truncations.update((agent, bool(done)) for agent, done in truncations.items())
        rewards = dict.fromkeys(self._terminations, 0.0)
        rewards.update((agent, float(reward)) for agent, reward in raw_rewards.items())
        check_rewards(self.spec.name, self._steps, rewards)
        return self._timestep(observations, rewards, infos)

    def state(self) -> np.ndarray:
        if self._has_own_state:
            return np.asarray(self.env.state(), dtype=np.float32).reshape(-1)
        return super().state()

    def close(self) -> None:
        self.env.close()

    def _timestep(self, raw_observations: dict, rewards: dict[AgentID, float], infos: dict) -> TimeStep:
        observations, masks = {}, {}
        infos = dict(infos)
        for agent in raw_observations:  # the live agents, and those that left in this step
            if self._terminations.get(agent):
                continue
            observation, mask = self._spaces[agent].read(raw_observations[agent], infos.get(agent, {}))
            if self._truncations.get(agent):  # cut by a time limit: learners bootstrap from this
                infos[agent] = {**infos.get(agent, {}), "final_observation": observation}
                continue
            observations[agent], masks[agent] = observation, mask
        self._masks = masks
        self._last = TimeStep(observations, masks, rewards, dict(self._terminations), dict(self._truncations), infos)
        return self._last
