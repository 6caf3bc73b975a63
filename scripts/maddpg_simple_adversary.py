"""Learning check for MADDPG: simple_adversary (MPE), the good agents against the adversary.

    .venv/bin/python scripts/maddpg_simple_adversary.py --minutes 20 --plot maddpg_adversary.png

Trains `marl_core.marl.maddpg` with the paper's settings (`MADDPGConfig` defaults) by the MARL
loop in this process (`iterate_marl_local`), agents mapped by role: adversary_0 -> "adversary",
agent_0 and agent_1 -> "agent" (one shared actor and critic). Every `--eval-every` rounds it
plays `--eval-episodes` greedy episodes from fresh resets and prints a row: joint environment
steps, the good agents' mean episode return and the adversary's (+- standard error). It stops at
`--env-steps`, or at the first evaluation after `--minutes` of wall time.

What to expect: simple_adversary rewards the adversary for being near the goal landmark
(-distance), and the good agents for being near it themselves while the adversary is far from it
(adversary's distance - nearest good agent's distance). The adversary does not know which of the
two landmarks is the goal; the good agents learn to cover both so it cannot tell. So once both
sides move with purpose, the good agents' return rises and the adversary's falls.
"""

from __future__ import annotations

import argparse
import ast
import time

import torch

from marl_core.marl.training import MARLConfig, iterate_marl_local

ENV = "pettingzoo:mpe2.simple_adversary_v3"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-steps", type=int, default=1_500_000, help="joint environment steps at most (the paper: 60k episodes)")
    parser.add_argument("--minutes", type=float, default=20.0, help="stop at the first evaluation after this much wall time")
    parser.add_argument("--envs", type=int, default=8, help="environment copies")
    parser.add_argument("--steps-per-round", type=int, default=100, help="joint steps per copy per round")
    parser.add_argument("--eval-every", type=int, default=25, help="rounds between greedy evaluations")
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE", help="a MADDPGConfig field, e.g. train_every=50")
    parser.add_argument("--plot", help="save the curves as a PNG here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    settings = {"seed": args.seed}
    for item in args.setting:
        name, _, value = item.partition("=")
        settings[name] = ast.literal_eval(value)  # numbers and tuples, e.g. critic_hidden=(128,128)
    per_round = args.envs * args.steps_per_round
    config = MARLConfig(
        env=ENV, algorithm="maddpg", settings=settings, rounds=max(1, args.env_steps // per_round),
        steps_per_round=args.steps_per_round, envs_per_worker=args.envs, eval_every=args.eval_every,
        eval_episodes=args.eval_episodes, seed=args.seed,
    )
    print(f"MADDPG on {ENV}: {config.algorithm_settings!r}", flush=True)
    print(f"{'env_steps':>10} {'agent':>14} {'adversary':>14} {'minutes':>8}", flush=True)
    rows, started = [], time.perf_counter()
    for record, _ in iterate_marl_local(config):
        if record.eval_returns is None:
            continue
        minutes = (time.perf_counter() - started) / 60
        mean, err = record.eval_returns, record.eval_stderr
        rows.append((record.env_steps, mean["policy/agent"], err["policy/agent"], mean["policy/adversary"], err["policy/adversary"]))
        print(
            f"{record.env_steps:>10} {mean['policy/agent']:>8.2f} ±{err['policy/agent']:<5.2f}"
            f"{mean['policy/adversary']:>8.2f} ±{err['policy/adversary']:<5.2f}{minutes:>8.1f}",
            flush=True,
        )
        if minutes > args.minutes:
            break
    if args.plot:
        plot(rows, args.plot)


def plot(rows, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    steps, agent, agent_err, adversary, adversary_err = map(np.array, zip(*rows))
    figure, axes = plt.subplots(figsize=(7, 4))
    for mean, err, label in [(agent, agent_err, "good agents"), (adversary, adversary_err, "adversary")]:
        axes.plot(steps, mean, label=label)
        axes.fill_between(steps, mean - err, mean + err, alpha=0.3)
    axes.set_xlabel("joint environment steps")
    axes.set_ylabel("greedy episode return")
    axes.set_title("MADDPG on simple_adversary_v3")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
