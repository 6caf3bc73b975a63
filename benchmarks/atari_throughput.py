"""Rollout throughput on two-player Pong from pixels, against a plain loop and against RLlib.

In one run on this machine, one after another, each on the same preprocessed environment
(`atari:pong_v3`: frame skip 4, max-pool, 84x84 grayscale, 4 stacked frames, agent indicator):

- **plain loop**: one process steps one copy with uniformly random actions, nothing else: the
  speed of the environment itself;
- **this project's rollout system**: the MARL collection step (`training.collect_rollouts`, what
  `psro marl run` does each round) with 1 and with 2 rollout workers (Ray actors, one CPU and one
  torch thread each) of `--envs` copies, acting with the untrained Nature-CNN actor-critic of
  `configs/marl/pong_ippo.yaml` (one forward pass per step for both paddles of every copy), the
  fragments shipped back to the driver as the learner's batch;
- **RLlib** (the peer, in its own venv, `benchmarks/rllib_atari_peer.py`): the same number of
  remote EnvRunners and copies sampling the same environment with the same convolutions.

Figures are joint steps per second (both paddles act in each) and emulator frames per second
(4 per step); the ratios are against the plain loop and against RLlib. The load average is
printed beside them: time only on a quiet machine.

Learning is the README's run, `psro marl run --config configs/marl/pong_ippo.yaml`: its
`eval_return/vs_uniform/<agent>` metrics are the return against a uniformly random paddle, a curve
per agent in MLflow and a line each in `plots/episode_return.png`.

    python benchmarks/atari_throughput.py [--seconds 30] [--envs 4] [--peer-venv .bench/rllib-venv]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from rllib_venv import peer_python  # benchmarks/, this script's directory

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FRAME_SKIP = 4


def plain_loop(seconds: float) -> float:
    """Joint steps per second of one copy with random actions."""
    from marl_core.envs import make_env

    env = make_env("atari:pong_v3")
    rng = np.random.default_rng(0)
    step = env.reset(seed=0)
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step = env.step({a: int(rng.integers(6)) for a in step.acting})
        steps += 1
        if step.done:
            step = env.reset()
    return steps / (time.perf_counter() - started)


def ours(workers: int, envs: int, seconds: float) -> float:
    """Joint steps per second of the MARL collection step on `workers` Ray actors."""
    import ray

    from marl_core.marl import training
    from marl_core.marl.training import MARLConfig
    from marl_core.rollout.pool import WorkerPool

    settings = yaml.safe_load((ROOT / "configs" / "marl" / "pong_ippo.yaml").read_text())
    config = MARLConfig(**{**settings, "workers": workers, "envs_per_worker": envs})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, address="local", configure_logging=False)
    try:
        layout, spec = training.layout_and_spec(config)
        learner = training.LocalLearner(training.make_learner(config, layout, spec.state_size))
        pool = WorkerPool(training.pool_config(config), on_ray=True)
        training.collect_rollouts(config, pool, learner, 0)  # warm-up: actors started, copies reset
        steps, started, round = 0, time.perf_counter(), 1
        while time.perf_counter() - started < seconds:
            steps += training.collect_rollouts(config, pool, learner, round).env_steps
            round += 1
        rate = steps / (time.perf_counter() - started)
        pool.close()
        return rate
    finally:
        ray.shutdown()


def rllib(python: Path, workers: int, envs: int, steps: int) -> float:
    command = [str(python), str(ROOT / "benchmarks" / "rllib_atari_peer.py"),
               "--workers", str(workers), "--envs", str(envs), "--steps", str(steps)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    process = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if process.returncode != 0:
        raise SystemExit(f"RLlib peer failed:\n{process.stderr[-3000:]}")
    result = json.loads(next(line for line in process.stdout.splitlines() if line.startswith("{")))
    return result["joint_steps"] / result["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0, help="timed seconds per figure of ours and the plain loop")
    parser.add_argument("--envs", type=int, default=4, help="environment copies per worker, both sides")
    parser.add_argument("--peer-steps", type=int, default=512, help="RLlib: joint steps per copy, timed")
    parser.add_argument("--peer-venv", type=Path, default=ROOT / ".bench" / "rllib-venv")
    args = parser.parse_args()
    python = peer_python(args.peer_venv)

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rates = {"plain loop (1 process, random actions)": plain_loop(args.seconds)}
    for workers in (1, 2):
        rates[f"ours, {workers} worker(s) x {args.envs} copies"] = ours(workers, args.envs, args.seconds)
        rates[f"rllib, {workers} EnvRunner(s) x {args.envs} copies"] = rllib(python, workers, args.envs, args.peer_steps)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    plain = rates["plain loop (1 process, random actions)"]
    print(f"\n{'':44s} {'steps/s':>8s} {'frames/s':>9s} {'x plain':>8s} {'x rllib':>8s}")
    for name, rate in rates.items():
        workers = "2" if "2 " in name else "1"
        peer = next((r for n, r in rates.items() if n.startswith("rllib") and f"{workers} EnvRunner" in n), None)
        versus = f"{rate / peer:7.2f}x" if name.startswith("ours") and peer else ""
        print(f"{name:44s} {rate:8.0f} {rate * FRAME_SKIP:9.0f} {rate / plain:7.2f}x {versus:>8s}")


if __name__ == "__main__":
    main()
