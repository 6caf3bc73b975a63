"""Neural CFR's exact exploitability against wall-clock seconds, for a time budget.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/neural_curve.py --game leduc_poker --minutes 30

Prints one line per measurement: training seconds (the clocks stop while the exact
exploitability of the average-policy networks is computed), both wall-clock and the CPU time the
process got, the iteration, the exploitability, and the load average, so figures taken on a
shared machine say how shared it was. `--clock cpu` spends the budget and places the
measurements in CPU seconds instead of wall seconds: on a machine loaded by others, CPU seconds
are what an unloaded core would have taken (nearly; caches are shared). `--set
key=value` overrides a setting (`--set traversals=2000 --set advantage_hidden=[64,64]`).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from marl_core.neural_cfr import NeuralCFR, NeuralCFRSettings, exact_exploitability


class AverageTracker:
    """Diagnosis only (uses the tree): the exact linearly weighted average of the strategies that
    regret matching on the advantage networks gives after each iteration, by sequence-form reach."""

    def __init__(self, game: str):
        from marl_core.games.tree import build_tree
        from marl_core.policies.tabularize import infostate_observations

        self.tree = build_tree(game)
        self.obs = infostate_observations(game)
        self.sums = [None, None]
        self.last = [None, None]

    def update(self, solver) -> None:
        import numpy as np

        from marl_core.games.tree import sequence_reach

        for p, tree in enumerate(self.tree.players):
            table = solver.current_strategy(p).action_probs(self.obs[p], tree.legal)
            reach = sequence_reach(tree, table[None])[0]
            own = np.where(tree.parent_seq >= 0, reach[tree.parent_seq], 0.0)
            w = float(solver.iteration) ** solver.settings.strategy_weighting
            contrib = w * own[:, None] * table
            self.sums[p] = contrib if self.sums[p] is None else self.sums[p] + contrib
            self.last[p] = table

    def exploitability(self):
        import numpy as np

        from marl_core.games.exploitability import nash_conv

        avg = []
        for p, tree in enumerate(self.tree.players):
            total = self.sums[p].sum(axis=1, keepdims=True)
            avg.append(np.where(total > 0, self.sums[p] / np.maximum(total, 1e-300), tree.uniform_policy()))
        one = [np.ones(1), np.ones(1)]
        return (
            nash_conv(self.tree, [a[None] for a in avg], one).exploitability,
            nash_conv(self.tree, [t[None] for t in self.last], one).exploitability,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", default="leduc_poker")
    parser.add_argument("--minutes", type=float, default=30.0, help="training wall-clock budget")
    parser.add_argument("--iterations", type=int, default=0, help="stop after this many iterations (0: no limit)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between measurements")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="which clock the budget counts")
    parser.add_argument(
        "--checkpoint",
        help="save the run here at every measurement (weights-only torch file) and, if it exists, resume from it: "
        "a resumed run prints what the uninterrupted one would have",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: one core)")
    parser.add_argument("--json", help="also write the curve to this file")
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="also measure the exact linear average of the advantage networks' strategies (what a "
        "perfect average-policy network would give) and the last iterate; slows the run",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    settings = NeuralCFRSettings(**overrides)
    if args.checkpoint and args.diagnose:
        parser.error("--diagnose keeps its average outside the checkpoint; use one or the other")
    print(f"game {args.game}; settings {settings.model_dump_json()}", flush=True)
    budget = args.minutes * 60
    trained = 0.0  # on the chosen clock
    wall = cpu = 0.0
    next_eval = args.every
    curve = []
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, weights_only=True)
        solver = NeuralCFR.from_state_dict(saved["solver"])
        if solver.game_string != args.game or solver.settings != settings:
            parser.error(f"{args.checkpoint} holds a run of other settings or another game")
        wall, cpu, next_eval, curve = saved["wall"], saved["cpu"], saved["next_eval"], saved["curve"]
        trained = cpu if args.clock == "cpu" else wall
        print(f"resumed at iteration {solver.iteration}, wall {wall:.1f} s, cpu {cpu:.1f} s", flush=True)
    else:
        solver = NeuralCFR(args.game, settings)
    tracker = AverageTracker(args.game) if args.diagnose else None
    while trained < budget and not (args.iterations and solver.iteration >= args.iterations):
        start, start_cpu = time.perf_counter(), time.process_time()
        stats = solver.iterate()
        wall += time.perf_counter() - start
        cpu += time.process_time() - start_cpu
        trained = cpu if args.clock == "cpu" else wall
        if tracker:
            tracker.update(solver)
        last = trained >= budget or solver.iteration == args.iterations
        if trained >= next_eval or last:
            report = exact_exploitability(args.game, solver.members())
            load = os.getloadavg()[0]
            extra = (
                f"  avg-of-iterates {tracker.exploitability()[0]:.4f} last {tracker.exploitability()[1]:.4f}"
                if tracker
                else ""
            )
            curve.append(
                {
                    "wall_seconds": round(wall, 1),
                    "cpu_seconds": round(cpu, 1),
                    "iteration": stats.iteration,
                    "exploitability": report.exploitability,
                    "load": load,
                }
            )
            print(
                f"wall {wall:7.1f} s  cpu {cpu:7.1f} s  it {stats.iteration:5d}  expl {report.exploitability:.4f}  "
                f"adv_loss {stats.advantage_loss:.3f}  pol_loss {stats.policy_loss:.3f}  "
                f"trav {stats.traversal_seconds:.2f}s train {stats.training_seconds:.2f}s  load {load:.2f}{extra}",
                flush=True,
            )
            while next_eval <= trained:
                next_eval += args.every
            if args.checkpoint:
                clocks = {"wall": wall, "cpu": cpu, "next_eval": next_eval, "curve": curve}
                torch.save({"solver": solver.state_dict(), **clocks}, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"game": args.game, "settings": settings.model_dump(mode="json"), "curve": curve}, f, indent=1)


if __name__ == "__main__":
    main()
