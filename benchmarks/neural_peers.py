"""OpenSpiel 2.0.2's neural peers (NFSP, Deep CFR, ESCHER) for a wall-clock budget on one core,
measured the way `neural_curve.py` measures neural CFR: exact exploitability of the peer's
average-policy network at checkpoints, with the clock stopped while it is measured.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/neural_peers.py nfsp --game leduc_poker --minutes 30

Each peer runs with the settings of OpenSpiel's own example for it:

- nfsp: `examples/nfsp_leduc_pytorch.py`'s flags, with 4x128 layers (Walton & Lisy's 0.109 run);
  needs the `dm-tree` package.
- deep_cfr: `examples/deep_cfr_pytorch.py`'s solver settings with 1,500 traversals per iteration
  (the example's recommended value). Its policy network trains only when asked for, so at each
  checkpoint it trains (clock stopped, a generous reading) and is reset afterwards, as
  `DeepCFRSolver.solve` does when it prints NashConvs.
- escher: `examples/escher.py`'s `Config()` (tuned by its authors for Kuhn); its average-policy
  network trains at each checkpoint likewise, clock stopped.

Games load through `marl_core.games.openspiel.load_game`, which turns a simultaneous-move game
(goofspiel) into the turn-based one neural CFR plays. Exploitability is OpenSpiel's
`exploitability.exploitability` (NashConv / 2 for two players).
Both clocks are printed, wall and the process's CPU time; `--clock cpu` spends the budget in CPU
seconds (what counts on a machine that others load).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from open_spiel.python import policy as os_policy
from open_spiel.python import rl_environment
from open_spiel.python.algorithms import exploitability

from marl_core.games.openspiel import load_game

CHECKPOINT_MINUTES = (1, 2, 5, 10, 20, 30, 45, 60)


def _callable_policy(game, probabilities):
    """OpenSpiel tabular policy from state -> {action: prob}."""
    return os_policy.tabular_policy_from_callable(game, probabilities)


class NFSPPeer:
    name = "nfsp"

    def __init__(self, game_string: str, seed: int):
        from open_spiel.python.pytorch import nfsp

        nfsp.set_seed(seed)
        self.nfsp = nfsp
        self.env = rl_environment.Environment(load_game(game_string))
        self.game = self.env.game
        info_state_size = self.env.observation_spec()["info_state"][0]
        num_actions = self.env.action_spec()["num_actions"]
        kwargs = dict(
            replay_buffer_capacity=int(2e5),
            reservoir_buffer_capacity=int(2e6),
            min_buffer_size_to_learn=1000,
            anticipatory_param=0.1,
            batch_size=128,
            learn_every=64,
            rl_learning_rate=0.01,
            sl_learning_rate=0.01,
            optimizer_str="sgd",
            loss_str="mse",
            update_target_network_every=19200,
            discount_factor=1.0,
            epsilon_decay_duration=int(20e6),
            epsilon_start=0.06,
            epsilon_end=0.001,
        )
        self.agents = [nfsp.NFSP(p, info_state_size, num_actions, [128] * 4, **kwargs) for p in range(2)]
        self.episodes = 0

    def work(self) -> None:
        for _ in range(1000):
            time_step = self.env.reset()
            while not time_step.last():
                player = time_step.observations["current_player"]
                time_step = self.env.step([self.agents[player].step(time_step).action])
            for agent in self.agents:
                agent.step(time_step)
        self.episodes += 1000

    def progress(self) -> str:
        return f"{self.episodes} episodes"

    def exploitability(self) -> float:
        obs = {"info_state": [None, None], "legal_actions": [None, None]}

        def probabilities(state):
            player = state.current_player()
            legal = state.legal_actions(player)
            obs["current_player"] = player
            obs["info_state"][player] = state.information_state_tensor(player)
            obs["legal_actions"][player] = legal
            step = rl_environment.TimeStep(observations=obs, rewards=None, discounts=None, step_type=None)
            with self.agents[player].temp_mode_as(self.nfsp.MODE.AVERAGE_POLICY):
                probs = self.agents[player].step(step, is_evaluation=True).probs
            return {a: probs[a] for a in legal}

        return exploitability.exploitability(self.game, _callable_policy(self.game, probabilities))


class DeepCFRPeer:
    name = "deep_cfr"

    def __init__(self, game_string: str, seed: int):
        from open_spiel.python.pytorch import deep_cfr

        deep_cfr.set_seed(seed)
        self.game = load_game(game_string)
        self.solver = deep_cfr.DeepCFRSolver(
            self.game,
            policy_network_layers=(64,),
            advantage_network_layers=(64,),
            num_iterations=1,
            num_traversals=1500,
            reinitialize_advantage_networks=True,
            learning_rate=1e-3,
            batch_size_advantage=256,
            batch_size_strategy=256,
            memory_capacity=100000,
            policy_network_train_steps=2500,
            advantage_network_train_steps=375,
        )
        self.iterations = 0

    def work(self) -> None:
        # One iteration of DeepCFRSolver.solve's loop.
        s = self.solver
        for p in range(2):
            for _ in range(s._num_traversals):
                s._traverse_game_tree(s._root_node, p)
            s._reinitialize_advantage_network(p)
            s._learn_advantage_network(p)
        s._iteration += 1
        self.iterations += 1

    def progress(self) -> str:
        return f"{self.iterations} iterations"

    def exploitability(self) -> float:
        self.solver._learn_strategy_network()
        value = exploitability.exploitability(self.game, _callable_policy(self.game, self.solver.action_probabilities))
        self.solver._reinitialize_policy_network()
        return value


class ESCHERPeer:
    name = "escher"

    def __init__(self, game_string: str, seed: int):
        from open_spiel.python.pytorch import escher

        torch.manual_seed(seed)
        np.random.seed(seed)
        self.escher = escher
        self.game = load_game(game_string)
        self.agent = escher.Agent(self.game, escher.Config())
        self.train_config = escher.TrainConfig(self.game)

    def work(self) -> None:
        # One iteration of escher.train's loop, without its evaluation.
        self.escher._train_regret(self.train_config, self.agent)
        self.agent.t += 1

    def progress(self) -> str:
        return f"{self.agent.t - 1} iterations"

    def exploitability(self) -> float:
        self.escher._train_avg_policy(self.agent)

        def probabilities(state):
            probs = self.agent.action_probabilities(state)
            return {a: probs[a] for a in state.legal_actions()}

        return exploitability.exploitability(self.game, _callable_policy(self.game, probabilities))


PEERS = {peer.name: peer for peer in (NFSPPeer, DeepCFRPeer, ESCHERPeer)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("--game", default="leduc_poker")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the curve to this file")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="which clock the budget counts")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--marks", help="minutes at which to measure, comma-separated (default: 1, 2, 5, 10, 20, ...)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    peer = PEERS[args.peer](args.game, args.seed)
    budget = args.minutes * 60
    minutes = [float(m) for m in args.marks.split(",")] if args.marks else CHECKPOINT_MINUTES
    marks = sorted({m * 60 for m in minutes if m * 60 < budget} | {budget})
    trained = wall = cpu = 0.0
    curve = []
    print(f"peer {args.peer}; game {args.game}; marks (s) {marks}", flush=True)
    for mark in marks:
        while trained < mark:
            start, start_cpu = time.perf_counter(), time.process_time()
            peer.work()
            wall += time.perf_counter() - start
            cpu += time.process_time() - start_cpu
            trained = cpu if args.clock == "cpu" else wall
        start = time.perf_counter()
        value = peer.exploitability()
        load = os.getloadavg()[0]
        curve.append(
            {
                "mark_seconds": mark,  # measured when its clock first passed this
                "wall_seconds": round(wall, 1),
                "cpu_seconds": round(cpu, 1),
                "exploitability": value,
                "load": load,
                "progress": peer.progress(),
            }
        )
        print(
            f"wall {wall:7.1f} s  cpu {cpu:7.1f} s  {peer.progress():>20}  expl {value:.4f}  "
            f"(measured in {time.perf_counter() - start:.1f} s, clock stopped)  load {load:.2f}",
            flush=True,
        )
        if args.json:  # after every mark: a peer stopped at its budget keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"peer": args.peer, "game": args.game, "curve": curve}, f, indent=1)


if __name__ == "__main__":
    main()
