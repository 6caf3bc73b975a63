"""The RLlib side of `marl_vs_rllib.py`; runs inside the peer's own virtual environment.

RLlib's PPO (new API stack: RLModule, Learner, EnvRunner) on a PettingZoo parallel MPE scenario
through RLlib's own `ParallelPettingZooEnv` wrapper (around the same environment object as this
project's side: the raw env without PettingZoo's checking-only wrappers), every agent mapped to
one shared policy (parameter sharing, as this project's default), for a fixed number of
environment steps.
Prints one JSON line per training iteration: environment steps so far (RLlib's
`num_env_steps_sampled_lifetime`: joint steps, as ours), wall seconds since training started
(the algorithm built, the clock starts at the first `train()`), and the mean episode return
per agent.

Return. RLlib's `episode_return_mean` is the return summed over the episode and over the agents,
averaged over the last `metrics_num_episodes_for_smoothing` finished training episodes. That
window is set to the episodes one iteration finishes (`batch // episode length`, 81 for
2048 steps of 25-step episodes; RLlib's default of 100 would reach into the previous iteration),
and the sum over agents is divided by their number: per line, the mean over an iteration's
training episodes of the per-agent episode return, the aggregate the benchmark computes for
this project's side too.

PPO settings, as this project's IPPO/MAPPO in the benchmark: 2048 environment steps per
iteration (`train_batch_size_per_learner`, counted in env steps for multi-agent), minibatches of
512 agent transitions per module, 4 epochs, Adam 3e-4, gamma 0.99, GAE lambda 0.95, clip 0.2,
entropy 0.01, separate tanh [64, 64] policy and value networks. RLlib's defaults that this
project's PPO does not have are turned off or matched: no KL penalty (`use_kl_loss=False`; the
default adds an adaptive one), no value-loss clipping (`vf_clip_param=inf`; the default 10 cuts
the gradient of every squared error above 10, early on most of them with returns near -50),
value coefficient 0.25 (ours: 0.5 x a loss halved), gradient global-norm clip 0.5. Not matched:
weight initialisation, and advantages standardised per batch (ours: per minibatch).

Parallelism on this 2-core machine (`ray.init(num_cpus=2)`, local, no dashboard, shut down at
the end so nothing keeps running). RLlib's PPO samples and then learns, one after the other, so
a remote EnvRunner only adds inter-process traffic here: by default the driver samples 8
environment copies itself (`--env-runners 0 --envs-per-runner 8`, as this project's side) and
the Learner runs in the driver too (`num_learners=0`).

    python benchmarks/rllib_peer.py --scenario simple_spread_v3 --env-steps 200000 --hidden 64 64
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", default="simple_spread_v3")
    parser.add_argument("--env-steps", type=int, default=200_000)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--batch", type=int, default=2048, help="environment steps per training iteration")
    parser.add_argument("--minibatch", type=int, default=512, help="agent transitions per gradient step")
    parser.add_argument("--env-runners", type=int, default=0, help="remote EnvRunners (0: sample in the driver)")
    parser.add_argument("--envs-per-runner", type=int, default=8)
    parser.add_argument("--torch-threads", type=int, default=0, help="the Learner's torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from pettingzoo.utils.conversions import aec_to_parallel_wrapper
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
    from ray.tune.registry import register_env
    from rllib_common import local_ray, shared_policy_ppo  # benchmarks/, this script's directory

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    module = importlib.import_module(f"mpe2.{args.scenario}")
    probe = module.parallel_env(continuous_actions=False)
    agents, episode_length = probe.possible_agents, probe.unwrapped.max_cycles
    probe.close()
    # The environment this project's adapter steps: MPE's raw AEC env converted to parallel, without
    # PettingZoo's checking-only wrappers (marl_core.envs.pettingzoo_env.without_checking_wrappers).
    register_env(
        "scenario", lambda _: ParallelPettingZooEnv(aec_to_parallel_wrapper(module.raw_env(continuous_actions=False)))
    )

    with local_ray():
        config = (
            shared_policy_ppo("scenario", args.env_runners, args.envs_per_runner, args.seed)
            .training(
                train_batch_size_per_learner=args.batch,  # env steps (count_steps_by="env_steps")
                minibatch_size=args.minibatch,
                num_epochs=4,
                lr=3e-4,
                gamma=0.99,
                lambda_=0.95,
                clip_param=0.2,
                entropy_coeff=0.01,
                use_kl_loss=False,
                vf_clip_param=math.inf,
                vf_loss_coeff=0.25,
                grad_clip=0.5,
                grad_clip_by="global_norm",
            )
            .rl_module(
                model_config=DefaultModelConfig(
                    fcnet_hiddens=args.hidden,
                    fcnet_activation="tanh",
                    vf_share_layers=False,
                )
            )
            .reporting(metrics_num_episodes_for_smoothing=max(1, args.batch // episode_length))
        )
        algorithm = config.build_algo()
        started = time.perf_counter()
        steps = 0
        while steps < args.env_steps:
            result = algorithm.train()
            runners = result["env_runners"]
            steps = int(runners["num_env_steps_sampled_lifetime"])
            episode_return = runners.get("episode_return_mean")
            print(
                json.dumps(
                    {
                        "env_steps": steps,
                        "seconds": time.perf_counter() - started,
                        "return_per_agent": None
                        if episode_return is None or math.isnan(episode_return)
                        else episode_return / len(agents),
                        "episodes": int(runners.get("num_episodes", 0)),
                    }
                ),
                flush=True,
            )
        algorithm.stop()


if __name__ == "__main__":
    main()
