"""Tabular Q-learning by certainty equivalence: Q-values of the model the observed transitions
make, for environments with few, exactly repeating observations (small games' information states).

A learned best response to a fixed mixture of opponents is a single-agent problem whose states
are the learner's information states; where those fit in a table, nothing learns them with fewer
episodes than the empirical model. The trainer keeps, per (observation, action), how often it was
taken, the reward it gave and the observations that followed, and after every batch computes
Q(s, a) = mean reward + gamma * sum over s' of P(s' | s, a) max_a' Q(s', a') by value iteration
(sample-average Q-learning taken to its fixed point). It draws nothing and needs no learning rate:
the same experience gives the same table. Rollout workers act epsilon-greedily on the table; an
observation the table has not seen, or one where no legal action was tried, is played uniformly.

Read top to bottom: `TabularQPolicy` (the acting side, shipped to workers as tensors),
`TabularQTrainer` (the counts and the value iteration).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from marl_core.rl import Algorithm
from marl_core.rl.batch import Experience
from marl_core.rl.dqn import linear_epsilon
from marl_core.rl.policy import NetworkPolicy
from marl_core.rl.sampling import uniform_legal
from marl_core.rl.settings import TabularQConfig


def _row_bytes(obs: np.ndarray) -> list[bytes]:
    """Each observation row as bytes: the table's key."""
    obs = np.ascontiguousarray(obs, dtype=np.float32)
    return [row.tobytes() for row in obs]


class TabularQPolicy(NetworkPolicy):
    """Epsilon-greedy on a table of Q-values keyed by the observation (its float32 bytes).

    Its tensors are the observations seen (`keys`), their Q-values (`q`, the learned parameter) and
    which actions were tried at each (`tried`); a greedy choice is among tried legal actions only,
    ties to the lowest index. They grow as the trainer meets new observations, so loading weights
    takes their sizes from the weights."""

    def __init__(self, obs_size: int, num_actions: int, config: TabularQConfig):
        super().__init__(obs_size, num_actions)
        self.register_buffer("keys", torch.zeros((0, obs_size), dtype=torch.float32))
        self.q = nn.Parameter(torch.zeros((0, num_actions), dtype=torch.float64), requires_grad=False)
        self.register_buffer("tried", torch.zeros((0, num_actions), dtype=torch.bool))
        self.register_buffer("epsilon", torch.tensor(float(config.epsilon_start)))
        self.epsilon_eval = config.epsilon_eval
        self.index: dict[bytes, int] = {}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """As any module's, once the table has the size of the weights' table."""
        missing = {"keys", "q", "tried", "epsilon"} - set(state_dict)
        if missing:
            raise ValueError(f"tabular Q weights lack {sorted(missing)}")
        self.set_table(state_dict["keys"], state_dict["q"], state_dict["tried"])
        return super().load_state_dict(state_dict, strict, assign)

    def set_table(self, keys: torch.Tensor, q: torch.Tensor, tried: torch.Tensor) -> None:
        self.keys = keys.detach().to(torch.float32).clone()
        self.q = nn.Parameter(q.detach().to(torch.float64).clone(), requires_grad=False)
        self.tried = tried.detach().to(torch.bool).clone()
        self.index = {key: row for row, key in enumerate(_row_bytes(self.keys.numpy()))}

    def _greedy(self, obs: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Greedy actions [B], the mask [B, A], and which rows have a greedy action at all [B]."""
        obs_t, mask_t = self._tensors(obs, mask)
        mask = mask_t.numpy()
        rows = np.array([self.index.get(key, -1) for key in _row_bytes(obs_t.numpy())], dtype=np.int64)
        known = rows >= 0
        values = np.full(mask.shape, -np.inf)
        tried = np.zeros(mask.shape, dtype=bool)
        tried[known] = self.tried.numpy()[rows[known]] & mask[known]
        values[tried] = self.q.detach().numpy()[rows[known]][tried[known]]
        return values.argmax(axis=1), mask, tried.any(axis=1)

    def act(self, obs, mask, explore, generator):
        greedy, mask, known = self._greedy(obs, mask)
        epsilon = float(self.epsilon) if explore else self.epsilon_eval
        random = ~known | (generator.random(len(greedy)) < epsilon)
        return np.where(random, uniform_legal(mask, generator), greedy), {}

    def action_probs(self, obs, mask):
        greedy, mask, known = self._greedy(obs, mask)
        uniform = mask / mask.sum(axis=1, keepdims=True)
        probs = self.epsilon_eval * uniform
        probs[np.arange(len(greedy)), greedy] += 1.0 - self.epsilon_eval
        return np.where(known[:, None], probs, uniform)


class TabularQTrainer:
    """The counts of the observed transitions, and the Q-table their model gives (inside `.policy`)."""

    MAX_SWEEPS = 10_000  # an episodic game stops after its depth; discounted cycles converge geometrically

    def __init__(self, obs_size: int, num_actions: int, config: TabularQConfig | None = None):
        self.config = config = config or TabularQConfig()
        self.num_actions = num_actions
        self.policy = TabularQPolicy(obs_size, num_actions, config)
        self.keys = np.zeros((0, obs_size), np.float32)  # row -> observation
        self.index: dict[bytes, int] = {}  # observation bytes -> row
        self.visits = np.zeros((0, num_actions))  # [S, A] times each action was taken at each observation
        self.reward_sum = np.zeros((0, num_actions))
        self.successors: dict[
            tuple[int, int], int
        ] = {}  # (state * A + action, next state) -> count; the rest ended the episode
        self.env_steps = 0
        self.sweeps = 0  # value-iteration sweeps of the last update

    def epsilon(self) -> float:
        return linear_epsilon(self.config, self.env_steps)

    def _rows(self, obs: np.ndarray) -> np.ndarray:
        """Each observation's row, new observations appended (all or, past `max_states`, none)."""
        index, rows, new = self.index, [], {}
        for key in _row_bytes(obs):
            row = index.get(key)
            if row is None:
                row = new.setdefault(key, len(self.keys) + len(new))
            rows.append(row)
        if new:
            total = len(self.keys) + len(new)
            if total > self.config.max_states:
                raise ValueError(
                    f"tabular_q: {total} distinct observations, more than max_states={self.config.max_states}; "
                    "this environment's observations do not fit a table (use a network oracle such as dqn)"
                )
            index.update(new)
            added = np.frombuffer(b"".join(new), dtype=np.float32).reshape(len(new), -1)
            self.keys = np.concatenate([self.keys, added])
            grow = np.zeros((len(new), self.num_actions))
            self.visits = np.concatenate([self.visits, grow])
            self.reward_sum = np.concatenate([self.reward_sum, grow])
        return np.asarray(rows, dtype=np.int64)

    def learn(self, experience: Experience) -> dict[str, float]:
        """Count the transitions, then recompute the Q-table of the model they make."""
        experience.validate()
        going_on = ~experience.done
        state = self._rows(experience.obs)
        following = self._rows(experience.next_obs[going_on])  # an episode's end is no state to value
        np.add.at(self.visits, (state, experience.action), 1.0)
        np.add.at(self.reward_sum, (state, experience.action), experience.reward)
        taken = state[going_on] * self.num_actions + experience.action[going_on]
        pairs, counts = np.unique(np.stack([taken, following], axis=1), axis=0, return_counts=True)
        for key, count in zip(map(tuple, pairs.tolist()), counts.tolist()):
            self.successors[key] = self.successors.get(key, 0) + count
        self.env_steps += len(experience)
        self._publish(self._solve())
        return {
            "env_steps": float(self.env_steps),
            "states": float(len(self.keys)),
            "epsilon": self.epsilon(),
            "sweeps": float(self.sweeps),
        }

    def _solve(self) -> np.ndarray:
        """Q [S, A] of the empirical model by value iteration, to its fixed point (an episodic
        game's transitions form no cycles, so that takes as many sweeps as its longest episode)."""
        tried = self.visits > 0
        visits = np.where(tried, self.visits, 1.0).ravel()
        mean_reward = self.reward_sum.ravel() / visits
        pair, successor, count = self._successor_table().T
        probability = count / visits[pair]
        values = np.zeros(len(self.keys))
        for sweeps in range(1, self.MAX_SWEEPS + 1):
            self.sweeps = sweeps
            q = mean_reward + self.config.gamma * np.bincount(
                pair, probability * values[successor], minlength=visits.size
            )
            q = q.reshape(self.visits.shape)
            new_values = np.where(tried.any(axis=1), np.where(tried, q, -np.inf).max(axis=1), 0.0)
            if np.abs(new_values - values).max(initial=0.0) <= 1e-12:
                break
            values = new_values
        return q

    def _successor_table(self) -> np.ndarray:
        """[N, 3] int64: (state * A + action, next state, count) per pair seen."""
        return np.array(
            [(pair, successor, count) for (pair, successor), count in self.successors.items()], dtype=np.int64
        ).reshape(-1, 3)

    def _publish(self, q: np.ndarray) -> None:
        self.policy.set_table(torch.from_numpy(self.keys), torch.from_numpy(q), torch.from_numpy(self.visits > 0))
        self.policy.epsilon.fill_(self.epsilon())

    def state_dict(self) -> dict:
        """Everything needed to go on exactly, as tensors (loads with `torch.load(weights_only=True)`)."""
        return {
            "keys": torch.from_numpy(self.keys.copy()),
            "visits": torch.from_numpy(self.visits.copy()),
            "reward_sum": torch.from_numpy(self.reward_sum.copy()),
            "successors": torch.from_numpy(self._successor_table()),
            "env_steps": self.env_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.keys = state["keys"].numpy().copy()
        self.visits = state["visits"].numpy().copy()
        self.reward_sum = state["reward_sum"].numpy().copy()
        self.successors = {(int(p), int(s)): int(c) for p, s, c in state["successors"].tolist()}
        self.env_steps = int(state["env_steps"])
        self.index = {key: row for row, key in enumerate(_row_bytes(self.keys))}
        self._publish(self._solve() if len(self.keys) else np.zeros((0, self.num_actions)))


ALGORITHM = Algorithm(TabularQConfig, TabularQTrainer, TabularQPolicy)
