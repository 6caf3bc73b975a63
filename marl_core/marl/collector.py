"""The MARL rollout: E copies of a simultaneous environment, every agent acting every step.

A `JointCollector` keeps its copies mid-episode between calls (episodes run on across segments,
as in CleanRL's and MAPPO's runners), and each `collect` call returns a fixed number of joint
steps as `JointExperience`, plus the returns of the episodes that finished in it.

Acting is batched by policy: agents that share a policy (parameter sharing) are stacked across
all copies into one forward pass. When several agents share one network it cannot tell them
apart from their observations alone in general, so with `agent_ids=True` each one sees its
observation followed by a one-hot of its index among the agents of its policy; the recorded
observations are what the policy saw, so a learner recomputes exactly what acted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Union

import numpy as np

from marl_core.envs import AgentID, MultiAgentEnv, TimeStep, make_env
from marl_core.envs.agent_mapping import AgentMapping, group_by_policy
from marl_core.marl.batch import JointExperience
from marl_core.rl.policy import NetworkPolicy

EnvSource = Union[str, Callable[[], MultiAgentEnv]]


@dataclasses.dataclass(frozen=True)
class PolicyLayout:
    """Which policy each agent acts with, and the input and output sizes of each policy."""

    agents: tuple[AgentID, ...]
    policy_of: dict[AgentID, str]
    groups: dict[str, tuple[AgentID, ...]]  # policy -> its agents, in environment order
    obs_size: dict[str, int]  # policy -> input size (agent one-hot included)
    num_actions: dict[str, int]
    agent_ids: bool

    @classmethod
    def of(cls, env: MultiAgentEnv, mapping: AgentMapping, agent_ids: bool) -> PolicyLayout:
        spec = env.spec
        groups = {policy: tuple(agents) for policy, agents in group_by_policy(spec.agents, mapping).items()}
        obs_size, num_actions = {}, {}
        for policy, agents in groups.items():
            sizes = {(spec.observation_size[a], spec.num_actions[a]) for a in agents}
            if len(sizes) > 1:
                shapes = {a: (spec.observation_size[a], spec.num_actions[a]) for a in agents}
                raise ValueError(
                    f"{spec.name}: agents {list(agents)} share policy {policy!r} but differ in (observation size, "
                    f"actions): {shapes}; map them to separate policies"
                )
            ((size, actions),) = sizes
            obs_size[policy] = size + (len(agents) if agent_ids and len(agents) > 1 else 0)
            num_actions[policy] = actions
        policy_of = {a: p for p, agents in groups.items() for a in agents}
        return cls(spec.agents, policy_of, groups, obs_size, num_actions, agent_ids)

    def one_hot(self, agent: AgentID) -> np.ndarray | None:
        """What this agent's observation is extended with, if anything."""
        group = self.groups[self.policy_of[agent]]
        if not self.agent_ids or len(group) == 1:
            return None
        return np.eye(len(group), dtype=np.float32)[group.index(agent)]


class JointCollector:
    def __init__(self, env: EnvSource, num_envs: int, mapping: AgentMapping, agent_ids: bool = True, seed: int = 0):
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        make = (lambda: make_env(env)) if isinstance(env, str) else env
        self.envs = [make() for _ in range(num_envs)]
        self.spec = self.envs[0].spec
        if not self.spec.simultaneous:
            raise ValueError(
                f"{self.spec.name} is turn-based; MARL training needs a simultaneous environment "
                "(a PettingZoo parallel_env) in which every agent acts every step"
            )
        self.layout = PolicyLayout.of(self.envs[0], mapping, agent_ids)
        self.generator = np.random.default_rng(seed)
        self._steps = [self._checked(env.reset(seed=seed + i), env) for i, env in enumerate(self.envs)]
        self._states = [env.state() for env in self.envs]
        self._returns = np.zeros((num_envs, len(self.spec.agents)))
        self._lengths = np.zeros(num_envs, dtype=np.int64)

    def _checked(self, step: TimeStep, env: MultiAgentEnv) -> TimeStep:
        if not step.done and step.acting != self.spec.agents:
            raise ValueError(
                f"{self.spec.name}: MARL training needs every agent to act every step; "
                f"acting now: {list(step.acting)}, agents: {list(self.spec.agents)}"
            )
        return step

    def _observation(self, agent: AgentID, raw: np.ndarray) -> np.ndarray:
        one_hot = self.layout.one_hot(agent)
        return raw if one_hot is None else np.concatenate([raw, one_hot])

    def collect(
        self, policies: Mapping[str, NetworkPolicy], steps: int, explore: bool = True
    ) -> tuple[JointExperience, np.ndarray, np.ndarray]:
        """`steps` joint steps of every copy. Returns the batch, the summed rewards of each episode
        that finished during it ([K, agents], agents in spec order) and their lengths [K]."""
        batch, returns, lengths, _ = self._run(policies, steps, explore, self.generator)
        return batch, returns, lengths

    def play_episodes(self, policies: Mapping[str, NetworkPolicy], episodes: int, seed: int, explore: bool = False) -> np.ndarray:
        """Summed rewards [episodes, agents] of `episodes` whole episodes from fresh resets.

        Each copy plays an equal share and episodes beyond a copy's share are dropped: which
        episodes count never depends on their outcome or length, so the mean is unbiased. The
        same seed plays the same episodes.
        """
        generator = np.random.default_rng(seed)
        for i, env in enumerate(self.envs):
            self._steps[i] = self._checked(env.reset(seed=seed + i), env)
            self._states[i] = env.state()
        self._returns[:] = 0.0
        self._lengths[:] = 0
        quota = [len(share) for share in np.array_split(np.arange(episodes), len(self.envs))]
        done: list[list[np.ndarray]] = [[] for _ in self.envs]
        while any(len(d) < q for d, q in zip(done, quota)):
            _, returns, _, envs = self._run(policies, 32, explore, generator)
            for row, e in zip(returns, envs):
                if len(done[e]) < quota[e]:
                    done[e].append(row)
        return np.array([row for rows in done for row in rows]).reshape(-1, len(self.spec.agents))

    def _run(self, policies, steps, explore, generator):
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        layout, spec = self.layout, self.spec
        missing = sorted(set(layout.groups) - set(policies))
        if missing:
            raise ValueError(f"no policy for {missing}; the agents act with {sorted(layout.groups)}")
        E, agents = len(self.envs), spec.agents
        record = _Recorder(steps, E, layout, spec.state_size)
        finished_returns, finished_lengths, finished_envs = [], [], []
        for t in range(steps):
            obs = {a: np.stack([self._observation(a, s.observations[a]) for s in self._steps]) for a in agents}
            mask = {a: np.stack([s.action_masks[a] for s in self._steps]) for a in agents}
            state = np.stack(self._states)
            actions, extras = {}, {}
            for policy_id, group in layout.groups.items():  # one forward pass per policy
                stacked_obs = np.concatenate([obs[a] for a in group])
                stacked_mask = np.concatenate([mask[a] for a in group])
                chosen, policy_extras = policies[policy_id].act(stacked_obs, stacked_mask, explore, generator)
                for k, a in enumerate(group):
                    actions[a] = chosen[k * E:(k + 1) * E]
                    extras[a] = {key: value[k * E:(k + 1) * E] for key, value in policy_extras.items()}
            for e, env in enumerate(self.envs):
                step = env.step({a: int(actions[a][e]) for a in agents})
                next_state = env.state()
                rewards = np.array([step.rewards.get(a, 0.0) for a in agents])
                self._returns[e] += rewards
                self._lengths[e] += 1
                terminated = step.done and any(step.terminations.values())
                truncated = step.done and not terminated
                record.step(t, e, step, rewards, next_state, terminated, truncated, self._observation)
                if step.done:
                    finished_returns.append(self._returns[e].copy())
                    finished_lengths.append(self._lengths[e])
                    finished_envs.append(e)
                    self._returns[e] = 0.0
                    self._lengths[e] = 0
                    step = self._checked(env.reset(), env)
                    next_state = env.state()
                else:
                    self._checked(step, env)
                self._steps[e], self._states[e] = step, next_state
            record.acted(t, obs, mask, state, actions, extras)
        returns = np.array(finished_returns).reshape(-1, len(agents))
        return record.batch(), returns, np.array(finished_lengths, dtype=np.int64), finished_envs

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _Recorder:
    """Preallocated [T, E] arrays that one segment fills row by row."""

    def __init__(self, steps: int, envs: int, layout: PolicyLayout, state_size: int):
        self.layout = layout
        shape = (steps, envs)
        size = {a: layout.obs_size[layout.policy_of[a]] for a in layout.agents}
        actions = {a: layout.num_actions[layout.policy_of[a]] for a in layout.agents}
        self.obs = {a: np.zeros((*shape, size[a]), np.float32) for a in layout.agents}
        self.mask = {a: np.zeros((*shape, actions[a]), np.bool_) for a in layout.agents}
        self.action = {a: np.zeros(shape, np.int64) for a in layout.agents}
        self.reward = {a: np.zeros(shape, np.float32) for a in layout.agents}
        self.next_obs = {a: np.zeros((*shape, size[a]), np.float32) for a in layout.agents}
        self.next_mask = {a: np.zeros((*shape, actions[a]), np.bool_) for a in layout.agents}
        self.state = np.zeros((*shape, state_size), np.float32)
        self.next_state = np.zeros((*shape, state_size), np.float32)
        self.terminated = np.zeros(shape, np.bool_)
        self.truncated = np.zeros(shape, np.bool_)
        self.extras: dict[AgentID, dict[str, np.ndarray]] = {}

    def step(self, t, e, step: TimeStep, rewards, next_state, terminated, truncated, observation) -> None:
        for i, a in enumerate(self.layout.agents):
            self.reward[a][t, e] = rewards[i]
            raw = step.observations.get(a)
            if raw is None:  # the episode ended: a truncated agent may still hand its final observation
                raw = step.infos.get(a, {}).get("final_observation")
            if raw is not None:
                self.next_obs[a][t, e] = observation(a, raw)
            # A truncated agent's final observation comes without a mask: every action counts as legal.
            self.next_mask[a][t, e] = step.action_masks.get(a, raw is not None)
        self.next_state[t, e] = next_state
        self.terminated[t, e] = terminated
        self.truncated[t, e] = truncated

    def acted(self, t, obs, mask, state, actions, extras) -> None:
        for a in self.layout.agents:
            self.obs[a][t] = obs[a]
            self.mask[a][t] = mask[a]
            self.action[a][t] = actions[a]
            for key, value in extras[a].items():
                self.extras.setdefault(a, {}).setdefault(key, np.zeros(self.terminated.shape, value.dtype))[t] = value
        self.state[t] = state

    def batch(self) -> JointExperience:
        return JointExperience(
            agents=self.layout.agents, obs=self.obs, mask=self.mask, action=self.action, reward=self.reward,
            next_obs=self.next_obs, next_mask=self.next_mask, state=self.state, next_state=self.next_state,
            terminated=self.terminated, truncated=self.truncated, extras=self.extras,
        )
