"""OpenSpiel games as a `MultiAgentEnv`: the adapter that PSRO's rollouts run on.

Player p is agent "player_p". Chance nodes never reach the agents: the environment samples them
with its own numpy Generator, so a seeded reset replays the same deals. At a simultaneous-move
node every player with legal actions acts in the same step (`state.apply_actions`).

This is on the rollout hot path, so `step` does only what the TimeStep needs: one tensor, one mask
and one information-state string per acting player, and no copies of the game state.
"""

from __future__ import annotations

import numpy as np
import pyspiel

from marl_core.envs.api import AgentID, EnvSpec, MultiAgentEnv, TimeStep, check_actions, check_rewards
from marl_core.games.openspiel import load_game


def _load(game: str | pyspiel.Game) -> tuple[str, pyspiel.Game]:
    """The game and its name; game strings go through `load_game` for its one-line errors."""
    if not isinstance(game, str):
        return str(game), game
    loaded = load_game(game)
    if loaded.get_type().short_name == "turn_based_simultaneous_game":
        # load_game turns simultaneous games into turn-based ones for PSRO's game tree; the
        # environment plays them as they are, with every player moving at once.
        loaded = pyspiel.load_game(game)
    return game.strip(), loaded


def _sample_chance(state: pyspiel.State, rng: np.random.Generator) -> int:
    """One chance outcome by inverse CDF: cheaper than rng.choice for OpenSpiel's short lists."""
    u = rng.random()
    for action, probability in state.chance_outcomes():
        u -= probability
        if u < 0.0:
            return action
    return action  # the probabilities summed to slightly under u: rounding, take the last outcome


class OpenSpielEnv(MultiAgentEnv):
    """An OpenSpiel game; `seed` starts the chance stream that unseeded resets continue."""

    def __init__(self, game: str | pyspiel.Game, seed: int | None = None):
        name, self.game = _load(game)
        game_type = self.game.get_type()
        if game_type.provides_information_state_tensor:
            self._tensor = pyspiel.State.information_state_tensor
            size = self.game.information_state_tensor_size()
        elif game_type.provides_observation_tensor:
            self._tensor = pyspiel.State.observation_tensor
            size = self.game.observation_tensor_size()
        else:
            raise ValueError(f"OpenSpiel game {name!r} provides no observation tensor")
        if not game_type.provides_information_state_string:
            raise ValueError(f"OpenSpiel game {name!r} provides no information-state strings")
        self._agents: tuple[AgentID, ...] = tuple(f"player_{p}" for p in range(self.game.num_players()))
        self.spec = EnvSpec(
            name=name,
            agents=self._agents,
            observation_size=dict.fromkeys(self._agents, size),
            num_actions=dict.fromkeys(self._agents, self.game.num_distinct_actions()),
            simultaneous=game_type.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS,
        )
        # Poker and most OpenSpiel games pay only at the end: read returns() once instead of
        # rewards() after every move and chance outcome.
        self._terminal_rewards_only = game_type.reward_model == pyspiel.GameType.RewardModel.TERMINAL
        self._rng = np.random.default_rng(seed)
        self._state: pyspiel.State | None = None
        self._masks: dict[AgentID, np.ndarray] = {}  # the acting agents' masks, to check step()
        self._steps = 0
        # Templates copied into each TimeStep: dict.copy() is several times cheaper than fromkeys.
        self._zeros = dict.fromkeys(self._agents, 0.0)
        self._falses = dict.fromkeys(self._agents, False)
        self._trues = dict.fromkeys(self._agents, True)

    @property
    def game_state(self) -> pyspiel.State | None:
        """The current OpenSpiel state, to read (its history, returns); never apply actions to it."""
        return self._state

    def reset(self, seed: int | None = None) -> TimeStep:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._state = self.game.new_initial_state()
        self._steps = 0
        self._play_chance()
        return self._timestep(self._zeros.copy())

    def step(self, actions: dict[AgentID, int]) -> TimeStep:
        check_actions(self.spec.name, self._masks, actions)
        self._steps += 1
        state = self._state
        if self.spec.simultaneous and state.is_simultaneous_node():
            joint = [int(actions.get(agent, pyspiel.INVALID_ACTION)) for agent in self._agents]
            state.apply_actions(joint)
        else:
            (action,) = actions.values()
            state.apply_action(int(action))
        return self._timestep(self._rewards_of_move())

    def _rewards_of_move(self) -> dict[AgentID, float]:
        """Play the chance nodes after a move; the rewards of the move and those chance outcomes."""
        state = self._state
        if self._terminal_rewards_only:
            self._play_chance()
            if not state.is_terminal():
                return self._zeros.copy()
            totals = state.returns()
        else:
            totals = state.rewards()
            while state.is_chance_node():
                state.apply_action(_sample_chance(state, self._rng))
                totals = [total + reward for total, reward in zip(totals, state.rewards())]
        rewards = dict(zip(self._agents, totals))
        check_rewards(self.spec.name, self._steps, rewards)
        return rewards

    def _play_chance(self) -> None:
        state = self._state
        while state.is_chance_node():
            state.apply_action(_sample_chance(state, self._rng))

    def _timestep(self, rewards: dict[AgentID, float]) -> TimeStep:
        state = self._state
        if state.is_terminal():
            self._masks = {}
            self._last = TimeStep({}, {}, rewards, self._trues.copy(), self._falses.copy(), {})
            return self._last
        if self.spec.simultaneous and state.is_simultaneous_node():
            players = [p for p in range(len(self._agents)) if state.legal_actions(p)]
        else:
            players = [state.current_player()]
        observations, masks, infos = {}, {}, {}
        for p in players:
            agent = self._agents[p]
            observations[agent] = np.array(self._tensor(state, p), dtype=np.float32)
            masks[agent] = np.array(state.legal_actions_mask(p), dtype=bool)
            infos[agent] = {"infostate": state.information_state_string(p)}
        self._masks = masks
        self._last = TimeStep(observations, masks, rewards, self._falses.copy(), self._falses.copy(), infos)
        return self._last
