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
import time
from typing import Any, Callable, Union

import numpy as np

from marl_core.envs import AgentID, MultiAgentEnv, TimeStep, make_env
from marl_core.policies import sample_rows
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
            from marl_core.game_tree import build_tree

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
        learners = set(request.learner_agents)

        quota = np.full(len(self.envs), request.episodes // len(self.envs))
        quota[: request.episodes % len(self.envs)] += 1
        episodes: list[_Episode] = []
        transitions: list[dict] = []
        live: dict[int, _Episode] = {}
        steps: dict[int, TimeStep] = {}

        def begin(i: int, step: TimeStep) -> None:
            draws = [population.draw(rng) for _, population in opponents]
            live[i], steps[i] = _Episode(draws, len(agents)), step

        # Each copy's chance stream is seeded once per request; later episodes continue it.
        for i, env in enumerate(self.envs):
            if quota[i] > 0:
                begin(i, env.reset(seed=int(rng.integers(2**31))))

        env_steps = 0
        while live:
            # Batch every acting agent by who plays it: one forward pass for the learner,
            # one vectorized draw per opponent population.
            actions: dict[int, dict[AgentID, int]] = {i: {} for i in live}
            learner_at, learner_obs, learner_mask = [], [], []
            opponent_at: dict[int, list] = {k: [] for k in range(len(opponents))}
            for i, episode in live.items():
                step = steps[i]
                for agent in step.acting:
                    if agent in learners:
                        learner_at.append((i, agent))
                        learner_obs.append(step.observations[agent])
                        learner_mask.append(step.action_masks[agent])
                    else:
                        if agent not in opponent_index:
                            raise ValueError(f"agent {agent!r} is neither a learner nor has an opponent population")
                        opponent_at[opponent_index[agent]].append((i, agent, rows[agent][step.infos[agent]["infostate"]]))
            if learner_at:
                obs, mask = np.stack(learner_obs), np.stack(learner_mask)
                chosen, extras = policy.act(obs, mask, request.explore, rng)
                for j, (i, agent) in enumerate(learner_at):
                    actions[i][agent] = int(chosen[j])
                    live[i].acted(agent, obs[j], mask[j], int(chosen[j]), {k: v[j] for k, v in extras.items()})
            for k, at in opponent_at.items():
                if at:
                    population = opponents[k][1]
                    member = np.array([live[i].draws[k] for i, _, _ in at])
                    probs = population.members[member, [row for _, _, row in at]]
                    chosen = sample_rows(probs, rng)
                    for j, (i, agent, _) in enumerate(at):
                        actions[i][agent] = int(chosen[j])

            for i in list(live):
                step = self.envs[i].step(actions[i])
                env_steps += 1
                episode = live[i]
                episode.rewarded(step, agents)
                if step.done:
                    episode.end(step)
                    episodes.append(episode)
                    transitions.extend(episode.finished_transitions())
                    quota[i] -= 1
                    del live[i], steps[i]
                    if quota[i] > 0:
                        begin(i, self.envs[i].reset())
                else:
                    steps[i] = step

        return RolloutResult(
            experience=_to_experience(transitions),
            episode_returns=np.array([e.returns for e in episodes], dtype=np.float64).reshape(-1, len(agents)),
            opponent_draws=np.array([e.draws for e in episodes], dtype=np.int64).reshape(len(episodes), len(opponents)),
            env_steps=env_steps,
            weights_version=version,
            seconds=time.perf_counter() - started,
        )


class _Episode:
    """One episode's bookkeeping: the learner agents' open transitions and everyone's returns.

    A learner transition runs from one of its decisions to its next one (or the episode's end)
    and collects every reward the agent receives in between, so other agents' moves are part
    of the environment from its point of view.
    """

    def __init__(self, draws: list[int], num_agents: int):
        self.draws = draws
        self.returns = np.zeros(num_agents)
        self.transitions: dict[AgentID, list[dict]] = {}  # per agent, in time order
        self._open: dict[AgentID, dict] = {}

    def acted(self, agent, obs, mask, action, extras) -> None:
        previous = self._open.get(agent)
        if previous is not None:
            self._close(agent, previous, obs, mask, done=False)
        self._open[agent] = dict(obs=obs, mask=mask, action=action, reward=0.0, extras=extras)

    def rewarded(self, step: TimeStep, agents) -> None:
        for index, agent in enumerate(agents):
            reward = step.rewards.get(agent, 0.0)
            self.returns[index] += reward
            if agent in self._open:
                self._open[agent]["reward"] += reward

    def end(self, step: TimeStep) -> None:
        for agent, transition in self._open.items():
            # A terminated agent's future is worth nothing. A truncated one would bootstrap from
            # its final observation, which the API does not expose; its own is the stand-in.
            done = bool(step.terminations.get(agent, True))
            self._close(agent, transition, transition["obs"], transition["mask"], done=done)
        self._open.clear()

    def _close(self, agent, transition: dict, next_obs, next_mask, done: bool) -> None:
        closed = dict(transition, next_obs=next_obs, next_mask=next_mask, done=done)
        self.transitions.setdefault(agent, []).append(closed)

    def finished_transitions(self) -> list[dict]:
        """One contiguous segment per learner agent, so advantage estimates never mix streams."""
        flat = []
        for stream in self.transitions.values():
            stream[-1]["last"] = True
            flat.extend(stream)
        return flat


def _to_experience(t: list[dict]) -> Experience:
    keys = t[0]["extras"].keys() if t else ()
    return Experience(
        obs=np.array([x["obs"] for x in t], dtype=np.float32),
        mask=np.array([x["mask"] for x in t], dtype=bool),
        action=np.array([x["action"] for x in t], dtype=np.int64),
        reward=np.array([x["reward"] for x in t], dtype=np.float32),
        next_obs=np.array([x["next_obs"] for x in t], dtype=np.float32),
        next_mask=np.array([x["next_mask"] for x in t], dtype=bool),
        done=np.array([x["done"] for x in t], dtype=bool),
        last=np.array([x.get("last", False) for x in t], dtype=bool),
        extras={k: np.array([x["extras"][k] for x in t]) for k in keys},
    )
