"""`JointExperience`: what a MARL rollout hands to a multi-agent learner.

Centralized learners need more than each agent's own transitions: a critic of the global state
(MAPPO), a mixer conditioned on it (QMIX), or every agent's action beside every agent's
observation (MADDPG). So a batch is *joint* and *time-major*: T consecutive steps of E environment
copies, in which every agent acts in every step. Per-agent arrays are keyed by agent (agents may
differ in observation and action sizes); shared ones are [T, E].

Episodes run on across segments: a copy that finishes an episode mid-segment is reset, and its
next row starts the new episode. Two flags say where episodes end:

- `terminated[t, e]`: the episode ended at step t; nothing is bootstrapped from `next_state`.
- `truncated[t, e]`: the episode was cut by a time limit (MPE's `max_cycles`); the return goes on
  past it, so on-policy methods bootstrap from the value of `next_state` / `next_obs`.

The final row of a segment continues into the next one unless it is flagged, and is bootstrapped
like a truncation. `next_obs`, `next_mask` and `next_state` of a row are what followed *that* step,
before any reset, so every row stands alone as a transition for replay buffers (`flat`).

A recorded batch keeps `next_obs` as `FollowingObservations`: only the rows that `obs` does not
already hold. On pixels a full copy would double what a worker records and ships.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from marl_core.envs import AgentID
from marl_core.rl.batch import Experience


class FollowingObservations(Mapping):
    """`next_obs` of a segment, stored as what `obs` lacks: the observation that followed row t is
    row t+1's own, except where the episode ended at t (a reset came between) and after the last
    row. Only those are kept: `ended[a]`, the final observations of the rows where
    `episode_end[:-1]` is set, in row-major order, and `after_last[a]` [E, O]. An agent's full
    [T, E, O] array is built where it is first read (in the learner), then kept; it never
    travels."""

    def __init__(
        self,
        obs: dict[AgentID, np.ndarray],
        ended: dict[AgentID, np.ndarray],
        after_last: dict[AgentID, np.ndarray],
        episode_end: np.ndarray,
    ):
        self.obs, self.ended, self.after_last, self.episode_end = obs, ended, after_last, episode_end
        self._built: dict[AgentID, np.ndarray] = {}

    def __getitem__(self, agent: AgentID) -> np.ndarray:
        if agent not in self._built:
            obs = self.obs[agent]
            following = np.empty_like(obs)
            following[:-1] = obs[1:]
            following[:-1][self.episode_end[:-1]] = self.ended[agent]
            following[-1] = self.after_last[agent]
            self._built[agent] = following
        return self._built[agent]

    def __contains__(self, agent) -> bool:  # Mapping's would build the array to answer
        return agent in self.obs

    def __iter__(self):
        return iter(self.obs)

    def __len__(self) -> int:
        return len(self.obs)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_built": {}}

    def with_obs(self, obs: dict[AgentID, np.ndarray]) -> FollowingObservations:
        """The same following rows in `obs`'s dtypes, over `obs` (the batch's converted copy)."""
        return FollowingObservations(
            obs,
            {a: v.astype(obs[a].dtype, copy=False) for a, v in self.ended.items()},
            {a: v.astype(obs[a].dtype, copy=False) for a, v in self.after_last.items()},
            self.episode_end,
        )

    @classmethod
    def side_by_side(cls, parts: list[FollowingObservations], obs: dict[AgentID, np.ndarray]) -> FollowingObservations:
        """Segments of several workers joined on the E axis, over their joined `obs`."""
        episode_end = np.concatenate([p.episode_end for p in parts], axis=1)
        offsets = np.cumsum([0] + [p.episode_end.shape[1] for p in parts[:-1]])
        rows = [np.nonzero(p.episode_end[:-1]) for p in parts]
        t = np.concatenate([t for t, _ in rows])
        e = np.concatenate([e + offset for (_, e), offset in zip(rows, offsets)])
        order = np.lexsort((e, t))  # row-major, as boolean indexing of the joined array reads them
        return cls(
            obs,
            {a: np.concatenate([p.ended[a] for p in parts])[order] for a in obs},
            {a: np.concatenate([p.after_last[a] for p in parts]) for a in obs},
            episode_end,
        )


@dataclass
class JointExperience:
    """T joint steps of E environment copies (shapes below; O_a, A_a: agent a's sizes, S: state size)."""

    agents: tuple[AgentID, ...]
    obs: dict[AgentID, np.ndarray]  # [T, E, O_a] float32, or uint8 pixels (`float_observations` in a learner)
    mask: dict[AgentID, np.ndarray]  # [T, E, A_a] bool
    action: dict[AgentID, np.ndarray]  # [T, E] int64
    reward: dict[AgentID, np.ndarray]  # [T, E] float32
    next_obs: Mapping[AgentID, np.ndarray]  # [T, E, O_a], as `obs`; recorded: `FollowingObservations`
    next_mask: dict[AgentID, np.ndarray]  # [T, E, A_a] bool (all False after a terminal step)
    state: np.ndarray  # [T, E, S] float32, the global state the step was taken in
    next_state: np.ndarray  # [T, E, S] float32
    terminated: np.ndarray  # [T, E] bool
    truncated: np.ndarray  # [T, E] bool
    extras: dict[AgentID, dict[str, np.ndarray]] = field(default_factory=dict)  # per agent, [T, E] each

    @property
    def steps(self) -> int:
        return self.terminated.shape[0]

    @property
    def envs(self) -> int:
        return self.terminated.shape[1]

    @property
    def episode_end(self) -> np.ndarray:
        """[T, E] bool: the episode ended at this step, by termination or truncation."""
        return self.terminated | self.truncated

    def agent_experience(self, agents: list[AgentID]) -> Experience:
        """The given agents' transitions as single-agent streams (one per agent and environment copy).

        Independent learners (IPPO, IQL) train on these: each agent sees the others as part of
        the environment. A stream's `last` marks truncations and the segment's end.
        """
        streams = []
        for agent in agents:
            extras = self.extras.get(agent, {})
            for e in range(self.envs):
                last = self.truncated[:, e].copy()
                last[-1] = True
                streams.append(
                    Experience(
                        obs=self.obs[agent][:, e].astype(np.float32, copy=False),
                        mask=self.mask[agent][:, e],
                        action=self.action[agent][:, e],
                        reward=self.reward[agent][:, e],
                        next_obs=self.next_obs[agent][:, e].astype(np.float32, copy=False),
                        next_mask=self.next_mask[agent][:, e],
                        done=self.terminated[:, e].copy(),
                        last=last,
                        extras={key: value[:, e] for key, value in extras.items()},
                    )
                )
        return Experience.concat(streams)

    def float_observations(self) -> JointExperience:
        """This batch with float32 observations: pixels travel from the workers as uint8 (a
        quarter of the bytes) and become floats in the learner that reads them."""
        if all(v.dtype == np.float32 for v in self.obs.values()) and (
            isinstance(self.next_obs, FollowingObservations)
            or all(v.dtype == np.float32 for v in self.next_obs.values())
        ):
            return self
        obs = {a: v.astype(np.float32, copy=False) for a, v in self.obs.items()}
        if isinstance(self.next_obs, FollowingObservations):
            next_obs = self.next_obs.with_obs(obs)
        else:
            next_obs = {a: v.astype(np.float32, copy=False) for a, v in self.next_obs.items()}
        return dataclasses.replace(self, obs=obs, next_obs=next_obs)

    @classmethod
    def concat_envs(cls, batches: list[JointExperience]) -> JointExperience:
        """Segments of the same length from several workers, side by side on the E axis."""
        if not batches:
            raise ValueError("cannot concatenate an empty list of JointExperience")
        if len(batches) == 1:  # nothing to join: copying would cost a pass over every array (pixels: hundreds of MB)
            return batches[0]
        first = batches[0]
        if any(b.agents != first.agents or b.steps != first.steps for b in batches):
            raise ValueError("JointExperience batches to concatenate need the same agents and number of steps")

        def per_agent(name: str) -> dict[AgentID, np.ndarray]:
            return {a: np.concatenate([getattr(b, name)[a] for b in batches], axis=1) for a in first.agents}

        extras = {
            a: {key: np.concatenate([b.extras[a][key] for b in batches], axis=1) for key in first.extras.get(a, {})}
            for a in first.extras
        }
        obs = per_agent("obs")
        if all(isinstance(b.next_obs, FollowingObservations) for b in batches):
            next_obs = FollowingObservations.side_by_side([b.next_obs for b in batches], obs)
        else:
            next_obs = per_agent("next_obs")
        return cls(
            agents=first.agents,
            obs=obs,
            next_obs=next_obs,
            **{name: per_agent(name) for name in ("mask", "action", "reward", "next_mask")},
            **{
                name: np.concatenate([getattr(b, name) for b in batches], axis=1)
                for name in ("state", "next_state", "terminated", "truncated")
            },
            extras=extras,
        )

    def flat(self) -> JointExperience:
        """The same transitions as T*E rows of one step each (T = T*E, E = 1), for replay buffers."""

        def rows(array: np.ndarray) -> np.ndarray:
            return array.reshape(
                array.shape[0] * array.shape[1], 1, *array.shape[2:]
            )  # -1 is ambiguous for an empty state

        return JointExperience(
            agents=self.agents,
            **{
                name: {a: rows(v) for a, v in getattr(self, name).items()}
                for name in ("obs", "mask", "action", "reward", "next_obs", "next_mask")
            },
            **{name: rows(getattr(self, name)) for name in ("state", "next_state", "terminated", "truncated")},
            extras={a: {k: rows(v) for k, v in ex.items()} for a, ex in self.extras.items()},
        )
