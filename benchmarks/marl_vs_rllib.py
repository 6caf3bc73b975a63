"""MARL training speed against RLlib: multi-agent PPO on MPE's simple_spread, same steps, same networks.

In one run on this machine it trains, one after another:

- **RLlib** (the peer): `ray[rllib]` of this project's Ray version, PPO on the new API stack, through
  RLlib's PettingZoo wrapper, every agent on one shared policy (`benchmarks/rllib_peer.py`). Its
  own requirements may clash with the project's pins, so it runs in its own virtual environment,
  which this script creates on first use (`--peer-venv`, default `.bench/rllib-venv`);
- **this project's IPPO and MAPPO**, the in-process training loop (`iterate_marl_local`), one
  shared policy, the same hidden layers, the same environment steps per update and in total.

Both sides step the same environment object: MPE's raw env converted to parallel, without
PettingZoo's checking-only wrappers (this project's adapter drops them and checks actions against
the masks itself; the peer is handed the same construction).

Returns are aggregated the same way on both sides: summed over an episode, averaged over the
agents (RLlib's `episode_return_mean` sums over agents; the peer divides it by their number), and
averaged over the training episodes that ended in an iteration, smoothed over `--window`
iterations. Printed: environment steps per second of the whole training (collection and
updates), the return each ends with, and the wall time each needs to reach the return RLlib ends
with, with the ratios RLlib / ours. The load average is printed beside the figures: time only on a
quiet machine.

With `--workers 2` both sides sample with two processes (ours: Ray actors, RLlib: two remote
EnvRunners), the learner in the driver; each worker count is its own comparison, the same number
of environments and steps per update on both sides.

    python benchmarks/marl_vs_rllib.py [--env-steps 300000] [--algorithms ippo mappo] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
from rllib_venv import peer_python  # benchmarks/, this script's directory

ROOT = Path(__file__).resolve().parent.parent
STEPS_PER_UPDATE = 2048  # environment steps per update, both sides
HIDDEN = [64, 64]
ENVS = 8

# this project's settings matching the peer's PPO (rllib_peer.py): lr, epochs, minibatch, entropy
OUR_SETTINGS = {
    "ippo": {"ppo": {"hidden": HIDDEN, "lr": 3e-4, "epochs": 4, "minibatch_size": 512, "entropy_coef": 0.01}},
    "mappo": {
        "hidden": HIDDEN,
        "critic_hidden": HIDDEN,
        "lr": 3e-4,
        "epochs": 4,
        "minibatch_size": 512,
        "entropy_coef": 0.01,
    },
    "qmix": {},  # off-policy: its own defaults (marl_core.marl.settings.QMIXConfig)
}


def run_peer(python: Path, scenario: str, env_steps: int, seed: int, workers: int) -> list[dict]:
    command = [
        str(python),
        str(ROOT / "benchmarks" / "rllib_peer.py"),
        "--scenario",
        scenario,
        "--env-steps",
        str(env_steps),
        "--batch",
        str(STEPS_PER_UPDATE),
        "--envs-per-runner",
        str(ENVS),
        "--env-runners",
        str(0 if workers == 1 else workers),
        "--seed",
        str(seed),
        "--hidden",
        *map(str, HIDDEN),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    process = subprocess.run(command, capture_output=True, text=True, env=env, timeout=7200)
    if process.returncode != 0:
        raise SystemExit(f"RLlib peer failed:\n{process.stderr[-3000:]}")
    return [json.loads(line) for line in process.stdout.splitlines() if line.startswith("{")]


def run_ours(algorithm: str, scenario: str, env_steps: int, seed: int, workers: int) -> list[dict]:
    """The in-process training loop; with more than one worker its workers are Ray actors
    (the rollout engine's `WorkerPool`) that play at the same time, the learner staying here."""
    from marl_core.marl.config import MARLConfig
    from marl_core.marl.rounds import iterate_marl_local

    config = MARLConfig(
        env=f"pettingzoo:mpe2.{scenario}",
        algorithm=algorithm,
        settings=OUR_SETTINGS[algorithm],
        rounds=env_steps // STEPS_PER_UPDATE,
        steps_per_round=STEPS_PER_UPDATE // (ENVS * workers),
        envs_per_worker=ENVS,
        workers=workers,
        eval_every=10**9,
        seed=seed,
    )
    with _ray_workers(config) as pool:
        points, started = [], time.perf_counter()
        for record, _ in iterate_marl_local(config, pool=pool):
            points.append(
                {
                    "env_steps": record.env_steps,
                    "seconds": time.perf_counter() - started,
                    "return_per_agent": np.mean(
                        [v for k, v in record.train_returns.items() if not k.startswith("policy/")]
                    )
                    if record.train_returns
                    else None,
                }
            )
    return points


@contextlib.contextmanager
def _ray_workers(config):
    """None (the loop's own workers) for one worker; else Ray actors on a local Ray of
    `config.workers` CPUs, started before the clock and stopped after."""
    if config.workers == 1:
        yield None
        return
    import ray

    from flows.services.ray_session import ray_session
    from marl_core.marl.config import pool_config
    from marl_core.rollout.pool import WorkerPool

    with ray_session(None, config.workers, {}):
        pool = WorkerPool(pool_config(config), on_ray=True)
        ray.get([actor.__ray_ready__.remote() for actor in [*pool.workers, pool.store_handle]])
        yield pool
        pool.close()


def uniform_random_return(scenario: str, episodes: int = 400) -> float:
    """Mean episode return per agent of uniformly random actions: where learning starts from."""
    from marl_core.marl.config import MARLConfig, layout_and_spec, policy_mapping
    from marl_core.policies.base import UniformPolicy
    from marl_core.rollout.worker import PolicyMixture, RolloutRequest, RolloutWorker

    config = MARLConfig(env=f"pettingzoo:mpe2.{scenario}", algorithm="ippo")
    layout, _ = layout_and_spec(config)
    uniform = PolicyMixture((UniformPolicy(),), np.ones(1))
    request = RolloutRequest(
        policy_mapping(config), {policy: uniform for policy in layout.groups}, episodes, seed=(99,), experience=False
    )
    return float(RolloutWorker(config.env, ENVS).collect(request).episode_returns.mean())


def smoothed(points: list[dict], window: int) -> list[tuple[int, float, float]]:
    """(env steps, seconds, return averaged over the last `window` iterations that had one)."""
    out, recent = [], []
    for p in points:
        if p["return_per_agent"] is not None:
            recent = (recent + [p["return_per_agent"]])[-window:]
        if recent:
            out.append((p["env_steps"], p["seconds"], float(np.mean(recent))))
    return out


def time_to(curve, target: float):
    return next((seconds for _, seconds, value in curve if value >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="simple_spread_v3")
    parser.add_argument("--env-steps", type=int, default=300_000)
    parser.add_argument("--algorithms", nargs="+", default=["ippo", "mappo", "qmix"])
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--plot", type=Path, help="save the return curves (against wall seconds and steps) as a PNG here"
    )
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, 2],
        help="rollout workers per side, one comparison each (1: everything in one process)",
    )
    parser.add_argument("--peer-venv", type=Path, default=ROOT / ".bench" / "rllib-venv")
    args = parser.parse_args()

    python = peer_python(args.peer_venv)
    uniform = uniform_random_return(args.scenario)
    for workers in args.workers:
        print(f"load average before: {os.getloadavg()[0]:.2f} (time only on a quiet machine)", flush=True)
        curves = {
            "rllib ppo": smoothed(run_peer(python, args.scenario, args.env_steps, args.seed, workers), args.window)
        }
        for algorithm in args.algorithms:
            curves[algorithm] = smoothed(
                run_ours(algorithm, args.scenario, args.env_steps, args.seed, workers), args.window
            )
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        report(curves, uniform, args, workers)
        if args.plot:
            plot(
                curves,
                curves["rllib ppo"][-1][2],
                uniform,
                args.scenario,
                args.plot.with_stem(f"{args.plot.stem}-{workers}w"),
            )


def report(curves: dict, uniform: float, args, workers: int) -> None:
    target = curves["rllib ppo"][-1][2]
    reference = time_to(curves["rllib ppo"], target)
    rate = {name: curve[-1][0] / curve[-1][1] for name, curve in curves.items()}
    sampling = (
        "one process each"
        if workers == 1
        else f"{workers} rollout workers each (RLlib: EnvRunners), the learner in the driver"
    )
    print(
        f"\n{args.scenario}, {args.env_steps} environment steps, {STEPS_PER_UPDATE} per update, "
        f"hidden {HIDDEN}, {sampling}"
    )
    print(
        "return: summed over an episode, mean over agents, mean over an iteration's episodes, "
        f"smoothed over {args.window} iterations; target = RLlib's final return {target:.2f}; "
        f"uniform random play {uniform:.2f}"
    )
    print(
        f"{'':12s} {'steps/s':>9s} {'x rllib':>8s} {'final return':>13s} "
        f"{'of the way':>10s} {'s to target':>12s} {'speed-up':>9s}"
    )
    for name, curve in curves.items():
        reached = time_to(curve, target)
        speedup = f"{reference / reached:8.2f}x" if reached else "   never"
        progress = (curve[-1][2] - uniform) / (target - uniform)  # 0: uniform random play, 1: RLlib's final return
        print(
            f"{name:12s} {rate[name]:9.0f} {rate[name] / rate['rllib ppo']:7.2f}x {curve[-1][2]:13.2f} {progress:9.0%} "
            f"{reached if reached is None else round(reached, 1)!s:>12s} {speedup:>9s}",
            flush=True,
        )


def plot(curves: dict, target: float, uniform: float, scenario: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_time, by_steps) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for name, curve in curves.items():
        steps, seconds, value = zip(*curve)
        by_time.plot(seconds, value, label=name)
        by_steps.plot(steps, value, label=name)
    for axes, label in [(by_time, "wall seconds"), (by_steps, "environment steps")]:
        axes.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        axes.axhline(uniform, color="grey", linestyle=":", linewidth=0.8)
        axes.set_xlabel(label)
    by_time.set_ylabel("episode return per agent")
    by_steps.legend()
    figure.suptitle(f"{scenario}: dashed, RLlib's final return; dotted, uniform random play")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
