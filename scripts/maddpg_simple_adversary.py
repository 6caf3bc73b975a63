"""Learning check for MADDPG: simple_adversary (MPE), the good agents against the adversary.

    .venv/bin/python scripts/maddpg_simple_adversary.py --minutes 20 --plot maddpg_adversary.png

Trains `marl_core.marl.maddpg` with the paper's settings (`MADDPGConfig` defaults, and the paper's
warm-up of 25,600 joint steps and an update every 100, `PAPER`) by the MARL
loop in this process (`iterate_marl_local`), agents mapped by role: adversary_0 -> "adversary",
agent_0 and agent_1 -> "agent" (one shared actor and critic), or with `--separate` one policy
per agent as in the paper (adversary_0 -> "adversary", agent_0 -> "agent_0", agent_1 ->
"agent_1"). Every `--eval-every` rounds it plays `--eval-episodes` greedy episodes from fresh
resets and prints a row: joint environment steps, the good agents' mean episode return (the mean
over every agent whose name does not start with "adversary") and the adversary's (+- standard
error); `--per-policy` adds each policy's own column, and `--stochastic-eval` adds the same two
figures for episodes played by sampling from the policies instead of their argmax. It stops at
`--env-steps`, or at the first evaluation after `--minutes` of wall time; `--csv` saves the rows and
`--save` the final actors.

What to expect: simple_adversary rewards the adversary for being near the goal landmark
(-distance), and the good agents for being near it themselves while the adversary is far from it
(adversary's distance - nearest good agent's distance). The adversary does not know which of the
two landmarks is the goal; the good agents can hide it by covering both. The untrained greedy
adversary walks off in a fixed direction, so its return first rises, to a plateau between the
scripted "head for the landmarks' midpoint" and "head for the goal" adversaries. Trained together,
the good agents rarely learn to cover both landmarks while the adversary keeps adapting; with
`--freeze adversary --freeze-at N` the adversary stops learning at N joint steps and the good
agents, now against a fixed opponent, learn to deceive it: their return rises and the
adversary's falls. docs/marl.md has the measured curves.
"""

from __future__ import annotations

import argparse
import ast
import time

import numpy as np
import torch

from marl_core.marl.config import MARLConfig, layout_and_spec, policy_mapping
from marl_core.marl.learner_handles import LocalLearner
from marl_core.marl.rounds import iterate_marl_local
from marl_core.rollout.pool import PoolConfig, WorkerPool
from marl_core.rollout.worker import RolloutRequest

ENV = "pettingzoo:mpe2.simple_adversary_v3"
SEPARATE = {"adversary_": "adversary", "agent_0": "agent_0", "agent_1": "agent_1"}  # the paper: no sharing
PAPER = {"learning_starts": 25_600, "train_every": 100}  # where MADDPGConfig's defaults start and update sooner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--env-steps", type=int, default=1_500_000, help="joint environment steps at most (the paper: 60k episodes)"
    )
    parser.add_argument(
        "--minutes", type=float, default=20.0, help="stop at the first evaluation after this much wall time"
    )
    parser.add_argument("--envs", type=int, default=8, help="environment copies")
    parser.add_argument("--steps-per-round", type=int, default=100, help="joint steps per copy per round")
    parser.add_argument("--eval-every", type=int, default=25, help="rounds between greedy evaluations")
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--setting", action="append", default=[], metavar="NAME=VALUE", help="a MADDPGConfig field, e.g. train_every=50"
    )
    parser.add_argument(
        "--freeze",
        action="append",
        default=[],
        metavar="POLICY",
        help="from --freeze-at joint steps on, this policy acts but no longer learns (MADDPG's frozen)",
    )
    parser.add_argument(
        "--freeze-at", type=int, default=0, help="joint steps at which the --freeze policies stop learning"
    )
    parser.add_argument(
        "--separate", action="store_true", help="one actor and critic per agent (the paper), no sharing"
    )
    parser.add_argument("--per-policy", action="store_true", help="also print every policy's own return")
    parser.add_argument("--stochastic-eval", action="store_true", help="also evaluate sampled (not greedy) actions")
    parser.add_argument("--plot", help="save the curves as a PNG here")
    parser.add_argument("--csv", help="save the rows as CSV here")
    parser.add_argument("--save", help="save the final actors ({policy id: state_dict}, torch.save) here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    settings = {"seed": args.seed, **PAPER}
    for item in args.setting:
        name, _, value = item.partition("=")
        settings[name] = ast.literal_eval(value)  # numbers and tuples, e.g. critic_hidden=(128,128)
    per_round = args.envs * args.steps_per_round
    config = MARLConfig(
        env=ENV,
        algorithm="maddpg",
        settings=settings,
        rounds=max(1, args.env_steps // per_round),
        steps_per_round=args.steps_per_round,
        envs_per_worker=args.envs,
        eval_every=args.eval_every,
        eval_episodes=args.eval_episodes,
        seed=args.seed,
        policies=SEPARATE if args.separate else None,
    )
    layout, _ = layout_and_spec(config)
    groups = layout.groups
    for policy in args.freeze:
        if policy not in groups:
            parser.error(f"--freeze {policy!r}: no such policy; the policies are {sorted(groups)}")
    sampled = WorkerPool(PoolConfig(ENV, 1, args.envs)) if args.stochastic_eval else None
    columns = ["greedy good", "greedy adversary"]
    if sampled is not None:
        columns += ["sampled good", "sampled adversary"]
    if args.per_policy:
        columns += [f"greedy {policy}" for policy in groups]
    print(f"MADDPG on {ENV}: {config.algorithm_settings!r}; policies: {groups}", flush=True)
    if args.freeze:
        print(f"from {args.freeze_at} joint steps on, {args.freeze} act but do not learn", flush=True)
    print(f"{'env_steps':>10}" + "".join(f"{name:>18}" for name in columns) + f"{'minutes':>8}", flush=True)
    agents = sorted(a for members in groups.values() for a in members)
    good = [a for a in agents if not a.startswith("adversary")]
    adversaries = [a for a in agents if a.startswith("adversary")]
    rows, started = [], time.perf_counter()
    for record, learner in iterate_marl_local(config):
        if record.env_steps >= args.freeze_at:  # takes effect from the next round's updates
            learner.frozen = set(args.freeze)
        if record.eval_returns is None:
            continue
        mean, err = record.eval_returns, record.eval_stderr
        # The mean of the agents' standard errors bounds the standard error of their mean (equal to
        # it here: simple_adversary's good agents share one reward).
        values = [
            (float(np.mean([mean[a] for a in good])), float(np.mean([err[a] for a in good]))),
            (float(np.mean([mean[a] for a in adversaries])), float(np.mean([err[a] for a in adversaries]))),
        ]
        if sampled is not None:
            handle = LocalLearner(learner)
            handle.publish(sampled, record.round + 1)
            request = RolloutRequest(
                policy_mapping(config),
                episodes=args.eval_episodes,
                seed=(10_000 + record.round,),
                learners=handle.specs(),
                weights_version=record.round + 1,
                agent_ids=config.agent_ids,
                experience=False,
            )
            returns = sampled.collect([request])[0].episode_returns
            order = list(layout.agents)
            for members in (good, adversaries):
                per_episode = returns[:, [order.index(a) for a in members]].mean(axis=1)
                values.append((float(per_episode.mean()), float(per_episode.std(ddof=1) / np.sqrt(len(per_episode)))))
        if args.per_policy:
            values += [(mean[f"policy/{policy}"], err[f"policy/{policy}"]) for policy in groups]
        minutes = (time.perf_counter() - started) / 60
        rows.append((record.env_steps, values))
        print(
            f"{record.env_steps:>10}" + "".join(f"{m:>10.2f} ±{e:<6.2f}" for m, e in values) + f"{minutes:>8.1f}",
            flush=True,
        )
        if minutes > args.minutes:
            break
    if args.save:
        torch.save({p: policy.state_dict() for p, policy in learner.policies.items()}, args.save)
        print(f"actors: {args.save}")
    if args.csv:
        with open(args.csv, "w") as out:
            out.write(
                ",".join(["env_steps"] + [f"{c.replace(' ', '_')}{s}" for c in columns for s in ("", "_se")]) + "\n"
            )
            for steps, values in rows:
                out.write(",".join([str(steps)] + [f"{x:.4f}" for pair in values for x in pair]) + "\n")
        print(f"csv: {args.csv}")
    if args.plot:
        subtitle = "separate actors and critics" if args.separate else "good agents share a network"
        plot(rows, columns, args.plot, subtitle, args.freeze_at if args.freeze else None, args.freeze)


def plot(rows, columns: list[str], path: str, subtitle: str, freeze_at: int | None, frozen: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.array([s for s, _ in rows])
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for k, name in enumerate(columns[:4]):  # greedy (solid) and, if evaluated, sampled (dashed)
        mean = np.array([values[k][0] for _, values in rows])
        err = np.array([values[k][1] for _, values in rows])
        line = axes.plot(
            steps,
            mean,
            label=name,
            linestyle="-" if name.startswith("greedy") else "--",
            color="tab:blue" if "good" in name else "tab:red",
        )
        axes.fill_between(steps, mean - err, mean + err, alpha=0.25, color=line[0].get_color())
    if freeze_at is not None:
        axes.axvline(freeze_at, color="gray", linestyle=":", label=f"{', '.join(frozen)} frozen")
    axes.set_xlabel("joint environment steps")
    axes.set_ylabel("evaluation episode return (mean ± se)")
    axes.set_title(f"MADDPG on simple_adversary_v3 ({subtitle})")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
