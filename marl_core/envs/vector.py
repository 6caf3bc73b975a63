"""A worker's copies of one environment, each playing its own episodes: stepped one by one
(`EnvCopies`), or in one call where the environment batches its copies (`BatchedCopies`, over
a `BatchedEnv` such as VMAS's).

Both answer the same two calls, keyed by copy: `reset` the given copies, `step` the given
copies with their actions; each returns the copies' `TimeStep`s. A copy that is not named is
left alone (a batched one is stepped with placeholder actions, and what it returns is dropped):
a rollout worker gives each copy an exact share of episodes, so copies finish at different
times.
"""

from __future__ import annotations

import numpy as np

from marl_core.envs.api import AgentID, MultiAgentEnv, TimeStep
from marl_core.envs.batched import BatchedEnv


class EnvCopies:
    def __init__(self, envs: list[MultiAgentEnv]):
        self.envs = envs
        self.spec = envs[0].spec

    def __len__(self) -> int:
        return len(self.envs)

    def reset(self, seeds: dict[int, int | None]) -> dict[int, TimeStep]:
        """Each named copy's next episode; seed None continues the copy's own random stream."""
        return {i: self.envs[i].reset(seed=seed) for i, seed in seeds.items()}

    def step(self, actions: dict[int, dict[AgentID, int]]) -> dict[int, TimeStep]:
        return {i: self.envs[i].step(copy_actions) for i, copy_actions in actions.items()}

    def close(self) -> None:
        for env in self.envs:
            env.close()


class BatchedCopies:
    """Seeding is the batch's: a seeded reset restarts every copy from the first seed given (a
    VMAS environment has one generator for all its copies); an unseeded one restarts the named
    copies and continues that generator."""

    def __init__(self, env: BatchedEnv):
        self.env = env
        self.spec = env.spec
        spec, agents = self.spec, self.spec.agents
        self._no_actions = {a: np.zeros((env.num_envs, *spec.action_shape(a)), spec.action_dtype(a)) for a in agents}
        self._all_legal = {a: np.ones(self.spec.num_actions[a], bool) for a in agents}

    def __len__(self) -> int:
        return self.env.num_envs

    def reset(self, seeds: dict[int, int | None]) -> dict[int, TimeStep]:
        seeded = [seed for seed in seeds.values() if seed is not None]
        if seeded:
            observations = self.env.reset(seed=seeded[0])
        else:
            ended = np.zeros(len(self), bool)
            ended[list(seeds)] = True
            observations = self.env.reset_ended(ended)
        no_rewards = np.zeros(len(self.spec.agents))
        return {i: self._timestep(observations, i, no_rewards, False, False) for i in seeds}

    def step(self, actions: dict[int, dict[AgentID, int]]) -> dict[int, TimeStep]:
        batch = {a: placeholder.copy() for a, placeholder in self._no_actions.items()}
        for i, copy_actions in actions.items():
            for agent, action in copy_actions.items():
                batch[agent][i] = action
        step = self.env.step(batch)
        return {
            i: self._timestep(step.observations, i, step.rewards[i], bool(step.terminated[i]), bool(step.truncated[i]))
            for i in actions
        }

    def close(self) -> None:
        self.env.close()

    def _timestep(self, observations, i: int, rewards: np.ndarray, terminated: bool, truncated: bool) -> TimeStep:
        agents = self.spec.agents
        own = {a: observations[a][i] for a in agents}
        done = terminated or truncated
        return TimeStep(
            observations={} if done else own,
            action_masks={} if done else dict(self._all_legal),
            rewards={a: float(rewards[n]) for n, a in enumerate(agents)},
            terminations=dict.fromkeys(agents, terminated),
            truncations=dict.fromkeys(agents, truncated and not terminated),
            infos={a: {"final_observation": own[a]} for a in agents} if done else {a: {} for a in agents},
        )
