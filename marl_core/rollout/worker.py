"""Rollout workers: many environment copies, batched acting per step, experience out.

This is the actor side of MALib's actor-learner split. A worker owns `envs_per_worker` copies of
one environment and answers `RolloutRequest`s: play N whole episodes in which every agent acts
for its role (`roles` maps agents to roles), either with the learner's network (the agents of
`learner_role`, whose transitions are returned) or with a member of its role's population,
and return what the learner needs plus everyone's returns.

Three rules keep the numbers honest and the worker fast:

- A role's member is drawn from its meta-strategy once per episode (PSRO's strategy-level
  mixture), never per step, and every agent of the role plays that member for the whole
  episode. Each episode's draws are returned, so this is checked, not assumed.
- The learner's weights come from a parameter store once per request, never by a blocking call
  per step: a request is the bounded interval between weight updates.
- A request is deterministic given its seed and weights version, and returns whole episodes
  only. A worker that dies mid-request can be restarted and the request replayed without losing
  or double-counting an episode.

Acting is batched by who plays: one forward pass for all learner agents of all copies, one
`action_probs` call per (role, member) in use, and for a population whose members all have a
tabular form, one lookup in the members' tables stacked once per request (no policy call at all).

The worker steps its copies itself rather than through `VectorEnv`: a request gives each copy
an exact number of whole episodes, so a copy that has played its share stops instead of
being reset.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Optional, Union

import numpy as np

from marl_core.envs import AgentID, AgentMapping, MultiAgentEnv, TimeStep, make_env
from marl_core.policies.base import Observations, Policy, sample_rows
from marl_core.policies.tabular import TabularPolicy
from marl_core.rl import ALGORITHMS, Experience
from marl_core.rl.policy import uniform_legal


@dataclasses.dataclass(frozen=True)
class LearnerSpec:
    """Which policy a worker acts with, and how to build it before its first weights arrive."""

    key: str  # parameter-store key
    algorithm: str  # name in `marl_core.rl.ALGORITHMS`
    config: Any  # that algorithm's config


@dataclasses.dataclass(frozen=True, eq=False)
class PolicyMixture:
    """A role's population and its meta-strategy, drawn from once per episode."""

    members: tuple[Policy, ...]
    weights: np.ndarray  # [K] probabilities

    def __post_init__(self):
        weights = np.asarray(self.weights, dtype=np.float64)
        if weights.shape != (len(self.members),) or not self.members:
            raise ValueError(f"a mixture of {len(self.members)} members needs {len(self.members)} weights (at least one), got shape {weights.shape}")
        if not np.all(np.isfinite(weights)) or np.any(weights < 0) or abs(weights.sum() - 1.0) > 1e-6:
            raise ValueError(f"mixture weights must be non-negative and sum to 1, got {weights.tolist()}")
        object.__setattr__(self, "weights", weights)

    def draw(self, rng: np.random.Generator) -> int:
        return int(rng.choice(len(self.weights), p=self.weights))


@dataclasses.dataclass(frozen=True)
class RolloutRequest:
    roles: AgentMapping  # agent -> role
    populations: dict[str, PolicyMixture]  # role -> mixture; every role without the learner needs one
    episodes: int
    seed: tuple[int, ...]
    learner: Optional[LearnerSpec] = None
    learner_role: Optional[str] = None  # its agents all act with the learner's network; their transitions come back
    weights_version: int = 0  # the version the learner pushed for this request
    explore: bool = True
    opponent_epsilon: float = 0.0  # chance that a population member's move is replaced by a uniformly random legal one


@dataclasses.dataclass
class RolloutResult:
    experience: Experience  # the learner agents' transitions, whole episodes, each contiguous
    episode_returns: np.ndarray  # [episodes, agents] summed rewards, agents in spec order
    draws: np.ndarray  # [episodes, len(populations)] member drawn per role, in the populations' order
    env_steps: int
    weights_version: int
    seconds: float


EnvSource = Union[str, Callable[[], MultiAgentEnv]]  # a `make_env` name, or a factory

LEARNER = -1  # an agent's slot when the learner plays it; populations have slots 0, 1, ...


@dataclasses.dataclass
class _Plan:
    """What a request means for this environment, worked out once before the first step."""

    slot: dict[AgentID, int]  # agent -> LEARNER or its role's index in `mixtures`
    mixtures: list[PolicyMixture]
    tables: list[Optional[np.ndarray]]  # per mixture: the members' tables [K, I, A], if all have one
    rows: dict[AgentID, dict[str, int]]  # per agent on a table path: information state -> row
    learner_agents: tuple[AgentID, ...]


class RolloutWorker:
    def __init__(self, env: EnvSource, envs_per_worker: int, parameter_store=None):
        make = (lambda: make_env(env)) if isinstance(env, str) else env
        self.envs: list[MultiAgentEnv] = [make() for _ in range(envs_per_worker)]
        self.spec = self.envs[0].spec
        self.store = parameter_store
        self._policies: dict[str, tuple[Any, int]] = {}  # learner key -> (policy, version)
        self._rows: dict[tuple[str, int], dict[str, int]] = {}  # (game, player) -> information state -> row

    # --- the learner's policy, refreshed once per request ------------------------------------

    def _learner_policy(self, spec: LearnerSpec, version: int, agent: AgentID):
        policy, have = self._policies.get(spec.key, (None, -1))
        if policy is None:
            algorithm = ALGORITHMS[spec.algorithm]
            policy = algorithm.policy(self.spec.observation_size[agent], self.spec.num_actions[agent], spec.config)
        if have < version and self.store is not None:
            pulled = self.store.pull(spec.key, have)
            if pulled is not None:
                have, weights = pulled
                policy.set_weights(weights)
        self._policies = {spec.key: (policy, have)}  # one learner at a time: drop stale keys
        return policy, have

    # --- what a request asks of this environment ---------------------------------------------

    def _plan(self, request: RolloutRequest) -> _Plan:
        """Every agent's player (learner or population), checked before any episode starts."""
        name, learner_role = self.spec.name, request.learner_role
        if (request.learner is None) != (learner_role is None):
            raise ValueError(f"a rollout request needs learner and learner_role together, got learner={request.learner!r} and learner_role={learner_role!r}")
        if learner_role in request.populations:
            raise ValueError(f"role {learner_role!r} is played by the learner; it cannot also have a population")
        if not isinstance(request.episodes, int) or request.episodes < 0:
            raise ValueError(f"episodes must be a non-negative integer, got {request.episodes!r}")
        if not 0 <= request.opponent_epsilon <= 1:
            raise ValueError(f"opponent_epsilon must be in [0, 1], got {request.opponent_epsilon!r}")
        index = {role: k for k, role in enumerate(request.populations)}
        slot: dict[AgentID, int] = {}
        for agent in self.spec.agents:
            try:
                role = request.roles(agent)
            except KeyError as error:
                raise ValueError(f"{name}: roles: {error.args[0]}") from None
            if role == learner_role:
                slot[agent] = LEARNER
            elif role in index:
                slot[agent] = index[role]
            else:
                raise ValueError(f"{name}: agent {agent!r} of role {role!r} has neither the learner nor a population (populations: {list(index)})")
        unplayed = [role for role, k in index.items() if k not in slot.values()]
        if unplayed:
            raise ValueError(f"{name}: population(s) {unplayed} belong to no agent; the agents' roles are {sorted(set(map(request.roles, self.spec.agents)))}")
        learner_agents = tuple(agent for agent, k in slot.items() if k == LEARNER)
        if learner_role is not None and not learner_agents:
            raise ValueError(f"{name}: learner_role {learner_role!r} belongs to no agent of {list(self.spec.agents)}")
        mixtures = list(request.populations.values())
        tables = [_stacked_tables(mixture) for mixture in mixtures]
        rows = {
            agent: self._infostate_rows(mixtures[k], agent)
            for agent, k in slot.items() if k != LEARNER and tables[k] is not None
        }
        return _Plan(slot, mixtures, tables, rows, learner_agents)

    def _infostate_rows(self, mixture: PolicyMixture, agent: AgentID) -> dict[str, int]:
        """The rows of `agent`'s information states in its role's tables: those of the tree the
        members were built on (a `TabularPolicy` names it), else of this environment's game."""
        tabular = next((m for m in mixture.members if isinstance(m, TabularPolicy)), None)
        key = (tabular.game, tabular.player) if tabular else (self.spec.name, self.spec.agents.index(agent))
        if key not in self._rows:
            from marl_core.games.tree import build_tree

            self._rows[key] = build_tree(key[0]).players[key[1]].index
        return self._rows[key]

    # --- one request -------------------------------------------------------------------------

    def collect(self, request: RolloutRequest) -> RolloutResult:
        started = time.perf_counter()
        plan = self._plan(request)
        policy, version = None, request.weights_version
        if request.learner is not None:
            policy, version = self._learner_policy(request.learner, request.weights_version, plan.learner_agents[0])
        rng = np.random.default_rng(request.seed)
        slot, mixtures, tables, rows = plan.slot, plan.mixtures, plan.tables, plan.rows  # read every step
        agents = self.spec.agents
        agent_index = {agent: index for index, agent in enumerate(agents)}

        quota = [request.episodes // len(self.envs)] * len(self.envs)
        for i in range(request.episodes % len(self.envs)):
            quota[i] += 1
        finished: list[_Episode] = []
        decisions = _Decisions()
        live: dict[int, _Episode] = {}  # in stepping order: a copy that starts an episode goes last

        def begin(i: int, step: TimeStep) -> None:
            live[i] = _Episode([mixture.draw(rng) for mixture in mixtures], len(agents), step)

        # Each copy's chance stream is seeded once per request; later episodes continue it.
        for i, env in enumerate(self.envs):
            if quota[i] > 0:
                begin(i, env.reset(seed=int(rng.integers(2**31))))

        env_steps = 0
        while live:
            # Batch every acting agent by who plays it: one forward pass for the learner; per
            # population, one table lookup or one policy call per member in use. Each copy's
            # actions go in its own dict.
            stepping = list(live.items())
            actions: list[dict[AgentID, int]] = []
            learner_at, learner_obs, learner_mask = [], [], []
            table_at: list[list] = [[] for _ in mixtures]
            member_at: list[dict[int, list]] = [{} for _ in mixtures]
            for _, episode in stepping:
                step = episode.step
                chosen_here: dict[AgentID, int] = {}
                actions.append(chosen_here)
                for agent, observation in step.observations.items():
                    k = slot[agent]
                    if k == LEARNER:
                        learner_at.append((chosen_here, episode, agent))
                        learner_obs.append(observation)
                        learner_mask.append(step.action_masks[agent])
                    elif tables[k] is not None:
                        table_at[k].append((chosen_here, agent, episode.draws[k], rows[agent][step.infos[agent]["infostate"]]))
                    else:
                        member = episode.draws[k]
                        at = member_at[k].get(member)
                        if at is None:
                            at = member_at[k][member] = []
                        at.append((chosen_here, agent, observation, step.action_masks[agent], step.infos.get(agent, {}).get("infostate")))
            if learner_at:
                # np.array copies the rows, so an env that reuses its arrays cannot change them later.
                obs, mask = np.array(learner_obs), np.array(learner_mask)
                chosen, extras = policy.act(obs, mask, request.explore, rng)
                decision = decisions.add(obs, mask, chosen, extras)
                for (chosen_here, episode, agent), action in zip(learner_at, chosen.tolist()):
                    chosen_here[agent] = action
                    episode.acted(agent, decision)
                    decision += 1
            for k, mixture in enumerate(mixtures):
                at = table_at[k]
                if at:
                    probs = tables[k][[member for _, _, member, _ in at], [row for _, _, _, row in at]]
                    for (chosen_here, agent, _, _), action in zip(at, sample_rows(probs, rng).tolist()):
                        chosen_here[agent] = action
                for member in sorted(member_at[k]):
                    at = member_at[k][member]
                    infostates = [infostate for *_, infostate in at]
                    batch = Observations(
                        obs=np.array([obs for _, _, obs, _, _ in at]),
                        mask=np.array([mask for _, _, _, mask, _ in at]),
                        infostates=None if None in infostates else infostates,
                    )
                    for (chosen_here, agent, *_), action in zip(at, mixture.members[member].act(batch, rng).tolist()):
                        chosen_here[agent] = action

            if request.opponent_epsilon > 0:
                for (_, episode), chosen_here in zip(stepping, actions):
                    _tremble(chosen_here, episode.step.action_masks, slot, request.opponent_epsilon, rng)
            for (i, episode), chosen_here in zip(stepping, actions):
                step = self.envs[i].step(chosen_here)
                env_steps += 1
                episode.rewarded(step.rewards, agent_index, decisions.reward)
                if step.done:
                    episode.end(step.terminations)
                    finished.append(episode)
                    quota[i] -= 1
                    del live[i]
                    if quota[i] > 0:
                        begin(i, self.envs[i].reset())
                else:
                    episode.step = step

        return RolloutResult(
            experience=_to_experience(finished, decisions),
            episode_returns=np.array([e.returns for e in finished], dtype=np.float64).reshape(-1, len(agents)),
            draws=np.array([e.draws for e in finished], dtype=np.int64).reshape(len(finished), len(mixtures)),
            env_steps=env_steps,
            weights_version=version,
            seconds=time.perf_counter() - started,
        )


def _tremble(chosen: dict[AgentID, int], masks: dict[AgentID, np.ndarray], slot: dict[AgentID, int], epsilon: float, rng: np.random.Generator) -> None:
    """Replace each population member's move, with chance `epsilon`, by a uniformly random legal one."""
    for agent in chosen:
        if slot[agent] != LEARNER and rng.random() < epsilon:
            chosen[agent] = int(uniform_legal(masks[agent][None], rng)[0])


def _stacked_tables(mixture: PolicyMixture) -> Optional[np.ndarray]:
    """The members' tables as one [K, I, A] array when every member has one, else None."""
    tables = [member.tabular for member in mixture.members]
    if any(table is None for table in tables):
        return None
    shapes = {table.shape for table in tables}
    if len(shapes) > 1:
        raise ValueError(f"a population's tabular members differ in shape: {sorted(shapes)}")
    return np.stack(tables)


class _Decisions:
    """Every learner decision of a request, as the batches the policy acted on.

    A decision is known by its number, its row in the concatenated batches; episodes keep only
    these numbers, and `_to_experience` gathers the transitions' arrays with them at the end.
    """

    def __init__(self):
        self.count = 0
        self.obs: list[np.ndarray] = []
        self.mask: list[np.ndarray] = []
        self.action: list[np.ndarray] = []
        self.extras: list[dict[str, np.ndarray]] = []
        # Per decision, the rewards its agent received from then until its next decision.
        self.reward: list[float] = []

    def add(self, obs: np.ndarray, mask: np.ndarray, action: np.ndarray, extras: dict[str, np.ndarray]) -> int:
        """Record a batch; the number of its first decision."""
        first = self.count
        self.count += len(action)
        self.obs.append(obs)
        self.mask.append(mask)
        self.action.append(action)
        self.extras.append(extras)
        self.reward += [0.0] * len(action)
        return first


class _Episode:
    """One episode's bookkeeping: the learner agents' decisions and everyone's returns.

    A learner transition runs from one of its decisions to its next one (or the episode's end)
    and collects every reward the agent receives in between, so other agents' moves are part
    of the environment from its point of view. The episode keeps each agent's decision numbers;
    the transitions are assembled once, in `_to_experience`.
    """

    __slots__ = ("draws", "returns", "step", "decisions", "terminated")

    def __init__(self, draws: list[int], num_agents: int, step: TimeStep):
        self.draws = draws
        self.returns = [0.0] * num_agents
        self.step = step  # the TimeStep the next actions answer
        self.decisions: dict[AgentID, list[int]] = {}  # per agent, in time order
        self.terminated: dict[AgentID, bool] = {}  # filled at the end

    def acted(self, agent: AgentID, decision: int) -> None:
        decisions = self.decisions.get(agent)
        if decisions is None:
            self.decisions[agent] = [decision]
        else:
            decisions.append(decision)

    def rewarded(self, rewards: dict[AgentID, float], agent_index: dict[AgentID, int], reward_of: list[float]) -> None:
        for agent, reward in rewards.items():
            # Adding zero changes no sum (they start at +0.0), and most steps pay nothing.
            if reward:
                index = agent_index.get(agent)
                if index is None:
                    continue
                self.returns[index] += float(reward)
                decisions = self.decisions.get(agent)
                if decisions is not None:
                    reward_of[decisions[-1]] += reward

    def end(self, terminations: dict[AgentID, bool]) -> None:
        # A terminated agent's future is worth nothing. A truncated one would bootstrap from
        # its final observation, which the API does not expose; its own is the stand-in.
        self.terminated = {agent: bool(terminations.get(agent, True)) for agent in self.decisions}
        self.step = None

    def stream_order(self) -> list[AgentID]:
        """The agents in the order their first transitions closed: at their second decision, or
        at the end (then in the order they first acted). Decision numbers grow with time."""
        decisions = self.decisions
        if len(decisions) == 1:
            return list(decisions)
        return sorted(decisions, key=lambda agent: decisions[agent][1] if len(decisions[agent]) > 1 else math.inf)


def _to_experience(episodes: list[_Episode], decisions: _Decisions) -> Experience:
    """The learner transitions of whole episodes: one contiguous stream per episode and agent, so
    advantage estimates never mix streams, in the order the episodes finished."""
    if decisions.count == 0:
        empty = np.array([])
        return Experience(
            obs=empty.astype(np.float32), mask=empty.astype(bool), action=empty.astype(np.int64),
            reward=empty.astype(np.float32), next_obs=empty.astype(np.float32), next_mask=empty.astype(bool),
            done=empty.astype(bool), last=empty.astype(bool),
        )
    taken, following, ends, terminated = [], [], [], []
    for episode in episodes:
        for agent in episode.stream_order():
            stream = episode.decisions[agent]
            taken += stream
            following += stream[1:]
            following.append(stream[-1])  # the last transition's next observation is its own
            ends.append(len(taken) - 1)
            terminated.append(episode.terminated[agent])
    n = len(taken)
    taken, following = np.array(taken), np.array(following)  # index arrays, converted once
    done, last = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    done[ends], last[ends] = terminated, True
    obs, mask = np.concatenate(decisions.obs), np.concatenate(decisions.mask)
    keys = decisions.extras[0].keys()
    return Experience(
        obs=np.asarray(obs[taken], dtype=np.float32),
        mask=np.asarray(mask[taken], dtype=bool),
        action=np.asarray(np.concatenate(decisions.action)[taken], dtype=np.int64),
        reward=np.array(decisions.reward, dtype=np.float32)[taken],
        next_obs=np.asarray(obs[following], dtype=np.float32),
        next_mask=np.asarray(mask[following], dtype=bool),
        done=done,
        last=last,
        extras={k: np.concatenate([e[k] for e in decisions.extras])[taken] for k in keys},
    )
