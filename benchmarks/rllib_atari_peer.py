"""The RLlib side of `atari_throughput.py`; runs inside the peer's own virtual environment
(`benchmarks/rllib_venv.py` makes it).

RLlib's multi-agent rollout of two-player Pong on the new API stack: `--workers` remote
EnvRunners (one CPU each), `--envs` copies per runner, every agent on one shared policy, the
RLModule RLlib's PPO builds with Mnih et al.'s convolutions ([32, 8, 4], [64, 4, 2], [64, 3, 1])
and a 512-unit layer, as this project's `nature_cnn`. The environment is this project's own
preprocessed one (`marl_core.envs.atari.AtariEnv`, imported from the checkout), handed to RLlib
as a PettingZoo parallel env whose observations are channels last, the image layout RLlib's
catalog expects for a convolutional encoder.

Only sampling is timed: runners' `sample()` (acting, stepping, building episodes), all at once.
The script serves timed windows on request, so that the benchmark can interleave them with its
own on a machine whose speed drifts: after the warm-up it prints `{"ready": true}`, then reads
one line per window from stdin, `<runners> <seconds>`, samples with the first `<runners>` of
its `--workers` runners until `<seconds>` have passed (`--steps` joint steps per copy per call),
and prints one JSON line: the joint environment steps sampled and the seconds they took. An
empty line or end of input stops it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def make_env():
    """This project's Pong as a PettingZoo parallel env, channels last."""
    sys.path.insert(0, str(ROOT))
    import numpy as np
    from gymnasium import spaces
    from pettingzoo import ParallelEnv

    from marl_core.envs.atari import AtariEnv

    class Pong(ParallelEnv):
        metadata = {"name": "pong_v3", "is_parallelizable": True}

        def __init__(self):
            self.env = AtariEnv("pong_v3")
            self.possible_agents = list(self.env.spec.agents)
            self.agents = []
            channels, height, width = self.env.observation_shape
            self.shape = (channels, height, width)
            self._space = spaces.Box(0.0, 255.0, (height, width, channels), np.float32)
            self._actions = spaces.Discrete(self.env.spec.num_actions[self.possible_agents[0]])

        def observation_space(self, agent):
            return self._space

        def action_space(self, agent):
            return self._actions

        def _observations(self, step):
            # uint8 pixels as the float32 Box RLlib's catalog builds a CNN for (ours convert them the same way)
            return {
                a: o.reshape(self.shape).transpose(1, 2, 0).astype(np.float32) for a, o in step.observations.items()
            }

        def reset(self, seed=None, options=None):
            step = self.env.reset(seed=seed)
            self.agents = list(step.acting)
            return self._observations(step), {a: {} for a in self.agents}

        def step(self, actions):
            step = self.env.step({a: int(x) for a, x in actions.items()})
            agents, self.agents = self.agents, list(step.acting)
            return (
                self._observations(step),
                {a: step.rewards[a] for a in agents},
                {a: step.terminations[a] for a in agents},
                {a: step.truncations[a] for a in agents},
                {a: {} for a in agents},
            )

    return Pong()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=4, help="environment copies per EnvRunner")
    parser.add_argument("--steps", type=int, default=64, help="joint steps per copy per sample() call")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
    from ray.tune.registry import register_env
    from rllib_common import local_ray, shared_policy_ppo  # benchmarks/, this script's directory

    register_env("pong", lambda _: ParallelPettingZooEnv(make_env()))
    with local_ray():
        config = shared_policy_ppo("pong", args.workers, args.envs, args.seed).rl_module(
            model_config=DefaultModelConfig(
                conv_filters=[[32, [8, 8], 4], [64, [4, 4], 2], [64, [3, 3], 1]],
                conv_activation="relu",
                head_fcnet_hiddens=[512],
                head_fcnet_activation="relu",
                vf_share_layers=True,
            )
        )
        algorithm = config.build_algo()
        group = algorithm.env_runner_group

        def sample(runners: int, steps: int) -> int:
            def run(runner):
                episodes = runner.sample(num_timesteps=steps * args.envs)
                return sum(episode.env_steps() for episode in episodes)

            return sum(
                group.foreach_env_runner(run, local_env_runner=False, remote_worker_ids=list(range(1, runners + 1)))
            )

        if sample(args.workers, 16) == 0:  # warm-up: environments reset, module built
            raise SystemExit("the EnvRunners sampled nothing (did they die? see Ray's worker logs)")
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            if not line.strip():
                break
            runners, seconds = int(line.split()[0]), float(line.split()[1])
            steps, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                steps += sample(runners, args.steps)
            print(
                json.dumps({"workers": runners, "joint_steps": steps, "seconds": time.perf_counter() - started}),
                flush=True,
            )
        algorithm.stop()


if __name__ == "__main__":
    main()
