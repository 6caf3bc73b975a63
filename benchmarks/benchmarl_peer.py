"""The BenchMARL side of `marl_vs_benchmarl.py`; runs inside the peer's own venv (`benchmarl_venv.py`).

One (algorithm, task, seed) through BenchMARL's `Experiment`, with BenchMARL's own configs: the
algorithm's yaml (`benchmarl/conf/algorithm/<algorithm>.yaml`), the task's
(`conf/task/<environment>/<task>.yaml`), the MLP of `conf/model/layers/mlp.yaml` for actor and
critic and `conf/experiment/base_experiment.yaml`. Overridden are only what both sides must share:

- the frame budget (`max_n_frames`, joint environment steps of all copies: BenchMARL's frames
  are joint steps, as this project's `env_steps`). BenchMARL trains whole iterations of its own
  batch (6,000 frames in its yaml), so the budget is rounded up to whole evaluation intervals;
  the JSON says how many frames were trained;
- the environment copies (`on_policy_n_envs_per_worker`, `off_policy_n_envs_per_worker`);
- the seed;
- the episode length (`--max-steps`: the task's `max_steps` for VMAS, `max_cycles` for
  PettingZoo; BenchMARL's MPE yamls say 100 where MPE's own default, the one this project's
  `pettingzoo:mpe2.*` names play, is 25);
- the kind of actions: discrete (`prefer_continuous_actions=False`) unless `--continuous`.
  BenchMARL's yaml prefers continuous ones where task and algorithm have both (VMAS and MPE with
  MAPPO and IPPO); this project's PettingZoo adapter plays discrete actions only, and its VMAS
  continuous ones are PPO's alone, so the driver asks for them only for VMAS with MAPPO or IPPO;
- the evaluation protocol: deterministic (greedy) evaluation of `--eval-episodes` whole episodes
  every `--eval-every` iterations and after the last (`evaluation_interval`, budget rounded so
  that the last iteration is one), as the driver sets this project's side;
- what only costs time and writes files: no loggers, no rendering, no checkpoints; the marl-eval
  JSON (`create_json`) stays on because BenchMARL evaluates only when some logger or that JSON
  is on; it goes to a temporary folder, removed at the end.

Returns, as this project's side computes them: an episode's rewards summed over its steps, then
averaged over all agents (every group), then over episodes. Evaluation episodes are cut at their
first done, as BenchMARL's own logger cuts them.

The clock starts before the `Experiment` is built (its environments, networks and collector,
as this project's side builds its pool and learner inside the timed loop) and each curve point
carries the seconds since then; `--torch-threads 0` leaves torch's default, BenchMARL's own.

Writes `--out`: the versions imported, the settings used, one point per training iteration
(frames, seconds, mean return of the training episodes that ended in it) and one per evaluation
(frames, seconds, mean and standard error over its episodes).

    python benchmarks/benchmarl_peer.py --algorithm mappo --task vmas/navigation --frames 60000 --out run.json
    python benchmarks/benchmarl_peer.py --task pettingzoo/simple_spread --describe   # the task's yaml, as JSON
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from benchmarl.experiment.callback import Callback

# distributions reported beside the figures (benchmarl_venv.REPORTED, repeated: this runs in the peer's venv)
REPORTED = ["benchmarl", "torchrl", "tensordict", "torch", "torchvision", "vmas", "pettingzoo", "gymnasium", "numpy"]
EPISODE_LENGTH_KEY = {"vmas": "max_steps", "pettingzoo": "max_cycles"}


def load_task(name: str, max_steps: int | None):
    """`vmas/navigation` -> BenchMARL's task with its yaml config, the episode length overridden."""
    from benchmarl.environments import PettingZooTask, VmasTask

    environment, task = name.split("/")
    enum = {"vmas": VmasTask, "pettingzoo": PettingZooTask}[environment]
    loaded = enum[task.upper()].get_from_yaml()
    if max_steps is not None:
        loaded.config[EPISODE_LENGTH_KEY[environment]] = max_steps
    return loaded


def algorithm_config(name: str):
    from benchmarl.algorithms import IppoConfig, MappoConfig, QmixConfig

    return {"mappo": MappoConfig, "ippo": IppoConfig, "qmix": QmixConfig}[name].get_from_yaml()


def versions() -> dict[str, str]:
    return {dist: version(dist) for dist in REPORTED}


def episode_returns(groups: dict, rewards: dict) -> list[float]:
    """Per episode, its return averaged over all agents: `rewards[group]` is [episodes, agents]
    of summed rewards, every group's rows the same episodes."""
    import torch

    total = sum(rewards[g].sum(-1) for g in groups)  # [episodes]
    agents = sum(len(agents) for agents in groups.values())
    return (total / agents).to(torch.float64).tolist()


def per_agent(td, group: str, key: str):
    """`key` ("reward", "episode_reward") of each agent of `group` as [..., agents]; a task that
    pays one team reward has it at the top level, shared by every agent (as BenchMARL's logger reads it)."""
    value = td.get(("next", group, key), None)
    if value is None:
        value = td.get(("next", key)).expand(*td.get(group).shape, 1)
    return value.squeeze(-1)


class Recorder(Callback):
    """Records the curves from BenchMARL's own hooks, reading its batches and rollouts. At module
    level: BenchMARL pickles its callbacks with the experiment's config."""

    def __init__(self, started: float, curve: dict):
        super().__init__()
        self.started, self.curve = started, curve

    def on_batch_collected(self, batch):
        experiment = self.experiment
        groups = experiment.group_map
        done = batch.get(("next", "done")).squeeze(-1)  # [copies, steps]: the episode ended
        rewards = {g: per_agent(batch, g, "episode_reward")[done] for g in groups}
        returns = episode_returns(groups, rewards)
        self.curve["train"].append(
            {
                "frames": experiment.total_frames,
                "seconds": time.perf_counter() - self.started,
                "return": sum(returns) / len(returns) if returns else None,
                "episodes": len(returns),
            }
        )

    def on_evaluation_end(self, rollouts):
        experiment = self.experiment
        groups = experiment.group_map
        returns = []
        for rollout in rollouts:
            ends = rollout.get(("next", "done")).squeeze(-1).nonzero(as_tuple=True)[0]
            if ends.numel():
                rollout = rollout[: int(ends[0]) + 1]
            rewards = {g: per_agent(rollout, g, "reward").sum(0)[None] for g in groups}
            returns += episode_returns(groups, rewards)
        mean = sum(returns) / len(returns)
        spread = math.sqrt(sum((r - mean) ** 2 for r in returns) / max(1, len(returns) - 1))
        self.curve["eval"].append(
            {
                "frames": experiment.total_frames,
                "seconds": time.perf_counter() - self.started,
                "return": mean,
                "stderr": spread / math.sqrt(len(returns)),
                "episodes": len(returns),
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="mappo", choices=["mappo", "ippo", "qmix"])
    parser.add_argument("--task", default="vmas/navigation", help="<vmas|pettingzoo>/<task>, BenchMARL's names")
    parser.add_argument("--frames", type=int, default=60_000, help="frame budget (joint steps of all copies)")
    parser.add_argument("--envs", type=int, default=10, help="environment copies")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, help="episode length (default: the task yaml's)")
    parser.add_argument("--eval-every", type=int, default=1, help="iterations between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--continuous", action="store_true", help="continuous actions where the task has them")
    parser.add_argument("--describe", action="store_true", help="print the task's config and batch sizes, no run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    task = load_task(args.task, args.max_steps)
    algorithm = algorithm_config(args.algorithm)
    config = ExperimentConfig.get_from_yaml()
    on_policy = algorithm.on_policy()
    batch = config.collected_frames_per_batch(on_policy)
    if args.describe:
        print(json.dumps({"task_config": dict(task.config), "frames_per_batch": batch, "versions": versions()}))
        return
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    interval = batch * args.eval_every
    frames = -(-args.frames // interval) * interval  # whole evaluation intervals: the last iteration evaluates
    config.max_n_frames = frames
    config.max_n_iters = None
    config.on_policy_n_envs_per_worker = args.envs
    config.off_policy_n_envs_per_worker = args.envs
    config.prefer_continuous_actions = args.continuous
    config.evaluation = True
    config.evaluation_interval = interval
    config.evaluation_episodes = args.eval_episodes
    config.evaluation_deterministic_actions = True
    config.loggers = []
    config.create_json = True  # BenchMARL evaluates only when a logger or this JSON is on
    config.render = False
    config.checkpoint_interval = 0
    config.checkpoint_at_end = False

    curve: dict = {"train": [], "eval": []}
    with tempfile.TemporaryDirectory(prefix="benchmarl-") as folder:
        config.save_folder = folder
        started = time.perf_counter()
        experiment = Experiment(
            task=task,
            algorithm_config=algorithm,
            model_config=MlpConfig.get_from_yaml(),
            critic_model_config=MlpConfig.get_from_yaml(),
            seed=args.seed,
            config=config,
            callbacks=[Recorder(started, curve)],
        )
        experiment.run()
        seconds = time.perf_counter() - started
    result = {
        "system": "benchmarl",
        "algorithm": args.algorithm,
        "task": args.task,
        "seed": args.seed,
        "envs": args.envs,
        "frames": experiment.total_frames,
        "seconds": seconds,
        "frames_per_batch": batch,
        "continuous_actions": experiment.continuous_actions,
        "task_config": dict(task.config),
        "torch_threads": torch.get_num_threads(),
        "versions": versions(),
        **curve,
    }
    text = json.dumps(result)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
