"""The one multi-agent environment interface that rollouts, learners and evaluators code against.

Every source of games (OpenSpiel, PettingZoo, Gymnasium) is adapted to `MultiAgentEnv`, whose
`step` takes a dict of actions and returns a `TimeStep`. The design follows PettingZoo's
agent-keyed dicts, but with one rule that covers turn-based and simultaneous games alike: a
TimeStep carries observations and action masks for exactly the agents that must act next, and the
next `step` takes one action from each of them. Observations are flat vectors so one network
shape fits every adapter: float32, except pixels, which stay uint8 (`EnvSpec.observation_dtype`)
so that experience of them is a quarter of the bytes; networks and learners read them as floats.

Actions are discrete (an index below `EnvSpec.num_actions`, legal where the mask says so) or,
for the agents of `EnvSpec.action_boxes`, continuous: a float32 vector of the `Box`'s size, which
the environment clips into the box (as Gymnasium's `ClipAction`, which CleanRL's continuous PPO
wraps its environments in). So a policy hands over its raw sample and the learner's ratio is of
exactly what was recorded. Such an agent has no discrete actions (`num_actions` 0) and masks of
width 0: every code path that shapes masks by `num_actions` stays one path.

Centralized learners (MAPPO's critic, QMIX's mixer) also need the *global state*: `state()`
returns it where the environment defines one (PettingZoo's `state()`), else the concatenation of
every agent's current observation (zeros for an agent that observes nothing now); its length is
`EnvSpec.state_size`.

`check_actions` and `check_rewards` hold the contract every adapter enforces, so that a wrong
agent, an illegal action or a NaN reward fails at the environment instead of deep in a learner.
"""

from __future__ import annotations

import abc
import dataclasses
import math

import numpy as np

AgentID = str


@dataclasses.dataclass(frozen=True)
class Box:
    """A continuous action: a vector of `len(low)` floats, entry i within [low[i], high[i]]."""

    low: tuple[float, ...]
    high: tuple[float, ...]

    @property
    def size(self) -> int:
        return len(self.low)


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    name: str
    agents: tuple[AgentID, ...]  # every agent that can ever appear (PettingZoo's possible_agents)
    observation_size: dict[AgentID, int]  # length of each agent's flat float32 observation
    num_actions: dict[AgentID, int]  # discrete actions per agent; masks have this length (0: continuous)
    simultaneous: bool  # True when several agents may act in the same step
    state_size: int = 0  # length of `MultiAgentEnv.state()`; 0: the sum of the observation sizes
    observation_dtype: str = "float32"  # "uint8" for pixels (0..255), which networks read as floats
    action_boxes: dict[AgentID, Box] = dataclasses.field(default_factory=dict)  # agents whose actions are continuous

    def __post_init__(self):
        if not self.state_size:
            object.__setattr__(self, "state_size", sum(self.observation_size[a] for a in self.agents))

    def action_shape(self, agent: AgentID) -> tuple[int, ...]:
        """One action of `agent`: () for a discrete index, (size,) for a continuous vector."""
        box = self.action_boxes.get(agent)
        return () if box is None else (box.size,)

    def action_dtype(self, agent: AgentID) -> type:
        return np.float32 if agent in self.action_boxes else np.int64


@dataclasses.dataclass(slots=True)
class TimeStep:
    """What the environment tells the agents after a reset or a step.

    observations / action_masks: only the agents that must act now, in acting order.
    rewards: the reward each agent received by this transition, for every agent of the episode
        (0.0 where it received none); all 0.0 after reset.
    terminations / truncations: every agent of the episode.
    infos: extra information; every acting agent has an entry (OpenSpiel puts the acting
        player's information-state string under "infostate"), other agents may be absent.
    """

    observations: dict[AgentID, np.ndarray]
    action_masks: dict[AgentID, np.ndarray]
    rewards: dict[AgentID, float]
    terminations: dict[AgentID, bool]
    truncations: dict[AgentID, bool]
    infos: dict[AgentID, dict]

    @property
    def acting(self) -> tuple[AgentID, ...]:
        return tuple(self.observations)

    @property
    def done(self) -> bool:
        """The episode is over: nobody is left to act (every agent terminated or truncated)."""
        return not self.observations


class MultiAgentEnv(abc.ABC):
    """A multi-agent environment with discrete (or, per `spec.action_boxes`, continuous) actions
    and flat float32 observations."""

    spec: EnvSpec

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> TimeStep:
        """Start an episode; seed=None continues the environment's own random stream."""

    @abc.abstractmethod
    def step(self, actions: dict[AgentID, int]) -> TimeStep:
        """Apply one action for each agent of the previous TimeStep.acting, and nothing else.

        Raises ValueError for an action of an agent that is not acting, a missing action, an
        illegal (masked) action, a step after the episode ended, and a non-finite reward.
        """

    def state(self) -> np.ndarray:
        """The global state now, float32 [spec.state_size]: by default every agent's current
        observation, concatenated in `spec.agents` order. Adapters of environments that define a
        state of their own return that instead."""
        observations = self._last.observations if self._last is not None else {}
        return np.concatenate(
            [observations.get(a, np.zeros(self.spec.observation_size[a], np.float32)) for a in self.spec.agents]
        ).astype(np.float32, copy=False)

    _last: TimeStep | None = None  # the latest TimeStep, which adapters keep for the default `state()`

    # Not abstract: an optional hook, which only adapters that wrap something override.
    def close(self) -> None:  # noqa: B027
        """Release what the environment holds; a no-op unless an adapter wraps something."""


def check_actions(
    env_name: str,
    masks: dict[AgentID, np.ndarray],
    actions: dict[AgentID, int | np.ndarray],
    boxes: dict[AgentID, Box] | None = None,
) -> None:
    """Reject actions that do not match the acting agents' masks (the last TimeStep's); an agent
    of `boxes` acts with a finite vector of its box's size instead (clipped into it later)."""
    if actions.keys() != masks.keys():
        if not masks:
            raise ValueError(f"{env_name}: no agent is acting (episode over or not started); call reset()")
        for agent in actions:
            if agent not in masks:
                raise ValueError(f"{env_name}: agent {agent!r} is not acting now; acting: {list(masks)}")
        missing = [agent for agent in masks if agent not in actions]
        raise ValueError(f"{env_name}: no action for acting agent(s) {missing}")
    for agent, action in actions.items():
        if boxes and agent in boxes:
            vector = np.asarray(action)
            if vector.shape != (boxes[agent].size,) or not np.isfinite(vector).all():
                raise ValueError(
                    f"{env_name}: action {action!r} for agent {agent!r} is not {boxes[agent].size} finite numbers"
                )
            continue
        mask = masks[agent]
        if not (isinstance(action, (int, np.integer)) and 0 <= action < len(mask) and mask[action]):
            legal = np.flatnonzero(mask).tolist()
            raise ValueError(f"{env_name}: illegal action {action!r} for agent {agent!r}; legal actions: {legal}")


def check_rewards(env_name: str, step: int, rewards: dict[AgentID, float]) -> None:
    """Stop a NaN or infinite reward at the environment, naming where it came from."""
    for agent, reward in rewards.items():
        if not math.isfinite(reward):
            raise ValueError(
                f"{env_name}: non-finite reward {reward!r} for agent {agent!r} at step {step} of the episode"
            )
