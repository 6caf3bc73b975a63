"""The RLlib side of `marl_vs_rllib.py`; runs inside the peer's own virtual environment.

RLlib's PPO (new API stack) on a PettingZoo parallel MPE scenario through RLlib's own
`ParallelPettingZooEnv` wrapper, every agent mapped to one shared policy (parameter sharing, as
this project's default), for a fixed number of environment steps. Prints one JSON line per
training iteration: environment steps so far, wall seconds since training started, and the
mean episode return per agent (RLlib's `episode_return_mean` is summed over agents: divided
by their number here, so both sides report the same aggregate).

    python benchmarks/rllib_peer.py --scenario simple_spread_v3 --env-steps 200000 --hidden 64 64
"""

from __future__ import annotations

import argparse
import importlib
import json
import time

import ray
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
from ray.tune.registry import register_env


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", default="simple_spread_v3")
    parser.add_argument("--env-steps", type=int, default=200_000)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--batch", type=int, default=2048, help="environment steps per training iteration")
    parser.add_argument("--envs-per-runner", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    module = importlib.import_module(f"mpe2.{args.scenario}")
    agents = module.parallel_env(continuous_actions=False).possible_agents
    register_env("scenario", lambda _: ParallelPettingZooEnv(module.parallel_env(continuous_actions=False)))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, address="local")
    config = (
        PPOConfig()
        .environment("scenario")
        .framework("torch")
        .env_runners(num_env_runners=1, num_envs_per_env_runner=args.envs_per_runner, num_cpus_per_env_runner=1)
        .multi_agent(policies={"shared"}, policy_mapping_fn=lambda agent_id, *a, **k: "shared")
        .training(
            train_batch_size_per_learner=args.batch,  # environment steps (RLlib counts env steps here)
            minibatch_size=512, num_epochs=4, lr=3e-4, gamma=0.99, lambda_=0.95, entropy_coeff=0.01,
        )
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=args.hidden, fcnet_activation="tanh", vf_share_layers=False))
        .debugging(seed=args.seed)
    )
    algorithm = config.build_algo()
    started = time.perf_counter()
    steps = 0
    while steps < args.env_steps:
        result = algorithm.train()
        runners = result["env_runners"]
        steps = int(runners.get("num_env_steps_sampled_lifetime", steps))
        episode_return = runners.get("episode_return_mean")
        print(json.dumps({
            "env_steps": steps,
            "seconds": time.perf_counter() - started,
            "return_per_agent": None if episode_return is None else episode_return / len(agents),
        }), flush=True)
    algorithm.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
