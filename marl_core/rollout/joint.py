"""A worker's fragment streams: environment copies kept mid-episode between requests, and the
recorder that fills one fragment's `JointExperience` row by row.

Two kinds of stream play a fragment the same way for the worker (`observed`, `infostates`,
`advance`): `Stream` steps its `MultiAgentEnv` copies one by one; `BatchedStream` steps a
`BatchedEnv`'s copies (VMAS's) in one call, with no Python loop over copies on the way."""

from __future__ import annotations

import dataclasses

import numpy as np

from marl_core.envs import AgentID, BatchedEnv, MultiAgentEnv, TimeStep
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

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def state(self, env: MultiAgentEnv) -> np.ndarray:
        """The copy's global state, or nothing where no learner reads it (on pixels it would be
        the largest array of the fragment)."""
        return env.state() if self.global_state else _NO_STATE

    def observed(self, one_hot: dict[AgentID, np.ndarray]) -> tuple[dict, dict, np.ndarray]:
        """What the next actions answer: every agent's observations and masks [E, ...] (with
        its one-hot, where it has one) and the global states [E, state_size]."""
        agents = self.envs[0].spec.agents
        obs = {a: np.stack([_extended(s.observations[a], one_hot.get(a)) for s in self.steps]) for a in agents}
        mask = {a: np.stack([s.action_masks[a] for s in self.steps]) for a in agents}
        return obs, mask, np.stack(self.states)

    def infostates(self, agent: AgentID, copies: np.ndarray) -> list[str] | None:
        """The agent's information-state strings in these copies, where the game has them."""
        found = [self.steps[e].infos.get(agent, {}).get("infostate") for e in copies]
        return None if None in found else found

    def advance(self, actions: dict[AgentID, np.ndarray], record: JointRecorder, t: int, one_hot, rng, mixtures):
        """Step every copy with its actions and record row `t`; returns the (returns, length,
        draws) of the episodes that ended."""
        spec = self.envs[0].spec
        agents, continuous = spec.agents, bool(spec.action_boxes)
        finished = []
        for e, env in enumerate(self.envs):
            if continuous:
                step = env.step({a: actions[a][e] for a in agents})
            else:
                step = env.step({a: int(actions[a][e]) for a in agents})
            ended = self.stepped(e, step, env, record, t, one_hot, rng, mixtures)
            if ended is not None:
                finished.append(ended)
        return finished

    def close(self) -> None:
        for env in self.envs:
            env.close()

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


def _extended(observation: np.ndarray, one_hot: np.ndarray | None) -> np.ndarray:
    return observation if one_hot is None else np.concatenate([observation, one_hot])


def _extended_rows(observations: dict[AgentID, np.ndarray], one_hot) -> dict[AgentID, np.ndarray]:
    """`_extended` for every copy's row at once: each agent's [E, size] observations with its
    one-hot appended, where it has one."""
    return {
        a: o if (hot := one_hot.get(a)) is None else np.concatenate([o, np.broadcast_to(hot, (len(o), len(hot)))], 1)
        for a, o in observations.items()
    }


@dataclasses.dataclass
class BatchedStream:
    """A `BatchedEnv`'s copies playing one stream's fragments, where the last one left them.
    Every agent acts in every copy, every action legal."""

    env: BatchedEnv
    observations: dict[AgentID, np.ndarray]  # [E, size]: what the copies' next actions answer
    draws: list[list[int]]  # per copy, the member drawn per population for its current episode
    returns: np.ndarray  # [E, agents]
    lengths: np.ndarray  # [E]
    all_legal: dict[AgentID, np.ndarray]  # every copy's masks [E, actions]: all True, read and never written
    global_state: bool = True
    next_index: int = 0

    @classmethod
    def start(cls, env: BatchedEnv, mixtures, rng: np.random.Generator, global_state: bool = True) -> BatchedStream:
        """Every copy reset, seeded from `rng` (the fragment's own generator)."""
        observations = env.reset(seed=int(rng.integers(2**31)))
        E, spec = env.num_envs, env.spec
        draws = [[mixture.draw(rng) for mixture in mixtures] for _ in range(E)]
        all_legal = {a: np.ones((E, spec.num_actions[a]), np.bool_) for a in spec.agents}
        returns, lengths = np.zeros((E, len(spec.agents))), np.zeros(E, np.int64)
        return cls(env, observations, draws, returns, lengths, all_legal, global_state)

    @property
    def num_envs(self) -> int:
        return self.env.num_envs

    def _state(self, observations: dict[AgentID, np.ndarray]) -> np.ndarray:
        return self.env.state(observations) if self.global_state else np.zeros((self.num_envs, 0), np.float32)

    def observed(self, one_hot: dict[AgentID, np.ndarray]) -> tuple[dict, dict, np.ndarray]:
        return _extended_rows(self.observations, one_hot), self.all_legal, self._state(self.observations)

    def infostates(self, agent: AgentID, copies: np.ndarray) -> None:
        return None

    def advance(self, actions: dict[AgentID, np.ndarray], record: JointRecorder, t: int, one_hot, rng, mixtures):
        """One call steps every copy; row `t` is recorded whole, and the copies whose episode
        ended start their next one."""
        step = self.env.step(actions)
        ended = step.ended
        # what follows the step is kept only for the fragment's last row and the episodes that
        # ended (the next row holds the rest)
        following = {}
        if t == record.rows - 1 or ended.any():
            following = _extended_rows(step.observations, one_hot)
        record.step_all(
            t, step.rewards, following, self.all_legal, self._state(step.observations), step.terminated, step.truncated
        )
        self.returns += step.rewards
        self.lengths += 1
        finished = []
        for e in np.flatnonzero(ended):
            finished.append((self.returns[e].copy(), int(self.lengths[e]), self.draws[e]))
            self.draws[e] = [mixture.draw(rng) for mixture in mixtures]
        self.returns[ended] = 0.0
        self.lengths[ended] = 0
        self.observations = step.observations
        if ended.any():
            self.observations = self.env.reset_ended(ended)
        return finished

    def close(self) -> None:
        self.env.close()


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
        action_size: dict[AgentID, int] | None = None,
    ):
        """`obs_dtype`: per agent, float32 by default; uint8 keeps pixels a quarter of the bytes.
        `action_size`: the agents whose actions are continuous, and the size of their float32
        vectors (the others' actions are int64 indices)."""
        self.agents = agents
        shape = (steps, envs)
        obs_dtype, action_size = obs_dtype or {}, action_size or {}
        self.obs = {a: np.zeros((*shape, obs_size[a]), obs_dtype.get(a, np.float32)) for a in agents}
        self.mask = {a: np.zeros((*shape, num_actions[a]), np.bool_) for a in agents}
        self.action = {
            a: np.zeros((*shape, action_size[a]), np.float32) if a in action_size else np.zeros(shape, np.int64)
            for a in agents
        }
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

    @property
    def rows(self) -> int:
        return len(self.terminated)

    def step_all(self, t, rewards, following, next_mask, next_state, terminated, truncated) -> None:
        """Row `t` of every copy at once (a `BatchedStream`'s step): `rewards` [E, agents],
        `following` each agent's observations after the step [E, size] (an ended copy's last
        ones; needed only where `t` is the last row or a copy ended), `next_mask` each agent's
        masks after it [E, actions]."""
        last = t == self.rows - 1
        ended = terminated | truncated
        for i, a in enumerate(self.agents):
            self.reward[a][t] = rewards[:, i]
            if last:
                self.after_last[a][:] = following[a]
            else:
                dtype = self.after_last[a].dtype
                self.ended[a].extend((t, int(e), np.array(following[a][e], dtype)) for e in np.flatnonzero(ended))
            self.next_mask[a][t] = next_mask[a]
        self.next_state[t] = next_state
        self.terminated[t] = terminated
        self.truncated[t] = truncated & ~terminated  # as a copy's: an episode that terminated did not run out

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
