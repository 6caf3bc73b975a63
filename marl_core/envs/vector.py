"""Several copies of one environment stepped together, each restarted as soon as it finishes.

A rollout worker keeps every copy busy this way: when copy i's episode ends, `step` returns the
terminal TimeStep (so its last rewards are not lost) with `reset_step` holding the first TimeStep
of the next episode, and the next actions for copy i are for `reset_step.acting`.

Seeding: `reset()` resets copy i with `seed + i`, so every call to `reset()` starts the same
episodes. Automatic resets pass no seed: each copy continues its own random stream, the
Gymnasium vector-env convention, so the whole run is reproducible from `seed`.
"""

from __future__ import annotations

from collections.abc import Callable

from marl_core.envs.api import AgentID, EnvSpec, MultiAgentEnv, TimeStep


class VectorEnv:
    def __init__(self, make_env: Callable[[], MultiAgentEnv], num_envs: int, seed: int | None = None):
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self.envs = [make_env() for _ in range(num_envs)]
        self.spec: EnvSpec = self.envs[0].spec
        self.seed = seed

    def __len__(self) -> int:
        return len(self.envs)

    def reset(self) -> list[TimeStep]:
        return [env.reset(None if self.seed is None else self.seed + i) for i, env in enumerate(self.envs)]

    def step(self, actions: list[dict[AgentID, int]]) -> list[TimeStep]:
        if len(actions) != len(self.envs):
            raise ValueError(f"got actions for {len(actions)} environments, expected {len(self.envs)}")
        steps = []
        for env, env_actions in zip(self.envs, actions):
            step = env.step(env_actions)
            if step.done:
                step.reset_step = env.reset()
            steps.append(step)
        return steps

    def close(self) -> None:
        for env in self.envs:
            env.close()
