"""ASP, BSP and BAP training PPO on CartPole-v1 with two learners: joint steps and seconds until
the greedy return reaches 195.

Each strategy trains IPPO (PPO on CartPole's one agent) with
`asynchronous: {distributed: {strategy: ..., learners: 2}}` on a local Ray of two CPUs, as
`psro marl run` lays it out without Prefect: two rollout workers of 4 copies streaming 128-step
fragments into the dataset server, two learner actors and their parameter server actor
(`marl_core.marl.async_rounds.RayAsyncLearners`), rounds wired by `marl_core.marl.rounds.run_round`.
Every `--eval-every` rounds the policy plays 20 greedy episodes; a run stops at the first
evaluation of at least 195, or at `--max-steps`. The clock starts once the actors are up.

    .venv/bin/python benchmarks/distributed_strategies.py [--strategies asp bsp bap] [--seed 0]

Prints one line per strategy and the load average beside them; time only on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import time

TARGET = 195.0
PPO = {"lr": 2.5e-4, "epochs": 4, "minibatch_size": 128, "entropy_coef": 0.01}


def train(strategy: str, seed: int, max_steps: int, eval_every: int) -> dict:
    import ray

    from flows.services.ray_session import ray_session
    from marl_core.marl import rounds
    from marl_core.marl.async_learners import RayAsyncLearners
    from marl_core.marl.config import MARLConfig, layout_and_spec, pool_config
    from marl_core.rollout.pool import WorkerPool
    from marl_core.runner import LocalRunner

    config = MARLConfig(
        env="gymnasium:CartPole-v1",
        algorithm="ippo",
        seed=seed,
        workers=2,
        envs_per_worker=4,
        steps_per_round=128,
        rounds=max_steps // (2 * 4 * 128),
        eval_every=eval_every,
        eval_episodes=20,
        settings={"ppo": {**PPO, "seed": seed}, "asynchronous": {"distributed": {"strategy": strategy, "learners": 2}}},
    )
    layout, _ = layout_and_spec(config)
    with ray_session(None, 2, {}):
        pool = WorkerPool(pool_config(config), on_ray=True)
        learners = RayAsyncLearners(config, None, pool)
        ray.get([a.__ray_ready__.remote() for a in [*pool.workers, pool.store_handle, *learners._members]])
        started, env_steps, record = time.perf_counter(), 0, None
        try:
            for round in range(config.rounds):
                record = rounds.run_round(config, round, env_steps, LocalRunner(rounds.STEPS), pool, learners, layout)
                env_steps = record.env_steps
                if record.eval_returns and record.eval_returns["policy/agent"] >= TARGET:
                    break
        finally:
            learners.close()
            pool.close()
    return {
        "strategy": strategy,
        "rounds": record.round + 1,
        "env_steps": env_steps,
        "seconds": time.perf_counter() - started,
        "return": record.eval_returns["policy/agent"] if record.eval_returns else float("nan"),
        "reached": bool(record.eval_returns and record.eval_returns["policy/agent"] >= TARGET),
        "staleness": record.learner.get("async/staleness_mean", float("nan")),
        "dropped": record.learner.get("async/dropped_steps", 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", default=["asp", "bsp", "bap"], choices=["asp", "bsp", "bap"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=300_000, help="joint steps at most per run")
    parser.add_argument("--eval-every", type=int, default=5, help="rounds between greedy evaluations")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"{'strategy':8} {'reached':>7} {'rounds':>6} {'joint steps':>11} "
        f"{'seconds':>8} {'return':>7} {'staleness':>9} {'dropped':>7}"
    )
    for strategy in args.strategies:
        r = train(strategy, args.seed, args.max_steps, args.eval_every)
        print(
            f"{r['strategy']:8} {str(r['reached']):>7} {r['rounds']:6d} {r['env_steps']:11,d} {r['seconds']:8.1f} "
            f"{r['return']:7.1f} {r['staleness']:9.1f} {r['dropped']:7.0f}   load {os.getloadavg()[0]:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
