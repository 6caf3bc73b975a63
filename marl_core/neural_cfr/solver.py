"""Neural CFR: Deep CFR (Brown et al. 2019) engineered for wall time, on any two-player zero-sum
OpenSpiel game that has information-state tensors.

What it learns from is play only: each iteration runs external-sampling traversals through the
game's state API (`child` to try each of the traverser's actions, `apply_action` for a sampled
chance outcome or opponent move), the way MCCFR does. The enumerated game tree is never used
here; it stays the instrument that measures the result (`exact_exploitability`).

One iteration t, for each player p in turn:

1. p's and the opponent's advantage networks give both current strategies (Hedge, a softmax
   of the advantages whose inverse temperature grows as sqrt(t); or Deep CFR's regret
   matching). The networks are fixed during the traversals, so each information state is asked
   once per phase and its answer cached: the traversals then cost what the game costs, not
   what a forward pass costs.
2. `traversals` external-sampling traversals for p. At p's decisions every action is tried; the
   sampled regret of each (its sampled value minus the strategy's) goes to p's regret memory.
   At the opponent's decisions one action is drawn from its current strategy, and that strategy
   goes to the opponent's strategy memory.
3. p's advantage network trains on its regret memory, each sample weighted by its iteration
   (linear CFR), starting from last iteration's weights. Its minimiser at an information state
   is the weighted average of the regrets sampled there: p's linearly weighted cumulative
   counterfactual regret divided by a positive number of that information state (how much play
   reached it). Regret matching is blind to that divisor; Hedge reads the average in units of
   the game's payoffs, which is what lets one temperature serve every information state.
Then each player's average-policy network trains on its strategy memory with the same weights.
An external-sampling traversal reaches the opponent's information state I with probability
proportional to the opponent's own reach of I (the traverser's actions are all taken, chance is
the same every iteration), so the minimiser of that loss is CFR's average strategy. The
average-policy networks are the members that are measured and kept (`members`).

The whole state (networks, optimizers, memories, random generators, the cache of information
state tensors met in play) is a weights-only state dict, and a run restored from it after
iteration N continues exactly as the uninterrupted run would.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time

import numpy as np
import pyspiel
import torch

from marl_core.games.exploitability import NashConvReport, nash_conv
from marl_core.games.openspiel import load_game
from marl_core.games.tree import build_tree
from marl_core.neural_cfr.config import check_game
from marl_core.neural_cfr.memory import Reservoir
from marl_core.neural_cfr.networks import AdvantageNetwork, hedge, regret_matching
from marl_core.neural_cfr.settings import NeuralCFRSettings
from marl_core.policies.tabularize import tabularize
from marl_core.rl.average_policy import AveragePolicyNetwork


class Encodings:
    """The information states of one player met in play: their tensors and legal actions, and
    (refreshed every phase, while the networks are fixed) the current strategy at each."""

    def __init__(self, num_actions: int):
        self.num_actions = num_actions
        self.clear()

    def clear(self) -> None:
        self.index: dict[str, int] = {}  # information-state string -> row
        self.obs: list[np.ndarray] = []  # the tensor the networks see
        self.masks: list[np.ndarray] = []
        self.legal: list[list[int]] = []
        self.strategy: list[np.ndarray] = []  # [A] per row, computed this phase
        self.strategy_legal: list[list[float]] = []  # the same over the legal actions, for drawing

    def __len__(self) -> int:
        return len(self.obs)

    def add(self, key: str, state: pyspiel.State, player: int) -> int:
        legal = state.legal_actions(player)
        mask = np.zeros(self.num_actions, dtype=bool)
        mask[legal] = True
        self.index[key] = len(self.obs)
        self.obs.append(np.asarray(state.information_state_tensor(player), dtype=np.float32))
        self.masks.append(mask)
        self.legal.append(legal)
        return len(self.obs) - 1

    def set_strategies(self, rows: np.ndarray) -> None:
        """Strategies [n, A] of the first n rows (all those known when the phase began)."""
        self.strategy = list(rows)
        self.strategy_legal = [row[legal].tolist() for row, legal in zip(rows, self.legal)]

    def append_strategy(self, row: np.ndarray) -> None:
        self.strategy.append(row)
        self.strategy_legal.append(row[self.legal[len(self.strategy_legal)]].tolist())

    def state_dict(self) -> dict:
        keys = sorted(self.index, key=self.index.get)
        obs = torch.from_numpy(np.stack(self.obs)) if self.obs else torch.zeros(0)
        masks = torch.from_numpy(np.stack(self.masks)) if self.masks else torch.zeros(0, dtype=torch.bool)
        return {"keys": keys, "obs": obs, "masks": masks}

    def load_state_dict(self, state: dict) -> None:
        self.clear()
        for key, obs, mask in zip(state["keys"], state["obs"].numpy(), state["masks"].numpy()):
            self.index[key] = len(self.obs)
            self.obs.append(obs.copy())
            self.masks.append(mask.copy())
            self.legal.append(np.flatnonzero(mask).tolist())


@dataclasses.dataclass(frozen=True)
class IterationStats:
    iteration: int
    regret_samples: int  # added to the regret memories this iteration, both players
    strategy_samples: int
    advantage_loss: float  # mean over both players' last gradient steps
    policy_loss: float
    traversal_seconds: float
    training_seconds: float


def current_strategy(
    advantages: torch.Tensor, mask: torch.Tensor, settings: NeuralCFRSettings, iteration: int, payoff_range: float
) -> torch.Tensor:
    """The strategy of iteration `iteration` from the advantage network's outputs."""
    if settings.strategy == "hedge":
        return hedge(advantages, mask, settings.hedge_scale * max(iteration, 1) ** 0.5 / payoff_range)
    return regret_matching(advantages, mask, settings.no_regret_action)


class CurrentStrategy:
    """CFR's current strategy as a policy (`action_probs(obs, mask)`), for measuring it."""

    def __init__(self, network: AdvantageNetwork, settings: NeuralCFRSettings, iteration: int, payoff_range: float):
        self.network = network
        self.settings = settings
        self.iteration = iteration
        self.payoff_range = payoff_range

    def action_probs(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            advantages = self.network(torch.as_tensor(obs, dtype=torch.float32)).double()
            mask = torch.as_tensor(mask)
            return current_strategy(advantages, mask, self.settings, self.iteration, self.payoff_range).numpy()


def _draw(rng: random.Random, probs: list[float]) -> int:
    """Index drawn from probabilities (summing to about 1): inverse CDF, the last one on rounding."""
    u = rng.random()
    for index, p in enumerate(probs):
        u -= p
        if u < 0:
            return index
    return len(probs) - 1


class NeuralCFR:
    """The state of one run; `iterate` advances it by one CFR iteration."""

    def __init__(self, game_string: str, settings: NeuralCFRSettings | None = None):
        self.game_string = game_string
        self.settings = settings or NeuralCFRSettings()
        self.game = load_game(game_string)
        check_game(self.game, game_string)
        self.num_actions = self.game.num_distinct_actions()
        self.payoff_range = max(abs(self.game.max_utility()), abs(self.game.min_utility()))
        self.obs_size = int(np.prod(self.game.information_state_tensor_shape()))
        s = self.settings
        with torch.random.fork_rng():
            torch.manual_seed(s.seed)
            self.advantage = [self._advantage_network() for _ in range(2)]
            self.policy = [AveragePolicyNetwork(self.obs_size, self.num_actions, s.policy_hidden) for _ in range(2)]
        self.advantage_optimizer = [torch.optim.Adam(n.parameters(), lr=s.advantage_lr) for n in self.advantage]
        self.policy_optimizer = [torch.optim.Adam(n.parameters(), lr=s.policy_lr) for n in self.policy]
        self.regrets = [Reservoir(s.advantage_memory) for _ in range(2)]
        self.strategies = [Reservoir(s.policy_memory) for _ in range(2)]
        self.encodings = [Encodings(self.num_actions) for _ in range(2)]
        self.rng = random.Random(s.seed)  # the traversals' draws: chance, the opponent's moves
        self.generator = torch.Generator().manual_seed(s.seed)  # memories: replacement, batches
        self.iteration = 0

    def _advantage_network(self) -> AdvantageNetwork:
        return AdvantageNetwork(self.obs_size, self.num_actions, self.settings.advantage_hidden)

    # --- 1. current strategies, cached per information state ------------------------------------

    def _strategies(self, player: int, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            advantages = self.advantage[player](torch.from_numpy(obs))
            mask = torch.from_numpy(masks)
            return current_strategy(advantages, mask, self.settings, self.iteration, self.payoff_range).numpy()

    def _refresh_strategies(self) -> None:
        for player, encodings in enumerate(self.encodings):
            if len(encodings) >= self.settings.encoding_cache:
                encodings.clear()
            if len(encodings):
                strategies = self._strategies(player, np.stack(encodings.obs), np.stack(encodings.masks))
            else:
                strategies = np.zeros((0, self.num_actions), dtype=np.float32)
            encodings.set_strategies(strategies)

    def _row(self, state: pyspiel.State, player: int) -> int:
        """The row of the information state `player` is in, encoding it (and asking the
        network about it) the first time it is met."""
        encodings = self.encodings[player]
        key = state.information_state_string(player)
        row = encodings.index.get(key)
        if row is None:
            row = encodings.add(key, state, player)
            encodings.append_strategy(self._strategies(player, encodings.obs[row][None], encodings.masks[row][None])[0])
        return row

    # --- 2. external-sampling traversals ---------------------------------------------------------

    def _traverse(self, state: pyspiel.State, traverser: int, regrets: list, visits: list) -> float:
        """Sampled value of `state` for the traverser; the state is consumed (played forward)."""
        while True:
            if state.is_terminal():
                return state.player_return(traverser)
            if state.is_chance_node():
                outcomes = state.chance_outcomes()
                state.apply_action(outcomes[_draw(self.rng, [p for _, p in outcomes])][0])
                continue
            player = state.current_player()
            row = self._row(state, player)
            encodings = self.encodings[player]
            legal, strategy = encodings.legal[row], encodings.strategy_legal[row]
            if player == traverser:
                values = [self._traverse(state.child(action), traverser, regrets, visits) for action in legal]
                value = sum(p * v for p, v in zip(strategy, values))
                regret = [0.0] * self.num_actions
                for action, action_value in zip(legal, values):
                    regret[action] = action_value - value
                regrets.append((row, regret))
                return value
            visits.append(row)
            state.apply_action(legal[_draw(self.rng, strategy)])

    def _collect(self, traverser: int) -> tuple[int, int]:
        regrets: list[tuple[int, list[float]]] = []
        visits: list[int] = []
        root = self.game.new_initial_state()
        for _ in range(self.settings.traversals):
            self._traverse(root.clone(), traverser, regrets, visits)
        own, other = self.encodings[traverser], self.encodings[1 - traverser]
        if regrets:
            rows = np.array([row for row, _ in regrets])
            targets = np.array([regret for _, regret in regrets], dtype=np.float64)
            self._remember(self.regrets[traverser], own, rows, targets, self._regret_weight)
        if visits:
            rows = np.array(visits)
            targets = np.stack(other.strategy)[rows].astype(np.float64)
            self._remember(self.strategies[1 - traverser], other, rows, targets, self._strategy_weight)
        return len(regrets), len(visits)

    @property
    def _regret_weight(self) -> float:
        return float(self.iteration) ** self.settings.regret_weighting

    @property
    def _strategy_weight(self) -> float:
        return float(self.iteration) ** self.settings.strategy_weighting

    def _remember(
        self, memory: Reservoir, encodings: Encodings, rows: np.ndarray, targets: np.ndarray, weight: float
    ) -> None:
        """Add one iteration's samples to a memory, each weighted by its iteration (linear CFR).

        With `merge_samples`, the samples of one information state become one entry: their mean
        target, weighted by their count. The weighted loss is the same function of the network
        (a sum of squares around the mean differs from one around the samples by a constant),
        but each entry a batch draws is an average rather than one noisy draw. Strategy samples
        of one information state in one iteration are identical, so there merging only saves room.
        """
        weights = np.full(len(rows), weight)
        if self.settings.merge_samples:
            rows, inverse, counts = np.unique(rows, return_inverse=True, return_counts=True)
            sums = np.zeros((len(rows), targets.shape[1]))
            np.add.at(sums, inverse, targets)
            targets = sums / counts[:, None]
            weights = weight * counts
        memory.add(
            {
                "obs": torch.from_numpy(np.stack(encodings.obs)[rows]),
                "mask": torch.from_numpy(np.stack(encodings.masks)[rows]),
                "target": torch.from_numpy(targets.astype(np.float32)),
                "weight": torch.from_numpy(weights.astype(np.float32)),
            },
            self.generator,
        )

    # --- 3. training ------------------------------------------------------------------------------

    def _train_advantage(self, player: int) -> float:
        s = self.settings
        if s.reinitialize:
            with torch.random.fork_rng():
                torch.manual_seed(s.seed * 1_000_003 + self.iteration * 2 + player)
                self.advantage[player] = self._advantage_network()
            self.advantage_optimizer[player] = torch.optim.Adam(self.advantage[player].parameters(), lr=s.advantage_lr)
        network, optimizer, memory = self.advantage[player], self.advantage_optimizer[player], self.regrets[player]
        loss = torch.zeros(())
        for _ in range(s.advantage_steps):
            batch = memory.sample(s.batch_size, self.generator)
            # The batch is drawn in proportion to the samples' weights (`Reservoir.sample`).
            loss = ((network(batch["obs"]) - batch["target"]).square() * batch["mask"]).sum(dim=1).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(network.parameters(), s.max_grad_norm)
            optimizer.step()
        return float(loss.detach())

    def _train_policy(self, player: int) -> float:
        s = self.settings
        network, optimizer, memory = self.policy[player], self.policy_optimizer[player], self.strategies[player]
        loss = torch.zeros(())
        if len(memory) == 0:
            return 0.0
        for _ in range(s.policy_steps):
            batch = memory.sample(s.batch_size, self.generator)
            loss = -(batch["target"] * network.log_probs(batch["obs"], batch["mask"])).sum(dim=1).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(network.parameters(), s.max_grad_norm)
            optimizer.step()
        return float(loss.detach())

    # --- one iteration ----------------------------------------------------------------------------

    def iterate(self, learners: tuple[int, ...] = (0, 1)) -> IterationStats:
        """One CFR iteration. Only the `learners` traverse and train; another player's current
        strategy stays what its advantage network gives (a fixed opponent, as tests use)."""
        self.iteration += 1
        traversal = training = 0.0
        regret_samples = strategy_samples = 0
        advantage_losses = []
        for player in learners:
            start = time.perf_counter()
            self._refresh_strategies()
            collected = self._collect(player)
            regret_samples += collected[0]
            strategy_samples += collected[1]
            middle = time.perf_counter()
            advantage_losses.append(self._train_advantage(player))
            training += time.perf_counter() - middle
            traversal += middle - start
        start = time.perf_counter()
        policy_losses = [self._train_policy(player) for player in range(2)]
        training += time.perf_counter() - start
        return IterationStats(
            iteration=self.iteration,
            regret_samples=regret_samples,
            strategy_samples=strategy_samples,
            advantage_loss=float(np.mean(advantage_losses)),
            policy_loss=float(np.mean(policy_losses)),
            traversal_seconds=traversal,
            training_seconds=training,
        )

    def current_strategy(self, player: int) -> CurrentStrategy:
        """The strategy `player`'s advantage network gives the next iteration (a copy)."""
        network = copy.deepcopy(self.advantage[player])
        return CurrentStrategy(network, self.settings, self.iteration + 1, self.payoff_range)

    def members(self) -> list[AveragePolicyNetwork]:
        """Each player's average-policy network (copies: training may go on)."""
        return [copy.deepcopy(network) for network in self.policy]

    # --- checkpoints --------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {
            "game": self.game_string,
            "settings": self.settings.model_dump(mode="json"),
            "iteration": self.iteration,
            "advantage": [n.state_dict() for n in self.advantage],
            "advantage_optimizer": [o.state_dict() for o in self.advantage_optimizer],
            "policy": [n.state_dict() for n in self.policy],
            "policy_optimizer": [o.state_dict() for o in self.policy_optimizer],
            "regrets": [m.state_dict() for m in self.regrets],
            "strategies": [m.state_dict() for m in self.strategies],
            "encodings": [e.state_dict() for e in self.encodings],
            "rng": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
            "generator": self.generator.get_state(),
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> NeuralCFR:
        solver = cls(state["game"], NeuralCFRSettings(**state["settings"]))
        solver.iteration = int(state["iteration"])
        for network, weights in zip(solver.advantage, state["advantage"]):
            network.load_state_dict(weights)
        for optimizer, weights in zip(solver.advantage_optimizer, state["advantage_optimizer"]):
            optimizer.load_state_dict(weights)
        for network, weights in zip(solver.policy, state["policy"]):
            network.load_state_dict(weights)
        for optimizer, weights in zip(solver.policy_optimizer, state["policy_optimizer"]):
            optimizer.load_state_dict(weights)
        for memory, contents in zip(solver.regrets + solver.strategies, state["regrets"] + state["strategies"]):
            memory.load_state_dict(contents)
        for encodings, contents in zip(solver.encodings, state["encodings"]):
            encodings.load_state_dict(contents)
        rng = state["rng"]
        solver.rng.setstate((rng["version"], tuple(rng["internal"].tolist()), rng["gauss"]))
        solver.generator.set_state(state["generator"])
        return solver


def exact_exploitability(game_string: str, policies: list) -> NashConvReport:
    """Exact NashConv and exploitability of one network per player, asked at every information
    state of the enumerated tree (the measuring instrument, never a training input)."""
    tree = build_tree(game_string)
    tables = [tabularize(policy, tree, player)[None] for player, policy in enumerate(policies)]
    return nash_conv(tree, tables, [np.ones(1), np.ones(1)])
