"""MPE's simple_tag as a cooperative task: three predators against a scripted prey that flees.

    make_env("pettingzoo:marl_core.envs.predator_prey")

In simple_tag the prey is a learner too, and a prey trained with its predators can end up worse
than chance against others (docs/marl.md, "The MPE suite"): self-play scores say little there.
Published MARL tables take the prey out of the learning instead: EPyMARL's predator-prey fixes a
pretrained prey, JaxMARL's and FACMAC's predator-prey variants script it. Here the prey is part
of the environment: only the predators are agents, and since each of them is paid for every
catch by any of them, they share one team reward, so every MARL algorithm applies, VDN and QMIX
included. Observations, rewards and the global state are simple_tag's own.

The prey runs from the predators, the nearer ones counting more, and back from the edge of
the arena, where simple_tag starts to penalise it. It is faster than a predator, so catching it
takes predators that close in from different sides or pin it against an obstacle or the edge.
"""

from __future__ import annotations

import numpy as np
from pettingzoo import ParallelEnv

from marl_core.envs.pettingzoo_env import without_checking_wrappers

# simple_tag's discrete moves: no-op, left, right, down, up
MOVES = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]])
EDGE = 0.8  # the prey turns back beyond this coordinate; simple_tag penalises it from 0.9


def flee(prey_position: np.ndarray, predator_positions: np.ndarray) -> int:
    """The move most aligned with away-from-the-predators plus back-from-the-edge."""
    offsets = prey_position - predator_positions  # [predators, 2]
    squared = np.maximum((offsets**2).sum(axis=1, keepdims=True), 1e-6)
    away = (offsets / squared).sum(axis=0)  # each predator's push falls with its distance
    beyond = np.abs(prey_position) - EDGE
    back = -np.sign(prey_position) * np.maximum(beyond, 0.0) * 10.0 * max(np.linalg.norm(away), 1.0)
    direction = away + back
    return int(np.argmax(MOVES @ direction)) if np.any(direction) else 0


class ScriptedPreyEnv(ParallelEnv):
    """simple_tag's parallel env with its good agents played by `flee`: the agents are the
    predators only."""

    def __init__(self, env: ParallelEnv):
        self.env = env
        self.world = env.unwrapped.world
        self.prey = tuple(a.name for a in self.world.agents if not a.adversary)
        self.possible_agents = [a for a in env.possible_agents if a not in self.prey]
        self.metadata = {**env.metadata, "name": "predator_prey"}
        self.state_space = env.state_space

    @property
    def agents(self) -> list[str]:
        return [a for a in self.env.agents if a not in self.prey]

    def observation_space(self, agent):
        return self.env.observation_space(agent)

    def action_space(self, agent):
        return self.env.action_space(agent)

    def reset(self, seed=None, options=None):
        observations, infos = self.env.reset(seed=seed, options=options)
        return self._predators(observations), self._predators(infos)

    def step(self, actions):
        predators = np.array([a.state.p_pos for a in self.world.agents if a.adversary])
        prey_moves = {a.name: flee(a.state.p_pos, predators) for a in self.world.agents if not a.adversary}
        results = self.env.step({**actions, **prey_moves})
        return tuple(self._predators(part) for part in results)

    def state(self) -> np.ndarray:
        return self.env.state()

    def close(self) -> None:
        self.env.close()

    def _predators(self, per_agent: dict) -> dict:
        return {agent: value for agent, value in per_agent.items() if agent not in self.prey}


def parallel_env(**kwargs) -> ScriptedPreyEnv:
    """simple_tag_v3's parallel env (its keyword arguments) with a scripted prey."""
    from mpe2 import simple_tag_v3

    return ScriptedPreyEnv(without_checking_wrappers(simple_tag_v3.parallel_env(**kwargs)))
