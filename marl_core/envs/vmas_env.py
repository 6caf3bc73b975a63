"""VMAS scenarios (the vectorized multi-agent simulator, in torch): `vmas:<scenario>`.

VMAS steps all copies of a scenario in one batched torch call. The rollout engine's fragments
(MARL training) use that directly: a worker holds one `VmasBatchedEnv` of all its copies and
steps them in one call per joint step. Whole episodes (evaluations, PSRO's responses, leagues)
play through the per-copy interface like every other environment: `VmasEnv` is a VMAS
environment of one copy.

Names: `vmas:navigation`, or with the scenario's own arguments as OpenSpiel writes a game's
parameters, `vmas:navigation(n_agents=2,max_steps=50)`. MPE's tasks are VMAS scenarios too
(`vmas:simple_spread`). An episode ends by the scenario's own rule (a termination) or after
`max_steps` steps (a truncation); `max_steps` is 100 unless the name sets it, as in
BenchMARL's VMAS tasks. Actions are VMAS's discrete ones unless the name says
`continuous_actions=True` (VMAS's own argument): then each agent's action is a vector within the
`Box` of VMAS's action space (`EnvSpec.action_boxes`), clipped into it here, since VMAS refuses
one outside its range and a Gaussian policy's sample may fall there.

VMAS draws its random numbers from torch's global generator (and seeds NumPy's and Python's
global ones too on a seeded reset): a process's VMAS runs are reproducible from the seeds it
resets with, as long as it makes the same calls in the same order.
"""

from __future__ import annotations

import ast
import re

import numpy as np

from marl_core.envs.api import AgentID, Box, EnvSpec, MultiAgentEnv, TimeStep, check_actions, check_rewards
from marl_core.envs.batched import BatchedEnv, BatchedStep
from marl_core.envs.vector import BatchedCopies

MAX_STEPS = 100


def scenario_arguments(name: str, target: str) -> tuple[str, dict]:
    """`navigation(n_agents=2)` -> ("navigation", {"n_agents": 2}); a ValueError names the
    scenario and what VMAS has otherwise."""
    import vmas

    match = re.fullmatch(r"(?P<scenario>\w+)(?:\((?P<arguments>.*)\))?", target.strip())
    if match is None:
        raise ValueError(f"environment {name!r}: write vmas:<scenario> or vmas:<scenario>(key=value,...)")
    arguments: dict = {}
    for item in filter(None, (match["arguments"] or "").split(",")):
        key, equals, value = item.partition("=")
        try:
            arguments[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"environment {name!r}: argument {item.strip()!r} is not key=<Python literal>") from None
        if not equals or not key.strip().isidentifier():
            raise ValueError(f"environment {name!r}: argument {item.strip()!r} is not key=<Python literal>")
    known = sorted({*vmas.scenarios, *vmas.mpe_scenarios})
    if match["scenario"] not in known:
        raise ValueError(f"environment {name!r}: VMAS has no scenario {match['scenario']!r}; its scenarios: {known}")
    return match["scenario"], arguments


class VmasBatchedEnv(BatchedEnv):
    def __init__(self, name: str, target: str, num_envs: int):
        import vmas

        scenario, arguments = scenario_arguments(name, target)
        max_steps = arguments.pop("max_steps", MAX_STEPS)
        continuous = arguments.pop("continuous_actions", False)
        if not isinstance(continuous, bool):
            raise ValueError(f"environment {name!r}: continuous_actions={continuous!r} is not True or False")
        try:
            self.env = vmas.make_env(
                scenario,
                num_envs=num_envs,
                device="cpu",
                continuous_actions=continuous,
                max_steps=max_steps,
                terminated_truncated=True,
                **arguments,
            )
        except TypeError as error:  # an argument the scenario does not take
            raise ValueError(f"environment {name!r}: {error}") from None
        self.num_envs = num_envs
        agents = tuple(agent.name for agent in self.env.agents)
        spaces = dict(zip(agents, self.env.action_space))
        boxes = {a: Box(tuple(s.low.tolist()), tuple(s.high.tolist())) for a, s in spaces.items()} if continuous else {}
        self.spec = EnvSpec(
            name=name,
            agents=agents,
            observation_size={a: int(space.shape[0]) for a, space in zip(agents, self.env.observation_space)},
            num_actions={a: 0 if continuous else int(space.n) for a, space in spaces.items()},
            simultaneous=True,
            action_boxes=boxes,
        )
        self._bounds = [(np.array(boxes[a].low, np.float32), np.array(boxes[a].high, np.float32)) for a in boxes]
        self._steps = np.zeros(num_envs, np.int64)  # each copy's steps in its episode, for error messages

    def reset(self, seed: int | None = None) -> dict[AgentID, np.ndarray]:
        self._steps[:] = 0
        return self._observations(self.env.reset(seed=seed))

    def step(self, actions: dict[AgentID, np.ndarray]) -> BatchedStep:
        import torch

        self._steps += 1
        if self._bounds:
            given = [
                np.clip(actions[a], low, high, dtype=np.float32)
                for a, (low, high) in zip(self.spec.agents, self._bounds)
            ]
        else:
            given = [np.asarray(actions[a], dtype=np.int64) for a in self.spec.agents]
        observations, rewards, terminated, truncated, _ = self.env.step([torch.as_tensor(a) for a in given])
        rewards = torch.stack(rewards, dim=1).numpy().astype(np.float64)
        if not np.isfinite(rewards).all():
            e, i = np.argwhere(~np.isfinite(rewards))[0]
            check_rewards(self.spec.name, int(self._steps[e]), {self.spec.agents[i]: float(rewards[e, i])})
        return BatchedStep(self._observations(observations), rewards, terminated.numpy(), truncated.numpy())

    def reset_ended(self, ended: np.ndarray) -> dict[AgentID, np.ndarray]:
        """Copies whose episodes ran out together (every copy at `max_steps`) restart in one
        batched reset, which continues the seeded generator; the others one by one."""
        copies = np.flatnonzero(ended)
        self._steps[copies] = 0
        if len(copies) == self.num_envs:
            return self._observations(self.env.reset())
        for n, e in enumerate(copies):
            observations = self.env.reset_at(int(e), return_observations=n == len(copies) - 1)
        return self._observations(observations) if len(copies) else {}

    def _observations(self, observations) -> dict[AgentID, np.ndarray]:
        return {a: o.numpy().astype(np.float32, copy=False) for a, o in zip(self.spec.agents, observations)}


class VmasEnv(MultiAgentEnv):
    """One copy of a VMAS scenario as a `MultiAgentEnv`: every agent acts every step, every
    action is legal (or, continuous, clipped into its box); an episode's last observations come
    in `infos[agent]["final_observation"]`."""

    def __init__(self, name: str, target: str):
        self.copy = BatchedCopies(VmasBatchedEnv(name, target, num_envs=1))
        self.spec = self.copy.spec

    def reset(self, seed: int | None = None) -> TimeStep:
        self._last = self.copy.reset({0: seed})[0]
        return self._last

    def step(self, actions: dict[AgentID, int]) -> TimeStep:
        check_actions(self.spec.name, self._last.action_masks if self._last else {}, actions, self.spec.action_boxes)
        self._last = self.copy.step({0: actions})[0]
        return self._last

    def close(self) -> None:
        self.copy.close()
