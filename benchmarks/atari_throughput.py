r"""Rollout throughput on two-player Pong from pixels, against a plain loop and against RLlib.

In one run on this machine, on the same preprocessed environment (`atari:pong_v3`: frame skip 4,
max-pool, 84x84 grayscale, 4 stacked frames, agent indicator):

- **plain loop**: one process steps one copy with uniformly random actions, nothing else: the
  speed of the environment itself;
- **this project's rollout system** with 1 and with 2 rollout workers (Ray actors, one CPU and
  one torch thread each) of `--envs` copies, acting with the untrained Nature-CNN actor-critic of
  `configs/marl/pong/ippo.yaml` (one forward pass per step for both paddles of every copy), every
  fragment shipped back to the driver, two ways:
  - *rounds*: the synchronous MARL collection step (`steps.collect_rollouts`, what
    `psro marl run` does each round for PPO): every worker plays a fragment, the driver joins
    them into the learner's batch, and the next round starts;
  - *streaming*: the asynchronous learners' path (APPO, IMPALA): every worker plays fragment
    after fragment into a dataset server, and the driver takes them as a learner would;
- **RLlib** (the peer, in its own venv, `benchmarks/rllib_atari_peer.py`): the same number of
  remote EnvRunners and copies sampling the same environment with the same convolutions. Its
  episodes stay in the runners (only their step counts come back): its figure leaves out the
  shipping that ours include.

Timed in short windows, in `--repeats` rounds. In each round, each system in turn is started,
timed with 1 and then 2 workers between two plain-loop windows, and stopped: only one of them
runs at a time. This machine's speed drifts by more than the differences measured, so each
ratio is taken within a round (against the plain-loop windows around it, and against RLlib's
windows of the same round), and the median over rounds is printed. Figures are joint steps per
second (both paddles act in each) and emulator frames per second (4 per step). The load average
is printed beside them: time only on a quiet machine.

Copies per worker: `--envs 16` by default, for both sides, with our fragments of `--steps 64`
(1,024 joint steps per worker per round, as 8 copies x 128). One forward pass serves every copy
of a worker, and the per-sample cost of the convolutions falls with the batch; figures for 8 and
16 copies are in docs/performance.md. `configs/marl/pong/ippo.yaml` learns with 4 copies per
worker, as measured there.

Learning is the README's run, `psro marl run --config configs/marl/pong/ippo.yaml`: its
`eval_return/vs_uniform/<agent>` metrics are the return against a uniformly random paddle, a curve
per agent in MLflow and a line each in `plots/episode_return.png`.

    python benchmarks/atari_throughput.py [--seconds 10] [--repeats 3] [--envs 16] [--steps 64] \
        [--peer-venv .bench/rllib-venv]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
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


class PlainLoop:
    """One copy stepped with uniformly random actions, nothing else: the environment's own speed."""

    def __init__(self):
        from marl_core.envs import make_env

        self.env = make_env("atari:pong_v3")
        self.rng = np.random.default_rng(0)
        self.step = self.env.reset(seed=0)

    def window(self, seconds: float) -> float:
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            self.step = self.env.step({a: int(self.rng.integers(6)) for a in self.step.acting})
            steps += 1
            if self.step.done:
                self.step = self.env.reset()
        return steps / (time.perf_counter() - started)


@dataclasses.dataclass
class _Pool:
    """One of our pools, its learner, and the round its fragment streams go on with."""

    config: object
    pool: object
    learner: object
    next_round: int = 1


@dataclasses.dataclass
class _Streamed:
    """What `async_rounds.stream_rollouts` asks of the asynchronous learners: their workers'
    build specs and the dataset server the fragments go to."""

    learner: object
    sink: str

    def specs(self):
        return self.learner.specs()


class OurRollouts:
    """The MARL collection step on Ray: one pool of 1 worker and one of 2, started once."""

    def __init__(self, envs: int, steps: int):
        import ray

        from marl_core.marl.config import MARLConfig, layout_and_spec, make_learner, pool_config
        from marl_core.marl.learner_handles import LocalLearner
        from marl_core.marl.steps import collect_rollouts
        from marl_core.rollout.pool import WorkerPool

        settings = yaml.safe_load((ROOT / "configs" / "marl" / "pong" / "ippo.yaml").read_text())
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, address="local", configure_logging=False)
        self.pools, self.streams = {}, 0
        for workers in (1, 2):
            config = MARLConfig(**{**settings, "workers": workers, "envs_per_worker": envs, "steps_per_round": steps})
            layout, spec = layout_and_spec(config)
            learner = LocalLearner(make_learner(config, layout, spec.state_size))
            pool = WorkerPool(pool_config(config), on_ray=True)
            collect_rollouts(config, pool, learner, 0)  # warm-up: actors started, copies reset
            self.pools[workers] = _Pool(config, pool, learner)

    def window(self, workers: int, seconds: float) -> float:
        """Synchronous rounds: every worker plays a fragment, the driver gathers them, again."""
        from marl_core.marl.steps import collect_rollouts

        ours = self.pools[workers]
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            steps += collect_rollouts(ours.config, ours.pool, ours.learner, ours.next_round).env_steps
            ours.next_round += 1
        return steps / (time.perf_counter() - started)

    def stream_window(self, workers: int, seconds: float) -> float:
        """Streaming, the asynchronous learners' path (`async_rounds.stream_rollouts`): every
        worker plays fragment after fragment into a dataset server (FIFO, 4 fragments) while
        the driver takes them as a learner would; joint steps of the fragments the driver took."""
        import threading

        import ray

        from marl_core.distributed.dataset_server import DatasetClient, DatasetServer
        from marl_core.distributed.settings import DatasetConfig
        from marl_core.marl.async_rounds import stream_rollouts

        ours = self.pools[workers]
        self.streams += 1
        name = f"atari-dataset-{self.streams}"
        server = (
            ray.remote(num_cpus=0, max_concurrency=8)(DatasetServer)
            .options(name=name)
            .remote(DatasetConfig(capacity=4))
        )
        dataset = DatasetClient(server)
        ours.learner.publish(ours.pool, ours.next_round)
        streaming = threading.Thread(
            target=stream_rollouts, args=(ours.config, ours.pool, _Streamed(ours.learner, name))
        )
        streaming.start()
        try:
            dataset.take(workers, 0, 600.0)  # the streams' first fragments: weights pulled
            steps, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                steps += sum(fragment.item.env_steps for fragment in dataset.take(1, 0, 600.0))
            rate = steps / (time.perf_counter() - started)
        finally:
            dataset.close()
            streaming.join()
            ray.kill(server)
        return rate

    def close(self) -> None:
        import ray

        for ours in self.pools.values():
            ours.pool.close()
        ray.shutdown()


class RLlibRollouts:
    """RLlib's EnvRunners in the peer's venv (`rllib_atari_peer.py`), serving timed windows."""

    def __init__(self, python: Path, envs: int):
        command = [str(python), str(ROOT / "benchmarks" / "rllib_atari_peer.py"), "--workers", "2", "--envs", str(envs)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._read()  # {"ready": true} once warmed up

    def _read(self) -> dict:
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise SystemExit(f"RLlib peer stopped (exit code {self.process.wait()}); its errors are above")

    def window(self, workers: int, seconds: float) -> float:
        self.process.stdin.write(f"{workers} {seconds}\n")
        self.process.stdin.flush()
        result = self._read()
        return result["joint_steps"] / result["seconds"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each timed window")
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds: each system started, timed and stopped once per round"
    )
    parser.add_argument("--envs", type=int, default=16, help="environment copies per worker, both sides")
    parser.add_argument("--steps", type=int, default=64, help="ours: joint steps per copy per round (fragment length)")
    parser.add_argument("--peer-venv", type=Path, default=ROOT / ".bench" / "rllib-venv")
    args = parser.parse_args()
    python = peer_python(args.peer_venv)

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    plain = PlainLoop()
    starts = {"ours": lambda: OurRollouts(args.envs, args.steps), "rllib": lambda: RLlibRollouts(python, args.envs)}
    kinds = {"ours": ("rounds", "streaming"), "rllib": ("sample",)}
    rates: dict[tuple[str, str, int], list[float]] = collections.defaultdict(
        list
    )  # (side, kind, workers); workers 0: the plain loop beside it
    for repeat in range(args.repeats):
        for side, start in starts.items():
            # One system at a time: the processes of the other, even idle, slowed it (docs/performance.md).
            system = start()
            try:
                before = plain.window(args.seconds)
                for w in (1, 2):
                    for kind in kinds[side]:
                        timed = system.stream_window if kind == "streaming" else system.window
                        rates[side, kind, w].append(timed(w, args.seconds))
                rates[side, "", 0].append((before + plain.window(args.seconds)) / 2)
            finally:
                system.close()
        print(
            f"round {repeat + 1}/{args.repeats}: "
            + ", ".join(f"{' '.join(map(str, k))}: {v[-1]:.0f}" for k, v in rates.items()),
            flush=True,
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    # Each ratio is taken within a round, against the plain-loop windows just before and after
    # (and against RLlib's windows of the same round); the median over rounds is printed.
    r = {key: np.array(values) for key, values in rates.items()}
    print(f"\nmedians over {args.repeats} rounds of {args.seconds:g}-second windows; ratios paired within a round")
    print(f"{'':48s} {'steps/s':>8s} {'frames/s':>9s} {'x plain':>8s} {'x rllib':>8s}")
    plain_all = np.concatenate([r["ours", "", 0], r["rllib", "", 0]])
    print(
        f"{'plain loop (1 process, random actions)':48s} "
        f"{np.median(plain_all):8.0f} {np.median(plain_all) * FRAME_SKIP:9.0f} {1:7.2f}x"
    )
    for w in (1, 2):
        for side in starts:
            for kind in kinds[side]:
                values = r[side, kind, w]
                versus = f"{np.median(values / r['rllib', 'sample', w]):7.2f}x" if side == "ours" else ""
                name = f"{side} {kind}, {w} worker(s) x {args.envs} copies"
                print(
                    f"{name:48s} {np.median(values):8.0f} {np.median(values) * FRAME_SKIP:9.0f} "
                    f"{np.median(values / r[side, '', 0]):7.2f}x {versus:>8s}"
                )


if __name__ == "__main__":
    main()
