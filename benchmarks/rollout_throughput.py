"""Rollout throughput: environment steps per second of the rollout system against a plain loop.

For each environment this measures, in one run on one machine:

- **plain loop**: one process stepping one copy of the environment through our env API with
  uniformly random legal actions (no network, no experience kept): the peer the issue names;
- **raw library loop** (for reference): the same game stepped through its own library
  (pyspiel / PettingZoo) with random actions, no adapter at all;
- **rollout system** with 1 and 2 workers: Ray actors, each stepping `--envs-per-worker` copies,
  every agent played by a DQN network (one batched forward pass per step, epsilon-greedy),
  transitions assembled and shipped back through Ray's object store.

Steps are environment steps (one `env.step` call, however many agents act in it).

    python benchmarks/rollout_throughput.py [--seconds 10] [--envs-per-worker 64]
"""

from __future__ import annotations

import argparse
import os
import random
import time

import numpy as np
import ray
import torch

from marl_core.envs import make_env, shared_population
from marl_core.rl import ALGORITHMS
from marl_core.rollout.pool import PoolConfig, WorkerPool
from marl_core.rollout.worker import AlgorithmPolicy, LearnerSpec, RolloutRequest

ENVIRONMENTS = {
    "leduc_poker": 2000,  # episodes per request
    "pettingzoo:mpe2.simple_spread_v3": 100,
}


def plain_loop(env_name: str, seconds: float) -> float:
    env = make_env(env_name)
    rng = random.Random(0)
    steps, started = 0, time.perf_counter()
    step = env.reset(seed=0)
    while time.perf_counter() - started < seconds:
        for _ in range(1000):
            actions = {agent: rng.choice(np.flatnonzero(mask).tolist()) for agent, mask in step.action_masks.items()}
            step = env.step(actions)
            steps += 1
            if step.done:
                step = env.reset()
    return steps / (time.perf_counter() - started)


def raw_library_loop(env_name: str, seconds: float) -> float:
    rng = random.Random(0)
    steps, started = 0, time.perf_counter()
    if env_name.startswith("pettingzoo:"):
        import importlib

        env = importlib.import_module(env_name.split(":", 1)[1]).parallel_env()
        env.reset(seed=0)
        while time.perf_counter() - started < seconds:
            actions = {agent: env.action_space(agent).sample() for agent in env.agents}
            env.step(actions)
            steps += 1
            if not env.agents:
                env.reset()
        return steps / (time.perf_counter() - started)
    import pyspiel

    game = pyspiel.load_game(env_name)
    while time.perf_counter() - started < seconds:
        state = game.new_initial_state()
        while not state.is_terminal():
            if state.is_chance_node():
                outcomes, probs = zip(*state.chance_outcomes())
                state.apply_action(rng.choices(outcomes, probs)[0])
                continue
            player = state.current_player()
            state.information_state_tensor(player)  # what an agent would observe
            state.apply_action(rng.choice(state.legal_actions()))
            steps += 1
    return steps / (time.perf_counter() - started)


def rollout_system(env_name: str, workers: int, envs_per_worker: int, episodes: int, seconds: float) -> float:
    pool = WorkerPool(PoolConfig(env_name, workers, envs_per_worker), on_ray=True)
    spec = make_env(env_name).spec
    agent = spec.agents[0]
    config = ALGORITHMS["dqn"].config(epsilon_start=0.1)
    policy = ALGORITHMS["dqn"].policy(spec.observation_size[agent], spec.num_actions[agent], config)
    pool.push("benchmark", 1, policy.get_weights())
    learner = LearnerSpec("benchmark", AlgorithmPolicy("dqn", config))

    def requests(round_index: int):
        return [
            RolloutRequest(
                shared_population("all"),
                {},
                episodes,
                seed=(round_index, w),
                learners={"all": learner},
                weights_version=1,
            )
            for w in range(workers)
        ]

    pool.collect(requests(0))  # warm up: workers built their envs and loaded the weights
    steps, rounds, started = 0, 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        rounds += 1
        steps += sum(result.env_steps for result in pool.collect(requests(rounds)))
    rate = steps / (time.perf_counter() - started)
    pool.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--envs-per-worker", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs", flush=True)
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 2**20, log_to_driver=False)
    try:
        print(
            f"{'environment':34s} {'plain loop':>11s} {'raw library':>12s} {'1 worker':>10s} "
            f"{'2 workers':>10s} {'2w/plain':>9s} {'2w/raw':>7s}"
        )
        for env_name, episodes in ENVIRONMENTS.items():
            plain = plain_loop(env_name, args.seconds)
            raw = raw_library_loop(env_name, args.seconds)
            one = rollout_system(env_name, 1, args.envs_per_worker, episodes, args.seconds)
            two = rollout_system(env_name, 2, args.envs_per_worker, episodes, args.seconds)
            print(
                f"{env_name:34s} {plain:11,.0f} {raw:12,.0f} {one:10,.0f} {two:10,.0f} "
                f"{two / plain:8.2f}x {two / raw:6.2f}x",
                flush=True,
            )
        print(
            "steps per second (environment steps); "
            "'plain loop' is the issue's peer: our env API, random actions, one process"
        )
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
