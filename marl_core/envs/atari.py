"""PettingZoo's multi-player Atari games from pixels, as DQN's Atari agents see them.

    make_env("atari:pong_v3")                  # two-player Pong, preprocessed (below)
    make_env("pettingzoo:atari.pong_v3")       # the raw 210x160 RGB screen, no preprocessing

**ROMs.** PettingZoo's Atari games run on `multi_agent_ale_py`, which ships no ROMs, and PettingZoo
points users at AutoROM, which downloads them. The `ale-py` wheel carries the ROMs of its
single-player games, Pong's among them, in `ale_py/roms/<game>.bin`: that directory is where
PettingZoo is told to look (`auto_rom_install_path`), so nothing is downloaded.

**Preprocessing** (Mnih et al. 2015, as SuperSuit's wrappers and CleanRL's PettingZoo Atari
example apply it): each step repeats the joint action for `frame_skip` emulator frames, the
observation is the pixel-wise maximum of the last two of them (Atari sprites flicker between
frames) in grayscale, resized to 84x84, and the last `frame_stack` such frames are stacked as
channels, oldest first. One channel per agent follows (`agent_indicator`): 255 in the channel of
the agent observing, 0 in the others, so one shared policy knows which paddle it moves. Rewards
summed over the skipped frames are clipped to [-1, 1]. The observation is the uint8 array
[stack + agents, 84, 84] (channels first, torch's layout) flattened, as the `MultiAgentEnv`
contract asks of pixels; `AtariSettings.observation_shape` gives the shape back to a convolutional network. The
frames are the same for every agent, so each is resized once per step, not once per agent.

SuperSuit does the same steps (`max_observation_v0`, `frame_skip_v0`, `resize_v1`,
`frame_stack_v1`, `agent_indicator_v0`; channels last) and tests/test_atari.py checks this
adapter against it, frame for frame; the adapter exists because SuperSuit wraps a parallel env through an AEC
round-trip per wrapper and resizes each agent's copy of the screen, which made it run at a quarter
of this speed here (docs/performance.md).

**Pong is not quite zero-sum.** A point gives the scorer +1 and the other player -1; but a player
who does not serve within two seconds gets -1 alone (PettingZoo's serve timer, so that nobody
stalls forever). Rewards, returns and payoffs are each player's own: points won, minus points
lost, minus serve penalties. Each step's infos say which part is which: `points` (the zero-sum
part of the agent's reward) and `serve_penalty`, so an evaluation can report the score on the
board beside the return.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from pathlib import Path

import numpy as np

from marl_core.envs.api import AgentID, EnvSpec, MultiAgentEnv, TimeStep, check_actions, check_rewards


def rom_directory() -> Path:
    """The directory PettingZoo searches for `roms/<game>.bin`: `ale-py`'s package, which ships them."""
    import ale_py

    return Path(ale_py.__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class AtariSettings:
    frame_skip: int = 4  # emulator frames per step, the joint action repeated
    frame_size: int = 84  # square side of the resized grayscale frame
    frame_stack: int = 4  # frames stacked as channels
    interpolation: str = "area"  # tinyscaler's resize mode: area (DQN's cv2.INTER_AREA), bilinear, nearest
    agent_indicator: bool = True  # one channel per agent, 255 in the observing agent's
    clip_rewards: bool = True  # each step's summed reward clipped to [-1, 1]
    max_cycles: int = 100_000  # emulator frames before the episode is truncated (PettingZoo's default)

    def channels(self, num_agents: int) -> int:
        return self.frame_stack + (num_agents if self.agent_indicator else 0)

    def observation_shape(self, num_agents: int) -> tuple[int, int, int]:
        """[channels, height, width]: torch's layout, so a network reshapes without a copy."""
        return (self.channels(num_agents), self.frame_size, self.frame_size)


def _parallel_game(game: str, **kwargs):
    """The game's own `ParallelAtariEnv`, without the AEC round-trip and checking wrappers that
    PettingZoo's `parallel_env()` puts around it."""
    try:
        module = importlib.import_module(f"pettingzoo.atari.{game}")
    except ImportError as exc:
        raise ValueError(
            f"unknown Atari game {game!r} ({exc}); use a module of pettingzoo.atari such as 'pong_v3'"
        ) from None
    with warnings.catch_warnings():  # the module's own constructor is the one that takes game options
        warnings.simplefilter("ignore", DeprecationWarning)
        return module.raw_env(auto_rom_install_path=str(rom_directory()), **kwargs).unwrapped


class AtariEnv(MultiAgentEnv):
    """A PettingZoo multi-player Atari game, every agent acting every step, preprocessed (module doc)."""

    def __init__(self, game: str = "pong_v3", settings: AtariSettings = AtariSettings(), emulator=None, **game_kwargs):
        """`emulator`: a parallel env that hands out grayscale frames in place of the game's own
        (tests script one frame by frame); by default PettingZoo's `game`."""
        self.settings = s = settings
        self.env = emulator or _parallel_game(game, obs_type="grayscale_image", max_cycles=s.max_cycles, **game_kwargs)
        agents = tuple(self.env.possible_agents)
        num_actions = {a: int(self.env.action_space(a).n) for a in agents}
        self.observation_shape = s.observation_shape(len(agents))
        size = int(np.prod(self.observation_shape))
        self.spec = EnvSpec(
            name=f"atari:{game}",
            agents=agents,
            observation_size=dict.fromkeys(agents, size),
            num_actions=num_actions,
            simultaneous=True,
            state_size=s.frame_stack * s.frame_size * s.frame_size,
            observation_dtype="uint8",
        )
        self._masks_all = {a: np.ones(n, dtype=bool) for a, n in num_actions.items()}
        self._stack = np.zeros((s.frame_stack, s.frame_size, s.frame_size), dtype=np.uint8)  # oldest first
        self._live: list[AgentID] = []
        self._terminations: dict[AgentID, bool] = {}
        self._truncations: dict[AgentID, bool] = {}
        self._masks: dict[AgentID, np.ndarray] = {}
        self._steps = 0

    def reset(self, seed: int | None = None) -> TimeStep:
        observations, _ = self.env.reset(seed=seed)
        self._live = list(self.env.agents)
        self._terminations = dict.fromkeys(self._live, False)
        self._truncations = dict.fromkeys(self._live, False)
        self._steps = 0
        self._stack[:] = 0
        frame = next(iter(observations.values()))
        self._push(frame)
        infos = {a: {"points": 0.0, "serve_penalty": 0.0} for a in self._live}
        return self._timestep(dict.fromkeys(self._live, 0.0), infos)

    def step(self, actions: dict[AgentID, int]) -> TimeStep:
        check_actions(self.spec.name, self._masks, actions)
        self._steps += 1
        actions = {agent: int(action) for agent, action in actions.items()}
        raw = dict.fromkeys(self._terminations, 0.0)
        points = dict.fromkeys(self._terminations, 0.0)
        frames: list[np.ndarray] = []
        for _ in range(self.settings.frame_skip):
            observations, rewards, terminations, truncations, _ = self.env.step(actions)
            _split_rewards(rewards, raw, points)
            if observations:
                frames = [*frames[-1:], next(iter(observations.values()))]
            self._terminations.update((a, bool(d)) for a, d in terminations.items())
            self._truncations.update((a, bool(d)) for a, d in truncations.items())
            if any(terminations.values()) or any(truncations.values()):
                break
        self._push(np.maximum(frames[0], frames[-1]) if len(frames) == 2 else frames[-1])
        self._live = [a for a in self._live if not (self._terminations[a] or self._truncations[a])]
        infos = {a: {"points": points[a], "serve_penalty": raw[a] - points[a]} for a in self._terminations}
        if self.settings.clip_rewards:
            raw = {a: float(np.clip(r, -1.0, 1.0)) for a, r in raw.items()}
        check_rewards(self.spec.name, self._steps, raw)
        for agent, truncated in self._truncations.items():
            if truncated and not self._terminations[agent]:  # cut by max_cycles: learners bootstrap from this
                infos[agent]["final_observation"] = self._observation(agent)
        return self._timestep(raw, infos)

    def state(self) -> np.ndarray:
        """The stacked frames without the agent indicator: the screen is everything there is to see."""
        return self._stack.reshape(-1).astype(np.float32)

    def close(self) -> None:
        self.env.close()

    def _push(self, frame: np.ndarray) -> None:
        import tinyscaler

        s = self.settings
        self._stack[:-1] = self._stack[1:]
        # in float32, rounded: tinyscaler's own uint8 path truncates (a constant 5 comes out partly 4)
        frame = frame.reshape(frame.shape[:2]).astype(np.float32)
        self._stack[-1] = np.rint(tinyscaler.scale(frame, (s.frame_size, s.frame_size), mode=s.interpolation))

    def _observation(self, agent: AgentID) -> np.ndarray:
        stack = self.settings.frame_stack
        observation = np.empty(self.observation_shape, dtype=np.uint8)
        observation[:stack] = self._stack
        if self.settings.agent_indicator:
            observation[stack:] = 0
            observation[stack + self.spec.agents.index(agent)] = 255
        return observation.reshape(-1)

    def _timestep(self, rewards: dict[AgentID, float], infos: dict[AgentID, dict]) -> TimeStep:
        observations = {a: self._observation(a) for a in self._live}
        self._masks = {a: self._masks_all[a] for a in self._live}
        self._last = TimeStep(
            observations, dict(self._masks), rewards, dict(self._terminations), dict(self._truncations), infos
        )
        return self._last


def _split_rewards(rewards: dict[AgentID, float], total: dict[AgentID, float], points: dict[AgentID, float]) -> None:
    """Add one emulator frame's rewards to `total`, and their zero-sum part to `points`.

    A frame whose rewards sum to zero is a point (+1 to the scorer, -1 to the other); a -1 with
    nobody's +1 beside it is a serve penalty (module doc).
    """
    for agent, reward in rewards.items():
        total[agent] += float(reward)
    if sum(rewards.values()) == 0:
        for agent, reward in rewards.items():
            points[agent] += float(reward)
