"""The rollout engine: environment copies, every agent mapped to a behaviour policy, experience out.

This is the actor side of MALib's actor-learner split, and the one engine every scenario plays
through (PSRO's best responses, sampled evaluation and approximate exploitability; the MARL
learners' rounds and evaluations). A worker owns `envs_per_worker` copies of one environment and
answers `RolloutRequest`s. A request maps every agent to a role (`roles`), and every role to a
behaviour:

- a learner (`learners`): a network whose weights come from the weight store once per
  request, never by a blocking call per step (a request is the bounded interval between weight
  updates);
- a population (`populations`): a mixture of members drawn once per episode (PSRO's
  strategy-level mixture), never per step, every agent of the role playing the drawn member
  for the whole episode; a fixed member is a mixture of one. Each episode's draws are returned,
  so this is checked, not assumed.

What comes back is what the caller needs:

- whole episodes (`episodes`): each copy plays an exact share and stops, so which episodes count
  never depends on their outcome or length; the learners' agents' transitions come back per
  learner role (`Experience`, one contiguous stream per episode and agent), with everyone's
  returns. PSRO's responses and evaluations, MARL's greedy evaluations.
- a fixed-length fragment (`fragment`): `steps` joint steps of every copy, whose episodes run on
  across the requests of one stream (as in CleanRL's and MAPPO's runners), as `JointExperience`:
  every agent's observation, action and reward with the global state, time-major. The MARL
  learners' rounds. Only simultaneous environments, in which every agent acts every step.

A request is deterministic given its seed and weights version. Whole-episode requests return
whole episodes only, so a worker that dies mid-request is restarted and the request replayed
without losing or double-counting an episode. A fragment continues its stream where the
worker's copies stand; a worker that has no such stream at that index (it was restarted, or the
fragment is replayed) starts the stream's copies afresh from the fragment's seed: the fragment
is still whole and counted once, only the episodes in flight are cut where the previous
fragment ended (a boundary the learners already bootstrap at).

Acting is batched by who plays: one forward pass per learner for all its agents of all copies,
one `action_probs` call per (role, member) in use, and for a population whose members all have a
tabular form, one lookup in the members' tables stacked once per request (no policy call at all).

A request gives each copy an exact number of whole episodes, so a copy that has played its
share stops instead of being reset (`marl_core.envs.vector`). Where the environment's source
batches its copies (VMAS), every copy steps in one call, for whole episodes and fragments alike.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from marl_core.envs import (
    AgentID,
    AgentMapping,
    BatchedCopies,
    EnvCopies,
    MultiAgentEnv,
    TimeStep,
    make_batched_env,
    make_env,
)
from marl_core.policies.base import Observations, Policy
from marl_core.policies.tabular import TabularPolicy
from marl_core.rl import ALGORITHMS, Experience
from marl_core.rl.policy import NetworkPolicy
from marl_core.rl.sampling import sample_rows, uniform_legal
from marl_core.rollout.joint import BatchedStream, JointRecorder, Stream
from marl_core.rollout.joint_experience import JointExperience
from marl_core.rollout.layout import PolicyLayout
from marl_core.rollout.weight_store import WeightStoreClient

# --- what a request is made of ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AlgorithmPolicy:
    """Builds an untrained acting network of a `marl_core.rl` algorithm (PSRO's learned oracles)."""

    algorithm: str  # name in `marl_core.rl.ALGORITHMS`
    config: Any  # that algorithm's settings

    def __call__(self, obs_size: int, num_actions: int) -> NetworkPolicy:
        return ALGORITHMS[self.algorithm].policy(obs_size, num_actions, self.config)


@dataclasses.dataclass(frozen=True, eq=False)
class NetworkCopy:
    """Builds a copy of a given network (its architecture: its weights come from the store).
    Multi-agent learners act with networks of their own classes; a copy needs no registry."""

    network: NetworkPolicy

    def __call__(self, obs_size: int, num_actions: int) -> NetworkPolicy:
        network = self.network
        if (network.obs_size, network.num_actions) != (obs_size, num_actions):
            raise ValueError(
                f"the network takes {network.obs_size} inputs and has {network.num_actions} actions; "
                f"its agents have {obs_size} and {num_actions}"
            )
        return copy.deepcopy(network)


PolicyBuilder = Callable[[int, int], NetworkPolicy]  # (input size, actions) -> an untrained network


@dataclasses.dataclass(frozen=True)
class LearnerSpec:
    """A learner's network as a worker acts with it: built once, weights pulled by version."""

    key: str  # weight-store key
    build: PolicyBuilder


@dataclasses.dataclass(frozen=True, eq=False)
class PolicyMixture:
    """A role's population and its meta-strategy, drawn from once per episode."""

    members: tuple[Policy, ...]
    weights: np.ndarray  # [K] probabilities

    def __post_init__(self):
        weights = np.asarray(self.weights, dtype=np.float64)
        if weights.shape != (len(self.members),) or not self.members:
            raise ValueError(
                f"a mixture of {len(self.members)} members needs {len(self.members)} weights (at least one), got "
                f"shape {weights.shape}"
            )
        if not np.all(np.isfinite(weights)) or np.any(weights < 0) or abs(weights.sum() - 1.0) > 1e-6:
            raise ValueError(f"mixture weights must be non-negative and sum to 1, got {weights.tolist()}")
        object.__setattr__(self, "weights", weights)
        cdf = weights.cumsum()
        object.__setattr__(self, "_cdf", cdf / cdf[-1])

    def draw(self, rng: np.random.Generator) -> int:
        """`rng.choice(len(weights), p=weights)` without its per-call checks: the same member from
        the same one uniform number (the same cumulative sum, divided by its last entry)."""
        return int(self._cdf.searchsorted(rng.random(), side="right"))


@dataclasses.dataclass(frozen=True)
class Fragment:
    """`steps` joint steps of every copy of the stream `stream`; `index` numbers the stream's
    fragments from 0. The fragments of one stream must reach one worker: a pool deals requests
    by their position in the list, so send them at the same position every time."""

    stream: str
    index: int
    steps: int


@dataclasses.dataclass(frozen=True)
class RolloutRequest:
    roles: AgentMapping  # agent -> role
    populations: dict[str, PolicyMixture] = dataclasses.field(default_factory=dict)  # role -> mixture
    episodes: int = 0  # whole episodes; or, with `fragment`, none
    seed: tuple[int, ...] = (0,)
    learners: dict[str, LearnerSpec] = dataclasses.field(
        default_factory=dict
    )  # role -> network; every role has a population or a learner
    fragment: Fragment | None = None
    weights_version: int = 0  # the version the learners pushed for this request
    explore: bool = True
    opponent_epsilon: float = 0.0  # chance that a population member's move is replaced by a uniformly random legal one
    agent_ids: bool = False  # a learner's agents see a one-hot of their index among its agents (`PolicyLayout`)
    experience: bool = True  # whole episodes: return the learners' transitions (False: returns only)
    global_state: bool = (
        True  # a fragment records the global state (centralized learners); off, its state arrays are [T, E, 0]
    )


@dataclasses.dataclass
class RolloutResult:
    experience: dict[str, Experience]  # whole episodes: per learner role, its agents' transitions
    joint: JointExperience | None  # a fragment: every agent's joint steps
    episode_returns: np.ndarray  # [episodes, agents] summed rewards of the episodes that ended, agents in spec order
    episode_lengths: np.ndarray  # [episodes] their environment steps
    draws: np.ndarray  # [episodes, len(populations)] member drawn per role, in the populations' order
    env_steps: int
    weights_version: int
    seconds: float


@dataclasses.dataclass
class StreamSummary:
    """What a worker played in one `stream` call."""

    next_index: int  # where the stream goes on
    env_steps: int
    episode_returns: np.ndarray  # [episodes, agents] of the training episodes that ended
    episode_lengths: np.ndarray


EnvSource = str | Callable[[], MultiAgentEnv]  # a `make_env` name, or a factory
WIDEST_WAVE = 1024  # the most copies of a batched environment that whole episodes play at once


@dataclasses.dataclass
class _Plan:
    """What a request means for this environment, worked out once before the first step.

    An agent's slot says who plays it: learner `j` has slot `-(j + 1)`, population `k` slot `k`.
    """

    slot: dict[AgentID, int]
    mixtures: list[PolicyMixture]
    tables: list[np.ndarray | None]  # per mixture: the members' tables [K, I, A], if all have one
    rows: dict[AgentID, dict[str, int]]  # per agent on a table path: information state -> row
    learner_roles: list[str]
    learner_agents: list[tuple[AgentID, ...]]  # per learner
    one_hot: dict[AgentID, np.ndarray]  # learner agents whose observation is extended
    layout: PolicyLayout


def _learner(slot: int) -> int:
    return -slot - 1


class RolloutWorker:
    """`store`: a `WeightStore` or anything with its `pull`, or the name of a store
    actor (a worker on Ray finds its store by name rather than holding a handle: Ray keeps a
    handle passed to a constructor in the object store, and a restarted worker could lose it).
    `torch_threads`: set where the worker owns its process (a Ray actor); many small forward
    passes gain nothing from threads that only contend."""

    def __init__(self, env: EnvSource, envs_per_worker: int, store=None, torch_threads: int | None = None):
        if torch_threads is not None:
            import torch

            torch.set_num_threads(torch_threads)
        if isinstance(store, str):
            store = WeightStoreClient(store)
        self._source = env
        self._make = (lambda: make_env(env)) if isinstance(env, str) else env
        self.copies = self._copies(envs_per_worker)  # whole episodes' copies; streams have their own
        self._wave: BatchedCopies | None = None  # a batch as wide as a request's episodes (`_episode_copies`)
        self.spec = self.copies.spec
        self.store = store
        self._networks: dict[str, tuple[NetworkPolicy, int]] = {}  # learner key -> (network, version)
        self._rows: dict[tuple[str, int], dict[str, int]] = {}  # (game, player) -> information state -> row
        self._streams: dict[str, Stream | BatchedStream] = {}  # fragment streams: their own copies, mid-episode

    # --- the learners' networks, refreshed once per request ----------------------------------

    def _network(self, spec: LearnerSpec, version: int, obs_size: int, num_actions: int) -> tuple[NetworkPolicy, int]:
        network, have = self._networks.get(spec.key, (None, -1))
        if network is None:
            network = spec.build(obs_size, num_actions)
        if have < version and self.store is not None:
            pulled = self.store.pull(spec.key, have)
            if pulled is not None:
                have, weights = pulled
                network.set_weights(weights)
        return network, have

    def _networks_for(self, request: RolloutRequest, plan: _Plan) -> tuple[list[NetworkPolicy], int]:
        """The request's learners' networks (keys no request names any more are dropped) and the
        oldest version among them."""
        held, networks = {}, []
        for role in plan.learner_roles:
            spec = request.learners[role]
            held[spec.key] = self._network(
                spec, request.weights_version, plan.layout.obs_size[role], plan.layout.num_actions[role]
            )
            networks.append(held[spec.key][0])
        self._networks = held
        return networks, min((have for _, have in held.values()), default=request.weights_version)

    # --- what a request asks of this environment ---------------------------------------------

    def _plan(self, request: RolloutRequest) -> _Plan:
        """Every agent's player (learner or population), checked before any episode starts."""
        name, learners = self.spec.name, request.learners
        both = sorted(set(learners) & set(request.populations))
        if both:
            raise ValueError(f"role(s) {both} are played by a learner; they cannot also have a population")
        if request.fragment is None and (not isinstance(request.episodes, int) or request.episodes < 0):
            raise ValueError(f"episodes must be a non-negative integer, got {request.episodes!r}")
        if request.fragment is not None and (request.episodes or request.fragment.steps < 1):
            raise ValueError(
                "a fragment request plays fragment.steps >= 1 steps and no whole episodes, got "
                f"steps={request.fragment.steps!r}, episodes={request.episodes!r}"
            )
        if not 0 <= request.opponent_epsilon <= 1:
            raise ValueError(f"opponent_epsilon must be in [0, 1], got {request.opponent_epsilon!r}")
        if request.populations and self.spec.action_boxes:
            raise ValueError(
                f"{name} has continuous actions; population members act on discrete ones only, so every role "
                f"needs a learner (populations given: {list(request.populations)})"
            )
        index = {role: k for k, role in enumerate(request.populations)}
        learner_roles = list(learners)
        slot: dict[AgentID, int] = {}
        for agent in self.spec.agents:
            try:
                role = request.roles(agent)
            except KeyError as error:
                raise ValueError(f"{name}: roles: {error.args[0]}") from None
            if role in learners:
                slot[agent] = -(learner_roles.index(role) + 1)
            elif role in index:
                slot[agent] = index[role]
            else:
                raise ValueError(
                    f"{name}: agent {agent!r} of role {role!r} has neither a learner nor a population (learners: "
                    f"{learner_roles}, populations: {list(index)})"
                )
        unplayed = [role for role in [*index, *learner_roles] if role not in map(request.roles, self.spec.agents)]
        if unplayed:
            raise ValueError(
                f"{name}: role(s) {unplayed} belong to no agent; the agents' roles are "
                f"{sorted(set(map(request.roles, self.spec.agents)))}"
            )
        layout = PolicyLayout.of(self.spec, request.roles, request.agent_ids)
        learner_agents = [layout.groups[role] for role in learner_roles]
        one_hot = {
            agent: hot for agents in learner_agents for agent in agents if (hot := layout.one_hot(agent)) is not None
        }
        mixtures = list(request.populations.values())
        tables = [_stacked_tables(mixture) for mixture in mixtures]
        rows = {
            agent: self._infostate_rows(mixtures[k], agent)
            for agent, k in slot.items()
            if k >= 0 and tables[k] is not None
        }
        return _Plan(slot, mixtures, tables, rows, learner_roles, learner_agents, one_hot, layout)

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
        networks, version = self._networks_for(request, plan)
        if request.fragment is not None:
            result = self._play_fragment(request, plan, networks)
        else:
            result = self._play_episodes(request, plan, networks)
        result.weights_version = version
        result.seconds = time.perf_counter() - started
        return result

    def _play_episodes(self, request: RolloutRequest, plan: _Plan, networks: list[NetworkPolicy]) -> RolloutResult:
        rng = np.random.default_rng(request.seed)
        slot, mixtures, tables, rows, one_hot = (
            plan.slot,
            plan.mixtures,
            plan.tables,
            plan.rows,
            plan.one_hot,
        )  # read every step
        agents = self.spec.agents
        agent_index = {agent: index for index, agent in enumerate(agents)}
        decisions = [_Decisions() for _ in networks]
        reward_of = {agent: decisions[j].reward for j, group in enumerate(plan.learner_agents) for agent in group}

        copies = self._episode_copies(request.episodes)
        quota = [request.episodes // len(copies)] * len(copies)
        for i in range(request.episodes % len(copies)):
            quota[i] += 1
        finished: list[_Episode] = []
        live: dict[int, _Episode] = {}  # in stepping order: a copy that starts an episode goes last

        def draw() -> list[int]:
            return [mixture.draw(rng) for mixture in mixtures]

        # Each copy's chance stream is seeded once per request; later episodes continue it.
        seeds, first_draws = {}, {}
        for i in range(len(copies)):
            if quota[i] > 0:
                seeds[i] = int(rng.integers(2**31))
                first_draws[i] = draw()
        for i, step in copies.reset(seeds).items():
            live[i] = _Episode(first_draws[i], len(agents), step)

        env_steps = 0
        while live:
            # Batch every acting agent by who plays it: one forward pass per learner; per
            # population, one table lookup or one policy call per member in use. Each copy's
            # actions go in its own dict.
            stepping = list(live.items())
            actions: list[dict[AgentID, int]] = []
            learner_at: list[list] = [[] for _ in networks]
            table_at: list[list] = [[] for _ in mixtures]
            member_at: list[dict[int, list]] = [{} for _ in mixtures]
            for _, episode in stepping:
                step = episode.step
                chosen_here: dict[AgentID, int] = {}
                actions.append(chosen_here)
                for agent, observation in step.observations.items():
                    k = slot[agent]
                    if k < 0:
                        hot = one_hot.get(agent)
                        learner_at[-k - 1].append(
                            (
                                chosen_here,
                                episode,
                                agent,
                                observation if hot is None else np.concatenate([observation, hot]),
                                step.action_masks[agent],
                            )
                        )
                    elif tables[k] is not None:
                        table_at[k].append(
                            (chosen_here, agent, episode.draws[k], rows[agent][step.infos[agent]["infostate"]])
                        )
                    else:
                        member = episode.draws[k]
                        at = member_at[k].get(member)
                        if at is None:
                            at = member_at[k][member] = []
                        at.append(
                            (
                                chosen_here,
                                agent,
                                observation,
                                step.action_masks[agent],
                                step.infos.get(agent, {}).get("infostate"),
                            )
                        )
            for j, at in enumerate(learner_at):
                if at:
                    # np.array copies the rows, so an env that reuses its arrays cannot change them later.
                    obs, mask = np.array([row[3] for row in at]), np.array([row[4] for row in at])
                    chosen, extras = networks[j].act(obs, mask, request.explore, rng)
                    decision = decisions[j].add(obs, mask, chosen, extras)
                    for (chosen_here, episode, agent, _, _), action in zip(at, chosen.tolist()):
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
            steps = copies.step({i: chosen_here for (i, _), chosen_here in zip(stepping, actions)})
            restart = {}
            for i, episode in stepping:
                step = steps[i]
                env_steps += 1
                episode.length += 1
                episode.rewarded(step.rewards, agent_index, reward_of)
                if step.done:
                    episode.end(step.terminations)
                    finished.append(episode)
                    quota[i] -= 1
                    del live[i]
                    if quota[i] > 0:
                        restart[i] = None
                else:
                    episode.step = step
            for i, step in copies.reset(restart).items():  # in the order they ended
                live[i] = _Episode(draw(), len(agents), step)

        experience = {}
        if request.experience:
            experience = {
                role: _to_experience(finished, decisions[j], plan.learner_agents[j])
                for j, role in enumerate(plan.learner_roles)
            }
        return RolloutResult(
            experience=experience,
            joint=None,
            episode_returns=np.array([e.returns for e in finished], dtype=np.float64).reshape(-1, len(agents)),
            episode_lengths=np.array([e.length for e in finished], dtype=np.int64),
            draws=np.array([e.draws for e in finished], dtype=np.int64).reshape(len(finished), len(mixtures)),
            env_steps=env_steps,
            weights_version=request.weights_version,
            seconds=0.0,
        )

    def _play_fragment(self, request: RolloutRequest, plan: _Plan, networks: list[NetworkPolicy]) -> RolloutResult:
        fragment, spec = request.fragment, self.spec
        if not spec.simultaneous:
            raise ValueError(
                f"{spec.name} is turn-based; a fragment of joint steps needs a simultaneous environment "
                "(a PettingZoo parallel_env) in which every agent acts every step"
            )
        rng = np.random.default_rng(request.seed)
        stream = self._streams.get(fragment.stream)
        if stream is None or stream.next_index != fragment.index:
            stream = self._streams[fragment.stream] = self._start_stream(stream, plan, rng, request.global_state)
        stream.next_index = fragment.index + 1
        slot, mixtures, one_hot, agents = plan.slot, plan.mixtures, plan.one_hot, spec.agents
        learner_groups = list(enumerate(plan.learner_agents))
        population_agents = [(agent, k) for agent, k in slot.items() if k >= 0]
        E = stream.num_envs
        state_size = spec.state_size if stream.global_state else 0
        # pixels stay uint8 on the way to the learner, unless an agent one-hot makes them floats
        obs_dtype = {a: np.dtype(spec.observation_dtype) if a not in one_hot else np.float32 for a in agents}
        record = JointRecorder(
            fragment.steps,
            E,
            agents,
            {a: spec.observation_size[a] + len(one_hot.get(a, ())) for a in agents},
            spec.num_actions,
            state_size,
            obs_dtype,
            {a: box.size for a, box in spec.action_boxes.items()},
        )
        finished = []  # (returns, length, draws) of the episodes that ended
        env_steps = 0
        for t in range(fragment.steps):
            obs, mask, state = stream.observed(one_hot)
            actions, extras = {}, {}
            for j, group in learner_groups:  # one forward pass per learner
                chosen, learner_extras = networks[j].act(
                    np.concatenate([obs[a] for a in group]),
                    np.concatenate([mask[a] for a in group]),
                    request.explore,
                    rng,
                )
                for n, a in enumerate(group):
                    actions[a] = chosen[n * E : (n + 1) * E]
                    extras[a] = {key: value[n * E : (n + 1) * E] for key, value in learner_extras.items()}
            for agent, k in population_agents:  # one call per member in use
                drawn = np.array([draws[k] for draws in stream.draws])
                chosen = np.empty(E, dtype=np.int64)
                for member in np.unique(drawn):
                    at = np.flatnonzero(drawn == member)
                    batch = Observations(obs[agent][at], mask[agent][at], stream.infostates(agent, at))
                    chosen[at] = mixtures[k].members[member].act(batch, rng)
                if request.opponent_epsilon > 0:
                    tremble = rng.random(E) < request.opponent_epsilon
                    chosen = np.where(tremble, uniform_legal(mask[agent], rng), chosen)
                actions[agent] = chosen
            finished.extend(stream.advance(actions, record, t, one_hot, rng, mixtures))
            env_steps += E
            record.acted(t, obs, mask, state, actions, extras)
        return RolloutResult(
            experience={},
            joint=record.batch(),
            episode_returns=np.array([returns for returns, _, _ in finished], dtype=np.float64).reshape(
                -1, len(agents)
            ),
            episode_lengths=np.array([length for _, length, _ in finished], dtype=np.int64),
            draws=np.array([draws for _, _, draws in finished], dtype=np.int64).reshape(len(finished), len(mixtures)),
            env_steps=env_steps,
            weights_version=request.weights_version,
            seconds=0.0,
        )

    def _start_stream(self, stream, plan: _Plan, rng: np.random.Generator, global_state: bool):
        """A stream's copies reset, where it had none or must start again (its own copies
        reused): a `BatchedStream` where the environment's source steps copies in one call."""
        if stream is None:
            copies = self._copies(len(self.copies))
            if isinstance(copies, BatchedCopies):
                return BatchedStream.start(copies.env, plan.mixtures, rng, global_state)
            return Stream.start(copies.envs, plan.mixtures, rng, global_state)
        if isinstance(stream, BatchedStream):
            return BatchedStream.start(stream.env, plan.mixtures, rng, global_state)
        return Stream.start(stream.envs, plan.mixtures, rng, global_state)

    def _episode_copies(self, episodes: int) -> EnvCopies | BatchedCopies:
        """The copies that play a request's whole episodes: the worker's own, or, where its
        environment steps copies in one call and the request asks for more episodes than it has,
        one batch of a copy per episode (up to `WIDEST_WAVE`), kept for the next request. A batch
        step costs little more for more copies, so the episodes play as one wave instead of one
        wave per `envs_per_worker` of them."""
        wanted = min(episodes, WIDEST_WAVE)
        if not isinstance(self.copies, BatchedCopies) or wanted <= len(self.copies):
            return self.copies
        if self._wave is None or len(self._wave) != wanted:
            if self._wave is not None:
                self._wave.close()
            self._wave = self._copies(wanted)
        return self._wave

    def _copies(self, count: int) -> EnvCopies | BatchedCopies:
        """`count` new copies of the environment: in one batch where its source steps them so."""
        batched = make_batched_env(self._source, count) if isinstance(self._source, str) else None
        return BatchedCopies(batched) if batched is not None else EnvCopies([self._make() for _ in range(count)])

    def stream(self, request: RolloutRequest, dataset, put_timeout: float = 1.0) -> StreamSummary:
        """Play `request`'s fragment stream, one fragment after another, each with the newest
        weights in the store, into `dataset` (a `DatasetServer`, or the name of its actor), until
        it stops taking them (`marl_core.distributed`). The stream goes on where it stands: in
        this worker's copies, or, for a worker that has none (it was restarted), from the
        dataset's next index with fresh copies. Fragment k is seeded by (*request.seed, k).

        Each fragment's room is reserved before it is played: no joint step played is thrown
        away, and the workers are never further ahead of the learners than the buffer holds."""
        from marl_core.distributed.dataset_server import CLOSED, FULL, DatasetClient

        sink = DatasetClient(dataset) if isinstance(dataset, str) else dataset
        name = request.fragment.stream
        index = self._streams[name].next_index if name in self._streams else sink.next_index(name)
        env_steps, returns, lengths = 0, [np.zeros((0, len(self.spec.agents)))], [np.zeros(0, dtype=np.int64)]
        while True:
            room = FULL
            while room == FULL:
                room = sink.reserve(name, index, put_timeout)
            if room == CLOSED:
                return StreamSummary(index, env_steps, np.concatenate(returns), np.concatenate(lengths))
            fragment = dataclasses.replace(request.fragment, index=index)
            result = self.collect(dataclasses.replace(request, fragment=fragment, seed=(*request.seed, index)))
            env_steps += result.env_steps
            returns.append(result.episode_returns)
            lengths.append(result.episode_lengths)
            index += 1
            sink.put(result, result.weights_version, put_timeout, (name, fragment.index))  # into its reserved room

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        import os

        return os.getpid()

    def close(self) -> None:
        self.copies.close()
        if self._wave is not None:
            self._wave.close()
        for stream in self._streams.values():
            stream.close()


def _tremble(
    chosen: dict[AgentID, int],
    masks: dict[AgentID, np.ndarray],
    slot: dict[AgentID, int],
    epsilon: float,
    rng: np.random.Generator,
) -> None:
    """Replace each population member's move, with chance `epsilon`, by a uniformly random legal one."""
    for agent in chosen:
        if slot[agent] >= 0 and rng.random() < epsilon:
            chosen[agent] = int(uniform_legal(masks[agent][None], rng)[0])


def _stacked_tables(mixture: PolicyMixture) -> np.ndarray | None:
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
    of the environment from its point of view. The episode keeps each agent's decision numbers
    (in its learner's `_Decisions`); the transitions are assembled once, in `_to_experience`.
    """

    __slots__ = ("draws", "returns", "length", "step", "decisions", "terminated")

    def __init__(self, draws: list[int], num_agents: int, step: TimeStep):
        self.draws = draws
        self.returns = [0.0] * num_agents
        self.length = 0
        self.step = step  # the TimeStep the next actions answer
        self.decisions: dict[AgentID, list[int]] = {}  # per agent, in time order
        self.terminated: dict[AgentID, bool] = {}  # filled at the end

    def acted(self, agent: AgentID, decision: int) -> None:
        decisions = self.decisions.get(agent)
        if decisions is None:
            self.decisions[agent] = [decision]
        else:
            decisions.append(decision)

    def rewarded(
        self, rewards: dict[AgentID, float], agent_index: dict[AgentID, int], reward_of: dict[AgentID, list[float]]
    ) -> None:
        for agent, reward in rewards.items():
            # Adding zero changes no sum (they start at +0.0), and most steps pay nothing.
            if reward:
                index = agent_index.get(agent)
                if index is None:
                    continue
                self.returns[index] += float(reward)
                decisions = self.decisions.get(agent)
                if decisions is not None:
                    reward_of[agent][decisions[-1]] += reward

    def end(self, terminations: dict[AgentID, bool]) -> None:
        # A terminated agent's future is worth nothing. A truncated one would bootstrap from
        # its final observation, which the API does not expose; its own is the stand-in.
        self.terminated = {agent: bool(terminations.get(agent, True)) for agent in self.decisions}
        self.step = None

    def stream_order(self, agents: tuple[AgentID, ...]) -> list[AgentID]:
        """Those of `agents` that acted, in the order their first transitions closed: at their
        second decision, or at the end (then in the order they first acted). Decision numbers
        grow with time."""
        decisions = self.decisions
        acted = [agent for agent in decisions if agent in agents]
        if len(acted) == 1:
            return acted
        return sorted(acted, key=lambda agent: decisions[agent][1] if len(decisions[agent]) > 1 else math.inf)


def _to_experience(episodes: list[_Episode], decisions: _Decisions, agents: tuple[AgentID, ...]) -> Experience:
    """One learner's transitions (those of `agents`) in whole episodes: one contiguous stream per
    episode and agent, so advantage estimates never mix streams, in the order the episodes finished."""
    if decisions.count == 0:
        empty = np.array([])
        return Experience(
            obs=empty.astype(np.float32),
            mask=empty.astype(bool),
            action=empty.astype(np.int64),
            reward=empty.astype(np.float32),
            next_obs=empty.astype(np.float32),
            next_mask=empty.astype(bool),
            done=empty.astype(bool),
            last=empty.astype(bool),
        )
    taken, following, ends, terminated = [], [], [], []
    for episode in episodes:
        for agent in episode.stream_order(agents):
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
    action = np.concatenate(decisions.action)[taken]
    keys = decisions.extras[0].keys()
    return Experience(
        obs=np.asarray(obs[taken], dtype=np.float32),
        mask=np.asarray(mask[taken], dtype=bool),
        action=np.asarray(action, dtype=np.float32 if action.ndim == 2 else np.int64),  # continuous: [N, size]
        reward=np.array(decisions.reward, dtype=np.float32)[taken],
        next_obs=np.asarray(obs[following], dtype=np.float32),
        next_mask=np.asarray(mask[following], dtype=bool),
        done=done,
        last=last,
        extras={k: np.concatenate([e[k] for e in decisions.extras])[taken] for k in keys},
    )
