"""Environments that step all their copies in one call (`BatchedEnv`), such as VMAS's.

A `MultiAgentEnv` is one copy, stepped by a Python call per copy. A batched environment holds
`num_envs` copies as arrays and steps them together: one call takes every agent's actions for
every copy and returns every copy's observations and rewards, so the rollout engine's fragments
(`marl_core.rollout.joint.BatchedStream`) cost one environment call per joint step, not one per
copy. Only simultaneous environments are batched: every agent acts in every copy at every step,
so a step's observations are whole [num_envs, size] arrays.

A copy whose episode ended stays ended (its observations are the episode's last ones) until
`reset_ended` starts its next episode; the caller records the ending first.
"""

from __future__ import annotations

import abc
import dataclasses

import numpy as np

from marl_core.envs.api import AgentID, EnvSpec


@dataclasses.dataclass
class BatchedStep:
    """Every copy after one joint step: arrays over copies, keyed by agent."""

    observations: dict[AgentID, np.ndarray]  # [num_envs, observation_size]
    rewards: np.ndarray  # [num_envs, agents] in `spec.agents` order
    terminated: np.ndarray  # [num_envs] bool: the episode ended by the environment's rule
    truncated: np.ndarray  # [num_envs] bool: it ended by its step limit

    @property
    def ended(self) -> np.ndarray:
        return self.terminated | self.truncated


class BatchedEnv(abc.ABC):
    """`num_envs` copies of one simultaneous environment, stepped together. Every action of the
    action space is legal in every state (no masks; continuous ones are clipped into their box)."""

    spec: EnvSpec
    num_envs: int

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> dict[AgentID, np.ndarray]:
        """Start every copy's episode; returns each agent's observations [num_envs, size]."""

    @abc.abstractmethod
    def step(self, actions: dict[AgentID, np.ndarray]) -> BatchedStep:
        """One action per agent and copy ([num_envs] integers each, or [num_envs, size] floats for
        an agent of `spec.action_boxes`), applied to every copy."""

    @abc.abstractmethod
    def reset_ended(self, ended: np.ndarray) -> dict[AgentID, np.ndarray]:
        """Start the next episode of the copies where `ended` [num_envs] is set; returns every
        copy's current observations (the others' unchanged)."""

    def state(self, observations: dict[AgentID, np.ndarray]) -> np.ndarray:
        """The global state of every copy [num_envs, spec.state_size]: every agent's
        observation, concatenated in `spec.agents` order (as `MultiAgentEnv.state`)."""
        return np.concatenate([observations[a] for a in self.spec.agents], axis=1).astype(np.float32, copy=False)

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release what the environment holds."""
