"""A worker's fragment streams: environment copies kept mid-episode between requests, and the
recorder that fills one fragment's `JointExperience` row by row."""

from __future__ import annotations

import dataclasses

import numpy as np

from marl_core.envs import AgentID, MultiAgentEnv, TimeStep
from marl_core.rollout.joint_experience import FollowingObservations, JointExperience


@dataclasses.dataclass
class Stream:
    """Copies of the environment that play one stream's fragments, where the last one left them."""

    envs: list[MultiAgentEnv]
    steps: list[TimeStep]  # what each copy's next actions answer
    states: list[np.ndarray]  # each copy's global state
    draws: list[list[int]]  # per copy, the member drawn per population for its current episode
    returns: np.ndarray  # [E, agents] summed rewards of each copy's current episode
    lengths: np.ndarray  # [E]
    global_state: bool = True  # False: no learner needs the global state; `states` hold empty arrays
    next_index: int = 0

    @classmethod
    def start(cls, envs: list[MultiAgentEnv], mixtures, rng: np.random.Generator, global_state: bool = True) -> Stream:
        """Every copy reset, seeded from `rng` (the fragment's own generator)."""
        steps = [_checked(env.reset(seed=int(rng.integers(2**31))), env) for env in envs]
        agents = envs[0].spec.agents
        stream = cls(
            envs=envs,
            steps=steps,
            states=[],
            draws=[[mixture.draw(rng) for mixture in mixtures] for _ in envs],
            returns=np.zeros((len(envs), len(agents))),
            lengths=np.zeros(len(envs), dtype=np.int64),
            global_state=global_state,
        )
        stream.states = [stream.state(env) for env in envs]
        return stream

    def state(self, env: MultiAgentEnv) -> np.ndarray:
        """The copy's global state, or nothing where no learner reads it (on pixels it would be
        the largest array of the fragment)."""
        return env.state() if self.global_state else _NO_STATE

    def stepped(
        self, e: int, step: TimeStep, env: MultiAgentEnv, record: JointRecorder, t: int, one_hot, rng, mixtures
    ) -> tuple[np.ndarray, int, list[int]] | None:
        """Record copy `e`'s step; where its episode ended, reset it and return the episode's
        (returns, length, draws)."""
        agents = env.spec.agents
        next_state = self.state(env)
        rewards = np.array([step.rewards.get(a, 0.0) for a in agents])
        self.returns[e] += rewards
        self.lengths[e] += 1
        terminated = step.done and any(step.terminations.values())
        truncated = step.done and not terminated
        record.step(t, e, step, rewards, next_state, terminated, truncated, one_hot)
        ended = None
        if step.done:
            ended = (self.returns[e].copy(), int(self.lengths[e]), self.draws[e])
            self.returns[e] = 0.0
            self.lengths[e] = 0
            self.draws[e] = [mixture.draw(rng) for mixture in mixtures]
            step = _checked(env.reset(), env)
            next_state = self.state(env)
        else:
            _checked(step, env)
        self.steps[e], self.states[e] = step, next_state
        return ended


_NO_STATE = np.zeros(0, np.float32)


def _checked(step: TimeStep, env: MultiAgentEnv) -> TimeStep:
    spec = env.spec
    if not step.done and step.acting != spec.agents:
        raise ValueError(
            f"{spec.name}: a fragment of joint steps needs every agent to act every step; "
            f"acting now: {list(step.acting)}, agents: {list(spec.agents)}"
        )
    return step


class JointRecorder:
    """Preallocated [T, E] arrays that one fragment fills row by row. Of the observations that
    follow each step, only those the next row does not hold are kept (`FollowingObservations`)."""

    def __init__(
        self,
        steps: int,
        envs: int,
        agents: tuple[AgentID, ...],
        obs_size: dict[AgentID, int],
        num_actions: dict[AgentID, int],
        state_size: int,
        obs_dtype: dict[AgentID, type] | None = None,
    ):
        """`obs_dtype`: per agent, float32 by default; uint8 keeps pixels a quarter of the bytes."""
        self.agents = agents
        shape = (steps, envs)
        obs_dtype = obs_dtype or {}
        self.obs = {a: np.zeros((*shape, obs_size[a]), obs_dtype.get(a, np.float32)) for a in agents}
        self.mask = {a: np.zeros((*shape, num_actions[a]), np.bool_) for a in agents}
        self.action = {a: np.zeros(shape, np.int64) for a in agents}
        self.reward = {a: np.zeros(shape, np.float32) for a in agents}
        self.ended: dict[AgentID, list[tuple[int, int, np.ndarray]]] = {
            a: [] for a in agents
        }  # (t, e, final observation)
        self.after_last = {a: np.zeros((envs, obs_size[a]), obs_dtype.get(a, np.float32)) for a in agents}
        self._zeros = {a: np.zeros(obs_size[a], obs_dtype.get(a, np.float32)) for a in agents}
        self.next_mask = {a: np.zeros((*shape, num_actions[a]), np.bool_) for a in agents}
        self.state = np.zeros((*shape, state_size), np.float32)
        self.next_state = np.zeros((*shape, state_size), np.float32)
        self.terminated = np.zeros(shape, np.bool_)
        self.truncated = np.zeros(shape, np.bool_)
        self.extras: dict[AgentID, dict[str, np.ndarray]] = {}

    def step(self, t, e, step: TimeStep, rewards, next_state, terminated, truncated, one_hot) -> None:
        last = t == len(self.terminated) - 1
        for i, a in enumerate(self.agents):
            self.reward[a][t, e] = rewards[i]
            raw = step.observations.get(a)
            if raw is None:  # the episode ended: a truncated agent may still hand its final observation
                raw = step.infos.get(a, {}).get("final_observation")
            if last or step.done:  # else the next row's own observation is this one
                hot = one_hot.get(a)
                following = self._zeros[a] if raw is None else raw if hot is None else np.concatenate([raw, hot])
                if last:
                    self.after_last[a][e] = following
                else:  # a copy: an environment may reuse its observation's buffer after the reset
                    self.ended[a].append((t, e, np.array(following, self.after_last[a].dtype)))
            # A truncated agent's final observation comes without a mask: every action counts as legal.
            self.next_mask[a][t, e] = step.action_masks.get(a, raw is not None)
        self.next_state[t, e] = next_state
        self.terminated[t, e] = terminated
        self.truncated[t, e] = truncated

    def acted(self, t, obs, mask, state, actions, extras) -> None:
        for a in self.agents:
            self.obs[a][t] = obs[a]
            self.mask[a][t] = mask[a]
            self.action[a][t] = actions[a]
            for key, value in extras.get(a, {}).items():
                self.extras.setdefault(a, {}).setdefault(key, np.zeros(self.terminated.shape, value.dtype))[t] = value
        self.state[t] = state

    def batch(self) -> JointExperience:
        ended = {
            a: np.array([row for _, _, row in sorted(rows, key=lambda r: r[:2])], self.obs[a].dtype).reshape(
                -1, self.obs[a].shape[-1]
            )
            for a, rows in self.ended.items()
        }
        episode_end = self.terminated | self.truncated
        next_obs = FollowingObservations(self.obs, ended, self.after_last, episode_end)
        return JointExperience(
            agents=self.agents,
            obs=self.obs,
            mask=self.mask,
            action=self.action,
            reward=self.reward,
            next_obs=next_obs,
            next_mask=self.next_mask,
            state=self.state,
            next_state=self.next_state,
            terminated=self.terminated,
            truncated=self.truncated,
            extras=self.extras,
        )
