r"""Collection rate on VMAS `navigation`: this project's rollout worker against VMAS's own loop.

In one process, on one CPU thread, with the same number of copies (`--envs`) on both sides:

- **VMAS's own loop**: `vmas.make_env("navigation", num_envs=N, continuous_actions=False)` stepped
  with uniformly random actions drawn in torch, every copy at once, the finished copies reset
  (all at once where all ended, as TorchRL's VMAS wrapper does, else `reset_at` each), nothing
  else: the simulator's own batched speed;
- **ours**: a MARL collect-then-learn round's collection (`marl_core.marl.steps.collect_rollouts`,
  what `psro marl run` does each round for MAPPO) on `vmas:navigation`: one rollout worker whose
  N copies step in one VMAS call per joint step (`BatchedStream`), acting with MAPPO's untrained
  actor (one forward pass for every agent of every copy), recording the fragment
  (`JointExperience`) and handing it to the learner's side.

Windows of `--seconds` alternate between the two, `--repeats` times; each ratio is taken within a
round (ours against the VMAS windows on either side of it) and the median over rounds is printed,
with the load average: time only on a quiet machine. Figures are joint steps per second (every
agent of a copy acts in a joint step).

    python benchmarks/vmas_throughput.py [--envs 64] [--seconds 5] [--repeats 3] [--steps 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MAX_STEPS = 100  # as `vmas:navigation` without arguments, and BenchMARL's navigation task


class VmasLoop:
    def __init__(self, envs: int):
        import torch
        import vmas

        self.torch = torch
        self.env = vmas.make_env(
            "navigation",
            num_envs=envs,
            device="cpu",
            continuous_actions=False,
            max_steps=MAX_STEPS,
            terminated_truncated=True,
            seed=0,
        )
        self.envs = envs
        self.actions = [int(space.n) for space in self.env.action_space]
        self.env.reset()

    def window(self, seconds: float) -> float:
        torch, env = self.torch, self.env
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            actions = [torch.randint(n, (self.envs,)) for n in self.actions]
            _, _, terminated, truncated, _ = env.step(actions)
            ended = terminated | truncated
            if ended.all():  # as TorchRL's VMAS wrapper resets: all at once, else copy by copy
                env.reset()
            else:
                for e in torch.nonzero(ended).flatten().tolist():
                    env.reset_at(e, return_observations=False)
            steps += self.envs
        return steps / (time.perf_counter() - started)


class OurCollection:
    def __init__(self, envs: int, steps: int):
        from marl_core.marl.config import MARLConfig, layout_and_spec, make_learner, pool_config
        from marl_core.marl.learner_handles import LocalLearner
        from marl_core.marl.steps import collect_rollouts
        from marl_core.rollout.pool import WorkerPool

        self.config = MARLConfig(
            env="vmas:navigation", algorithm="mappo", workers=1, envs_per_worker=envs, steps_per_round=steps
        )
        layout, spec = layout_and_spec(self.config)
        self.learner = LocalLearner(make_learner(self.config, layout, spec.state_size))
        self.pool = WorkerPool(pool_config(self.config), on_ray=False)
        self.collect = collect_rollouts
        self.round = 0
        self.collect(self.config, self.pool, self.learner, self.round)  # warm-up: copies made and reset

    def window(self, seconds: float) -> float:
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            self.round += 1
            steps += self.collect(self.config, self.pool, self.learner, self.round).env_steps
        return steps / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=64, help="copies on both sides")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each timed window")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50, help="our fragments' joint steps per copy")
    args = parser.parse_args()

    import torch
    import vmas

    torch.set_num_threads(1)
    load_before = os.getloadavg()
    peer, ours = VmasLoop(args.envs), OurCollection(args.envs, args.steps)
    peer.window(1.0)  # warm-up
    rounds = []
    for _ in range(args.repeats):
        before = peer.window(args.seconds)
        mine = ours.window(args.seconds)
        after = peer.window(args.seconds)
        rounds.append((before, mine, after, mine / ((before + after) / 2)))
    load_after = os.getloadavg()

    print(f"VMAS {vmas.__version__}, torch {torch.__version__}: navigation, {args.envs} copies, 1 thread")
    print(f"{'round':>5} {'VMAS loop (before)':>19} {'ours':>10} {'VMAS loop (after)':>18} {'ours / VMAS':>12}")
    for n, (before, mine, after, ratio) in enumerate(rounds, 1):
        print(f"{n:>5} {before:>19,.0f} {mine:>10,.0f} {after:>18,.0f} {ratio:>11.2f}x")
    median = statistics.median(r[3] for r in rounds)
    print(f"median ratio, ours / VMAS's own loop: {median:.2f}x  (joint steps per second)")
    print(f"load average: {load_before[0]:.2f} before, {load_after[0]:.2f} after")


if __name__ == "__main__":
    main()
