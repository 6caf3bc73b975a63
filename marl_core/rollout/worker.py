"""Rollout workers: many environment copies, one batched forward pass per step, experience out.

This is the actor side of MALib's actor-learner split. A worker owns `envs_per_worker` copies of
one environment and answers `RolloutRequest`s: play N whole episodes with the learner's policy
on some agents and population opponents on the others, and return the learner's transitions.

Three rules keep the numbers honest and the worker fast:

- Opponents are drawn from their meta-strategy once per episode (PSRO's strategy-level mixture),
  never per step. Each episode's draw is returned, so this is checked, not assumed.
- The learner's weights come from a parameter store once per request, never by a blocking call
  per step: a request is the bounded interval between weight updates.
- A request is deterministic given its seed and weights version, and returns whole episodes
  only. A worker that dies mid-request can be restarted and the request replayed without losing
  or double-counting an episode.

The worker steps its copies itself rather than through `VectorEnv`: a request gives each copy
an exact number of whole episodes, so a copy that has played its share stops instead of
being reset.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Union

import numpy as np

from marl_core.envs import AgentID, MultiAgentEnv, TimeStep, make_env
from marl_core.policies.tabular import sample_rows
from marl_core.rl import ALGORITHMS, Experience


@dataclasses.dataclass(frozen=True)
class LearnerSpec:
    """Which policy a worker acts with, and how to build it before its first weights arrive."""

    key: str  # parameter-store key
    algorithm: str  # name in `marl_core.rl.ALGORITHMS`
    config: Any  # that algorithm's config


@dataclasses.dataclass(frozen=True)
class TabularPopulation:
    """An opponent population of tabular policies [K, I, A] and the meta-strategy over it."""

    game: str  # OpenSpiel game string: its tree maps information states to rows
    player: int
    members: np.ndarray
    weights: np.ndarray

    def draw(self, rng: np.random.Generator) -> int:
        return int(rng.choice(len(self.weights), p=self.weights))


@dataclasses.dataclass(frozen=True)
class RolloutRequest:
    learner: LearnerSpec
    learner_agents: tuple[AgentID, ...]
    opponents: dict[AgentID, TabularPopulation]
    episodes: int
    seed: tuple[int, ...]
    weights_version: int = 0  # the version the learner pushed for this request
    explore: bool = True


@dataclasses.dataclass
class RolloutResult:
    experience: Experience  # the learner agents' transitions, whole episodes, each contiguous
    episode_returns: np.ndarray  # [episodes, agents] summed rewards, agents in spec order
    opponent_draws: np.ndarray  # [episodes, len(opponents)] member drawn for each opponent agent
    env_steps: int
    weights_version: int
    seconds: float


EnvSource = Union[str, Callable[[], MultiAgentEnv]]  # a `make_env` name, or a factory


class RolloutWorker:
    def __init__(self, env: EnvSource, envs_per_worker: int, parameter_store=None):
        make = (lambda: make_env(env)) if isinstance(env, str) else env
        self.envs: list[MultiAgentEnv] = [make() for _ in range(envs_per_worker)]
        self.spec = self.envs[0].spec
        self.store = parameter_store
        self._policies: dict[str, tuple[Any, int]] = {}  # learner key -> (policy, version)
        self._rows: dict[int, dict[str, int]] = {}  # player -> information state -> row

    # --- the learner's policy, refreshed once per request ------------------------------------

    def _learner_policy(self, spec: LearnerSpec, version: int):
        policy, have = self._policies.get(spec.key, (None, -1))
        if policy is None:
            agent = self.spec.agents[0]
            algorithm = ALGORITHMS[spec.algorithm]
            policy = algorithm.policy(self.spec.observation_size[agent], self.spec.num_actions[agent], spec.config)
        if have < version and self.store is not None:
            pulled = self.store.pull(spec.key, have)
            if pulled is not None:
                have, weights = pulled
                policy.set_weights(weights)
        self._policies = {spec.key: (policy, have)}  # one learner at a time: drop stale keys
        return policy, have

    def _infostate_rows(self, population: TabularPopulation) -> dict[str, int]:
        if population.player not in self._rows:
            from marl_core.games.tree import build_tree

            self._rows[population.player] = build_tree(population.game).players[population.player].index
        return self._rows[population.player]

    # --- one request -------------------------------------------------------------------------

    def collect(self, request: RolloutRequest) -> RolloutResult:
        started = time.perf_counter()
        policy, version = self._learner_policy(request.learner, request.weights_version)
        rng = np.random.default_rng(request.seed)
        opponents = list(request.opponents.items())
        opponent_index = {agent: k for k, (agent, _) in enumerate(opponents)}  # looked up every step
        rows = {agent: self._infostate_rows(population) for agent, population in opponents}
        agents = self.spec.agents
        agent_index = {agent: index for index, agent in enumerate(agents)}
        learners = set(request.learner_agents)

        quota = [request.episodes // len(self.envs)] * len(self.envs)
        for i in range(request.episodes % len(self.envs)):
            quota[i] += 1
        finished: list[_Episode] = []
        decisions = _Decisions()
        live: dict[int, _Episode] = {}  # in stepping order: a copy that starts an episode goes last

        def begin(i: int, step: TimeStep) -> None:
            live[i] = _Episode([population.draw(rng) for _, population in opponents], len(agents), step)

        # Each copy's chance stream is seeded once per request; later episodes continue it.
        for i, env in enumerate(self.envs):
            if quota[i] > 0:
                begin(i, env.reset(seed=int(rng.integers(2**31))))

        env_steps = 0
        while live:
            # Batch every acting agent by who plays it: one forward pass for the learner,
            # one vectorized draw per opponent population. Each copy's actions go in its own dict.
            stepping = list(live.items())
            actions: list[dict[AgentID, int]] = []
            learner_at, learner_obs, learner_mask = [], [], []
            opponent_at: list[list] = [[] for _ in opponents]
            for _, episode in stepping:
                step = episode.step
                chosen_here: dict[AgentID, int] = {}
                actions.append(chosen_here)
                for agent, observation in step.observations.items():
                    if agent in learners:
                        learner_at.append((chosen_here, episode, agent))
                        learner_obs.append(observation)
                        learner_mask.append(step.action_masks[agent])
                    else:
                        k = opponent_index.get(agent)
                        if k is None:
                            raise ValueError(f"agent {agent!r} is neither a learner nor has an opponent population")
                        row = rows[agent][step.infos[agent]["infostate"]]
                        opponent_at[k].append((chosen_here, episode, agent, row))
            if learner_at:
                # np.array copies the rows, so an env that reuses its arrays cannot change them later.
                obs, mask = np.array(learner_obs), np.array(learner_mask)
                chosen, extras = policy.act(obs, mask, request.explore, rng)
                decision = decisions.add(obs, mask, chosen, extras)
                for (chosen_here, episode, agent), action in zip(learner_at, chosen.tolist()):
                    chosen_here[agent] = action
                    episode.acted(agent, decision)
                    decision += 1
            for k, at in enumerate(opponent_at):
                if at:
                    population = opponents[k][1]
                    member = np.array([episode.draws[k] for _, episode, _, _ in at])
                    probs = population.members[member, [row for _, _, _, row in at]]
                    for (chosen_here, _, agent, _), action in zip(at, sample_rows(probs, rng).tolist()):
                        chosen_here[agent] = action

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
            opponent_draws=np.array([e.draws for e in finished], dtype=np.int64).reshape(len(finished), len(opponents)),
            env_steps=env_steps,
            weights_version=version,
            seconds=time.perf_counter() - started,
        )


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
