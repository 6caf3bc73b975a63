"""The asynchronous learner against the synchronous one on MPE's simple_spread: wall time to the
synchronous IPPO learner's final greedy return, and samples per second.

- synchronous: `configs/marl/simple_spread/ippo.yaml` (IPPO; each round the worker plays, then
  the learner trains on what it played);
- asynchronous: `configs/marl/simple_spread/appo.yaml` by default (APPO; the worker streams
  fragments into the dataset server while the learner trains on the previous ones).

Both run on a local Ray of two CPUs as `psro marl run` lays them out, without Prefect: the
rollout worker is a Ray actor; the synchronous learner trains in this process (the in-process
loop, `iterate_marl_local`), the asynchronous one is a learner actor
(`marl_core.marl.async_rounds.RayAsyncLearners`). The clock starts once the actors are up.
The synchronous run goes first; its final greedy return (64 episodes) is the target, and the
asynchronous run stops at its first evaluation at or above it (or after its configured rounds).

    .venv/bin/python benchmarks/async_versus_sync.py [--seed 0] [--async-config PATH] [--two-workers]

Time only on a quiet machine: the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path, seed: int):
    from marl_core.marl.config import MARLConfig

    return MARLConfig(**{**yaml.safe_load(path.read_text()), "seed": seed})


def run_sync(config) -> tuple[list[tuple[float, int, float]], float]:
    """[(seconds, joint steps, greedy return)] at each evaluation, and samples per second."""
    import ray

    from flows.services.ray_session import ray_session
    from marl_core.marl.config import pool_config
    from marl_core.marl.rounds import iterate_marl_local
    from marl_core.rollout.pool import WorkerPool

    with ray_session(None, 2, {}):
        pool = WorkerPool(pool_config(config), on_ray=True)
        ray.get([a.__ray_ready__.remote() for a in [*pool.workers, pool.store_handle]])
        curve, started = [], time.perf_counter()
        for record, _ in iterate_marl_local(config, pool=pool):
            if record.eval_returns:
                curve.append((time.perf_counter() - started, record.env_steps, record.eval_returns["policy/agent"]))
        pool.close()
    return curve, curve[-1][1] / curve[-1][0]


def run_async(config, target: float) -> tuple[list[tuple[float, int, float]], float, dict]:
    import ray

    from flows.services.ray_session import ray_session
    from marl_core.marl import rounds
    from marl_core.marl.async_learners import RayAsyncLearners
    from marl_core.marl.config import layout_and_spec, pool_config
    from marl_core.rollout.pool import WorkerPool
    from marl_core.runner import LocalRunner

    layout, _ = layout_and_spec(config)
    with ray_session(None, 2, {}):
        pool = WorkerPool(pool_config(config), on_ray=True)
        learners = RayAsyncLearners(config, None, pool)
        ray.get([a.__ray_ready__.remote() for a in [*pool.workers, pool.store_handle, *learners._members]])
        curve, env_steps, started, record = [], 0, time.perf_counter(), None
        try:
            for round in range(config.rounds):
                record = rounds.run_round(config, round, env_steps, LocalRunner(rounds.STEPS), pool, learners, layout)
                env_steps = record.env_steps
                if record.eval_returns:
                    curve.append((time.perf_counter() - started, env_steps, record.eval_returns["policy/agent"]))
                    if record.eval_returns["policy/agent"] >= target:
                        break
        finally:
            learners.close()
            pool.close()
    return curve, curve[-1][1] / curve[-1][0], record.learner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sync-config", type=Path, default=ROOT / "configs/marl/simple_spread/ippo.yaml")
    parser.add_argument("--async-config", type=Path, default=ROOT / "configs/marl/simple_spread/appo.yaml")
    parser.add_argument(
        "--two-workers", action="store_true", help="also run the synchronous config with its copies over two workers"
    )
    parser.add_argument(
        "--target", type=float, help="skip the synchronous run and aim at this return (trying configs out)"
    )
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    if args.target is None:
        sync_config = load(args.sync_config, args.seed)
        sync_curve, sync_rate = run_sync(sync_config)
        seconds, steps, target = sync_curve[-1]
        print(
            f"synchronous  ({args.sync_config.name}, {sync_config.workers} worker(s)): "
            f"final greedy return {target:.2f} after {steps:,} joint steps in {seconds:.1f} s, "
            f"{sync_rate:,.0f} joint steps/s   load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        if args.two_workers and sync_config.workers == 1:
            both = sync_config.model_copy(update={"workers": 2, "envs_per_worker": sync_config.envs_per_worker // 2})
            curve, rate = run_sync(both)
            at = next((s for s, _, r in curve if r >= target), None)
            print(
                f"synchronous  (the same with 2 workers of {both.envs_per_worker} copies): final {curve[-1][2]:.2f} in "
                f"{curve[-1][0]:.1f} s, {rate:,.0f} joint steps/s; first at or above {target:.2f} after "
                f"{'never' if at is None else f'{at:.1f} s'}   load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    else:
        sync_curve, seconds, target = [], float("nan"), args.target
    async_curve, async_rate, learner = run_async(load(args.async_config, args.seed), target)
    a_seconds, a_steps, a_return = async_curve[-1]
    reached = a_return >= target
    print(
        f"asynchronous ({args.async_config.name}): greedy return {a_return:.2f} after {a_steps:,} joint steps in "
        f"{a_seconds:.1f} s, {async_rate:,.0f} joint steps/s played; "
        f"{'reached' if reached else 'did NOT reach'} the target; "
        f"staleness {learner.get('async/staleness_mean', float('nan')):.1f} steps, learner busy "
        f"{learner.get('async/learner_utilisation', float('nan')):.0%}   load {os.getloadavg()[0]:.2f}"
    )
    if reached:
        print(
            f"wall time to {target:.2f}: synchronous {seconds:.1f} s, "
            f"asynchronous {a_seconds:.1f} s ({seconds / a_seconds:.2f}x)"
        )
    print("curves (seconds, joint steps, greedy return):")
    print("  synchronous ", [(round(s), n, round(r, 2)) for s, n, r in sync_curve])
    print("  asynchronous", [(round(s), n, round(r, 2)) for s, n, r in async_curve])


if __name__ == "__main__":
    main()
