"""The game tree of an OpenSpiel game in sequence form, as numpy arrays.

Why sequence form: with perfect recall, the probability that a player's own actions lead to a
terminal history is a product along that player's *sequence* of (information state, action)
pairs. Storing, for every terminal, each player's last sequence turns the exact questions PSRO
asks into array operations instead of tree walks:

- expected payoff of a profile  = sum_z chance(z) * u(z) * prod_p reach_p(seq_p(z))
- a population mixed at the strategy level (OpenSpiel's ``policy_aggregator``) has reach equal
  to the meta-strategy-weighted sum of its members' reaches (Kuhn's theorem), and
- a best response is one backward pass over a player's information states.

Sequence ids for a player with I information states and A distinct actions:
0 is the empty sequence, ``1 + i * A + a`` is "at information state i, take action a".
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pyspiel

from marl_core.games.openspiel import GameError, load_game

DEFAULT_MAX_HISTORIES = 3_000_000


@dataclasses.dataclass(frozen=True)
class PlayerTree:
    """One player's information states and how they chain into sequences."""

    infostates: tuple[str, ...]
    legal: np.ndarray  # [I, A] bool: legal actions at each information state
    parent_seq: np.ndarray  # [I] sequence id of the player's previous decision (0: none)
    levels: tuple[np.ndarray, ...]  # information-state indices grouped by own-decision depth
    terminal_seq: np.ndarray  # [Z] the player's last sequence before each terminal
    index: dict[str, int]  # information-state string -> row

    @property
    def num_infostates(self) -> int:
        return len(self.infostates)

    @property
    def num_actions(self) -> int:
        return self.legal.shape[1]

    @property
    def num_sequences(self) -> int:
        return 1 + self.legal.size

    def sequence_ids(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), A] sequence ids of every action at the given information states."""
        return 1 + rows[:, None] * self.num_actions + np.arange(self.num_actions)

    def uniform_policy(self) -> np.ndarray:
        return self.legal / self.legal.sum(axis=1, keepdims=True)


@dataclasses.dataclass(frozen=True)
class GameTree:
    game_string: str
    players: tuple[PlayerTree, ...]
    chance_reach: np.ndarray  # [Z] product of chance probabilities on the way to each terminal
    utilities: np.ndarray  # [Z, n] terminal returns
    num_histories: int

    @property
    def num_players(self) -> int:
        return len(self.players)

    @property
    def num_actions(self) -> int:
        return self.players[0].num_actions

    def weighted_utilities(self) -> np.ndarray:
        """[Z, n] chance(z) * u(z): the part of every payoff that no player controls."""
        return self.chance_reach[:, None] * self.utilities

    def expected_returns(self, weight: np.ndarray) -> np.ndarray:
        """[m, n] expected returns from [m, Z] terminal weights (the players' reach products).

        Each row is summed on its own, by numpy's pairwise sum over the terminals, and never by
        a BLAS matrix product: BLAS picks its kernel (and with it the order of the additions)
        by the number of rows and by the CPU, so the same profile evaluated in a batch of one
        (iteration 0 of a run) and in a batch of four (`psro evaluate`) differed in the last
        bit on some machines. Summed row by row, a profile's payoff depends only on its own
        reaches, so every path that evaluates it stores the same float.
        """
        weight = np.atleast_2d(np.asarray(weight, dtype=np.float64))
        utilities = np.ascontiguousarray(self.weighted_utilities().T)  # [n, Z]
        return np.stack([(weight * row).sum(axis=1) for row in utilities], axis=1)


class _PlayerBuilder:
    def __init__(self, num_actions: int):
        self.num_actions = num_actions
        self.index: dict[str, int] = {}
        self.legal: list[np.ndarray] = []
        self.parent_seq: list[int] = []
        self.depth: list[int] = []
        self.terminal_seq: list[int] = []

    def visit(self, infostate: str, legal_actions: list[int], seq: int, depth: int) -> int:
        row = self.index.get(infostate)
        if row is None:
            row = len(self.legal)
            self.index[infostate] = row
            mask = np.zeros(self.num_actions, dtype=bool)
            mask[legal_actions] = True
            self.legal.append(mask)
            self.parent_seq.append(seq)
            self.depth.append(depth)
        elif self.parent_seq[row] != seq:
            raise GameError(f"information state {infostate!r} breaks perfect recall")
        return row

    def build(self) -> PlayerTree:
        num = len(self.legal)
        legal = np.array(self.legal, dtype=bool).reshape(num, self.num_actions)
        depth = np.array(self.depth, dtype=np.int64)
        levels = tuple(np.flatnonzero(depth == d) for d in range(int(depth.max(initial=-1)) + 1))
        infostates = [""] * num
        for name, row in self.index.items():
            infostates[row] = name
        return PlayerTree(
            infostates=tuple(infostates),
            legal=legal,
            parent_seq=np.array(self.parent_seq, dtype=np.int64),
            levels=levels,
            terminal_seq=np.array(self.terminal_seq, dtype=np.int64),
            index=dict(self.index),
        )


def _enumerate(game: pyspiel.Game, game_string: str, max_histories: int) -> GameTree:
    num_players = game.num_players()
    num_actions = game.num_distinct_actions()
    builders = [_PlayerBuilder(num_actions) for _ in range(num_players)]
    chance_reach: list[float] = []
    utilities: list[list[float]] = []
    histories = 0
    # Each stack entry: state, chance reach, each player's current sequence and decision depth.
    stack = [(game.new_initial_state(), 1.0, (0,) * num_players, (0,) * num_players)]
    while stack:
        state, reach, seqs, depths = stack.pop()
        histories += 1
        if histories > max_histories:
            raise GameError(
                f"game {game_string!r} has more than {max_histories} histories; "
                "too large for the exact oracle and evaluator"
            )
        if state.is_terminal():
            chance_reach.append(reach)
            utilities.append(state.returns())
            for player, builder in enumerate(builders):
                builder.terminal_seq.append(seqs[player])
            continue
        if state.is_chance_node():
            for action, prob in state.chance_outcomes():
                if prob > 0:
                    stack.append((state.child(action), reach * prob, seqs, depths))
            continue
        player = state.current_player()
        if player < 0:
            raise GameError(f"game {game_string!r} reached an unsupported node (player {player})")
        legal_actions = state.legal_actions()
        row = builders[player].visit(
            state.information_state_string(player), legal_actions, seqs[player], depths[player]
        )
        next_depths = depths[:player] + (depths[player] + 1,) + depths[player + 1 :]
        for action in legal_actions:
            seq = 1 + row * num_actions + action
            next_seqs = seqs[:player] + (seq,) + seqs[player + 1 :]
            stack.append((state.child(action), reach, next_seqs, next_depths))
    return GameTree(
        game_string=game_string,
        players=tuple(b.build() for b in builders),
        chance_reach=np.array(chance_reach, dtype=np.float64),
        utilities=np.array(utilities, dtype=np.float64).reshape(-1, num_players),
        num_histories=histories,
    )


@functools.lru_cache(maxsize=8)
def build_tree(game_string: str, max_histories: int = DEFAULT_MAX_HISTORIES) -> GameTree:
    """Enumerate the game once per process; workers reuse it across tasks."""
    return _enumerate(load_game(game_string), game_string, max_histories)


def sequence_reach(tree: PlayerTree, policies: np.ndarray) -> np.ndarray:
    """Own reach probability of every sequence, for a batch of policies.

    policies: [K, I, A] action probabilities; returns [K, S].
    """
    policies = np.asarray(policies, dtype=np.float64)
    reach = np.zeros((policies.shape[0], tree.num_sequences))
    reach[:, 0] = 1.0
    for rows in tree.levels:  # parents always sit at a lower depth
        parent = reach[:, tree.parent_seq[rows]]
        reach[:, tree.sequence_ids(rows)] = parent[:, :, None] * policies[:, rows, :]
    return reach


def profile_values(tree: GameTree, reaches: list[np.ndarray]) -> np.ndarray:
    """Expected returns [n] of one profile given each player's sequence reach [S_p]."""
    weight = np.ones_like(tree.chance_reach)
    for player_tree, reach in zip(tree.players, reaches):
        weight = weight * reach[player_tree.terminal_seq]
    return tree.expected_returns(weight[None])[0]


def best_response(tree: GameTree, player: int, reaches: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """Exact best response of ``player`` to the others' sequence reaches.

    Returns the best-response value and a deterministic policy [I, A]. ``reaches[player]`` is
    ignored. Ties go to the lowest action, which makes the oracle deterministic.
    """
    own = tree.players[player]
    weight = tree.chance_reach * tree.utilities[:, player]
    for other, (other_tree, reach) in enumerate(zip(tree.players, reaches)):
        if other != player:
            weight = weight * reach[other_tree.terminal_seq]
    # value[s]: expected return credited to own sequence s, before choosing what follows it.
    value = np.bincount(own.terminal_seq, weights=weight, minlength=own.num_sequences)
    choice = np.zeros(own.num_infostates, dtype=np.int64)
    for rows in reversed(own.levels):
        action_values = np.where(own.legal[rows], value[own.sequence_ids(rows)], -np.inf)
        choice[rows] = action_values.argmax(axis=1)
        np.add.at(value, own.parent_seq[rows], action_values.max(axis=1))
    policy = np.zeros(own.legal.shape)
    policy[np.arange(own.num_infostates), choice] = 1.0
    return float(value[0]), policy
