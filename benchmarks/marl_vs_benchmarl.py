"""MARL against BenchMARL: the same tasks, algorithms, frame budget, environment copies, seeds and evaluation.

For each (algorithm, task) pair it trains, one system at a time (all of BenchMARL's seeds, then
all of ours, never two runs at once):

- **BenchMARL** 1.5.2 (the peer, `benchmarks/benchmarl_peer.py`), in a virtual environment of its
  own (`benchmarks/benchmarl_venv.py`, `--peer-venv`, default `.bench/benchmarl-venv`): its
  `Experiment` with its own yaml configs for the algorithm, the task, the MLP and the experiment;
- **this project** (`iterate_marl_local`, the in-process loop `marl_vs_rllib.py` times), with its
  own configs: `configs/marl/<task>/<algorithm>.yaml` where that file exists, else the
  algorithm's `configs/marl/simple_spread/<algorithm>.yaml` (the settings this project tuned on
  MPE), else the algorithm's defaults; the config's settings, steps per round and learner
  threads are kept, the rest is set below.

Shared by both sides, everything else being each side's own:

- the task. PettingZoo's MPE (`simple_spread`, `simple_speaker_listener`): BenchMARL's
  `pettingzoo/<task>` against this project's `pettingzoo:mpe2.<task>_v*`. BenchMARL needs
  PettingZoo 1.24.3's MPE where this project plays `mpe2`, so `benchmarl_differential.py`
  first plays the same seeds and actions on both and the benchmark stops if any observation,
  reward or state differs. VMAS (`navigation`, `balance`): this project's environment name is
  written from BenchMARL's task yaml (`vmas:navigation(n_agents=3,...,max_steps=100)`), the
  same VMAS version on both sides;
- the episode length: VMAS's `max_steps` 100 (BenchMARL's yamls); MPE's `max_cycles` 25, MPE's
  own default and what `pettingzoo:mpe2.*` plays. BenchMARL's MPE yamls say 100, and this
  project's PettingZoo names take no arguments, so BenchMARL's side is set to 25 (`TASKS`);
- the kind of actions: discrete by default, BenchMARL running with
  `prefer_continuous_actions=False` (its yaml would pick continuous actions for VMAS and MPE with
  MAPPO and IPPO). `--vmas-actions continuous` plays VMAS's continuous actions on both sides with
  MAPPO and IPPO (this project: `continuous_actions=True` in the name, a Gaussian policy); MPE
  stays discrete (this project's PettingZoo adapter plays discrete actions only), and so does
  QMIX, whose actions are discrete on both sides;
- the frame budget (`--frames`), in joint environment steps of all copies, BenchMARL's "frames"
  and this project's `env_steps` alike. BenchMARL's side sets the pace: its PPO yaml takes 675
  gradient steps of 400 frames through 256-wide networks per 6,000-frame iteration (its
  QMIX, 1,000 of 128), where this project's PPO configs take a fifth to a half as many per frame
  through 64- to 256-wide ones, so its default budget of 3 million frames is out of reach on two
  cores and the default here is 120,000 (20 of its iterations). Each side trains whole iterations of
  its own size (BenchMARL: 6,000 frames; this project: steps per round x copies), so BenchMARL's
  budget is rounded up to whole evaluation intervals and this project's to the whole number of
  its rounds nearest to what BenchMARL trained; the table shows the frames each trained;
- the environment copies (`--envs`, one process each: BenchMARL's collector in the driver, this
  project's one in-process worker);
- the seeds (`--seeds`), each run a fresh process on BenchMARL's side;
- the evaluation protocol: `--eval-episodes` whole episodes, deterministic (greedy) actions,
  every `--eval-every` BenchMARL iterations' worth of frames (this project: the nearest whole
  number of its rounds) and after the last iteration.

**Final return** is the same on both sides: the mean, over the greedy evaluation after the last
iteration, of each episode's rewards summed over its steps and averaged over all agents; the
table gives its mean and standard error over seeds. Training-episode returns are kept in each
run's JSON (`--results`) but depend on each side's exploration, so they do not enter the
comparison.

One asymmetry is BenchMARL's own and left as it is: on MPE it steps its copies as a `SerialEnv`
of PettingZoo environments each made with the experiment's seed, so all copies start every
episode from the same positions (VMAS draws each copy's own); this project seeds each copy apart.

Printed per pair: both final returns, mean wall seconds per run (environments, networks and the
whole training loop, evaluations included, imports excluded), frames per second, the difference
of the final returns (ours - BenchMARL's, with its standard error: MPE's returns are negative,
where a ratio above 1 means worse) and their ratio, the ratios of frames per second (ours /
BenchMARL's) and of wall seconds (BenchMARL's / ours), the wall seconds each needs to reach
BenchMARL's final return (mean over the seeds that reach it), the load average before and after
each system (time only on a quiet machine), and both sides' package versions. MLflow
(`--tracking-uri`, by default a SQLite file under `.bench/`: MLflow 3's file store refuses new
runs) gets one run per task: every pair's figures as metrics, both systems' evaluation curves as
step metrics, one plot per task (return against frames and against wall seconds, every pair,
both systems), the table as text.

    python benchmarks/marl_vs_benchmarl.py                                   # the issue's pairs, 3 seeds
    python benchmarks/marl_vs_benchmarl.py --tasks navigation --algorithms mappo --seeds 0 --frames 12000
    python benchmarks/marl_vs_benchmarl.py --pairs qmix:simple_spread mappo:balance
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks"
sys.path.insert(0, str(HERE))
CONFIGS = ROOT / "configs" / "marl"

from benchmarl_tasks import TASKS  # noqa: E402 (the folder is put on the path just above)

ALGORITHMS = ["mappo", "ippo", "qmix"]
DEFAULT_PAIRS = [(a, t) for a in ("mappo", "ippo") for t in TASKS] + [("qmix", "simple_spread")]
EXPERIMENT = "marl-vs-benchmarl"  # MLflow's
OUR_VERSIONS = ["torch", "vmas", "pettingzoo", "mpe2", "gymnasium", "numpy"]


def continuous(name: str, algorithm: str, args) -> bool:
    """Whether the pair plays continuous actions (`--vmas-actions`; VMAS with PPO only)."""
    return args.vmas_actions == "continuous" and TASKS[name].family == "vmas" and algorithm in ("mappo", "ippo")


def our_env_name(name: str, task_config: dict, continuous_actions: bool = False) -> str:
    """This project's name for the task: fixed for MPE, from BenchMARL's yaml for VMAS (every
    argument it sets, the episode length last)."""
    task = TASKS[name]
    if task.ours is not None:
        return task.ours
    arguments = {k: v for k, v in task_config.items() if k != "max_steps"}
    if continuous_actions:
        arguments["continuous_actions"] = True
    listed = ",".join(f"{k}={v!r}" for k, v in arguments.items())
    return f"vmas:{task.benchmarl.split('/')[1]}({listed},max_steps={task.max_steps})"


def our_config_file(name: str, algorithm: str) -> Path | None:
    for folder in (name, "simple_spread"):
        path = CONFIGS / folder / f"{algorithm}.yaml"
        if path.exists():
            return path
    return None


def our_base(name: str, algorithm: str) -> tuple[dict, int, int]:
    """(settings, steps per round, learner threads) of this project's config for the pair."""
    import yaml

    from marl_core.marl.config import MARLConfig

    path = our_config_file(name, algorithm)
    base = yaml.safe_load(path.read_text()) if path else {}
    defaults = MARLConfig.model_fields
    steps = base.get("steps_per_round", defaults["steps_per_round"].default)
    threads = base.get("learner_threads", defaults["learner_threads"].default)
    return base.get("settings", {}), steps, threads


# --- the two sides -----------------------------------------------------------------------------


def describe(python: Path, name: str) -> dict:
    task = TASKS[name]
    command = [str(python), str(HERE / "benchmarl_peer.py"), "--task", task.benchmarl, "--describe"]
    command += ["--max-steps", str(task.max_steps)]
    process = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(process.stdout.splitlines()[-1])


def run_benchmarl(python: Path, name: str, algorithm: str, seed: int, args, out: Path) -> dict:
    task = TASKS[name]
    command = [str(python), str(HERE / "benchmarl_peer.py"), "--task", task.benchmarl, "--algorithm", algorithm]
    command += ["--frames", str(args.frames), "--envs", str(args.envs), "--seed", str(seed)]
    command += ["--max-steps", str(task.max_steps), "--eval-every", str(args.eval_every)]
    command += ["--eval-episodes", str(args.eval_episodes), "--out", str(out)]
    command += ["--continuous"] if continuous(name, algorithm, args) else []
    process = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    if process.returncode != 0:
        raise SystemExit(f"BenchMARL peer failed ({algorithm} on {name}, seed {seed}):\n{process.stderr[-3000:]}")
    return json.loads(out.read_text())


def run_ours(name: str, algorithm: str, seed: int, task_config: dict, frames: int, eval_frames: int, args) -> dict:
    """The in-process loop for the whole number of rounds nearest to `frames` joint steps,
    evaluating about every `eval_frames` and after the last round."""
    from marl_core.marl.config import MARLConfig
    from marl_core.marl.rounds import iterate_marl_local

    settings, steps_per_round, learner_threads = our_base(name, algorithm)
    per_round = steps_per_round * args.envs
    env = our_env_name(name, task_config, continuous(name, algorithm, args))
    config = MARLConfig(
        env=env,
        algorithm=algorithm,
        settings=settings,
        rounds=max(1, round(frames / per_round)),
        steps_per_round=steps_per_round,
        learner_threads=learner_threads,
        envs_per_worker=args.envs,
        workers=1,
        eval_every=max(1, round(eval_frames / per_round)),
        eval_episodes=args.eval_episodes,
        checkpoint_every=10**9,
        seed=seed,
    )
    curve: dict = {"train": [], "eval": []}
    started = time.perf_counter()
    for record, _ in iterate_marl_local(config):
        seconds = time.perf_counter() - started
        agents = [k for k in record.train_returns if not k.startswith("policy/")]
        curve["train"].append(
            {
                "frames": record.env_steps,
                "seconds": seconds,
                "return": float(np.mean([record.train_returns[a] for a in agents])) if agents else None,
            }
        )
        if record.eval_returns:
            agents = [k for k in record.eval_returns if not k.startswith("policy/")]
            curve["eval"].append(
                {
                    "frames": record.env_steps,
                    "seconds": seconds,
                    "return": float(np.mean([record.eval_returns[a] for a in agents])),
                }
            )
    return {
        "system": "ours",
        "frames": curve["train"][-1]["frames"],
        "seconds": time.perf_counter() - started,
        "frames_per_round": per_round,
        "eval_every_rounds": config.eval_every,
        "env": env,
        "config": str(path.relative_to(ROOT)) if (path := our_config_file(name, algorithm)) else "defaults",
        "settings": settings,
        **curve,
    }


# --- figures -----------------------------------------------------------------------------------


def mean_and_stderr(values) -> tuple[float, float]:
    values = np.asarray(values, dtype=float)
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def time_to(run: dict, target: float) -> float | None:
    return next((p["seconds"] for p in run["eval"] if p["return"] >= target), None)


@dataclasses.dataclass
class Pair:
    task: str
    algorithm: str
    runs: dict[str, list[dict]]  # system -> one run per seed
    load: dict[str, tuple[float, float]]  # system -> load average before, after

    def final(self, system: str) -> tuple[float, float]:
        return mean_and_stderr([run["eval"][-1]["return"] for run in self.runs[system]])

    def seconds(self, system: str) -> float:
        return float(np.mean([run["seconds"] for run in self.runs[system]]))

    def rate(self, system: str) -> float:
        return float(np.mean([run["frames"] / run["seconds"] for run in self.runs[system]]))

    def frames(self, system: str) -> int:
        return int(np.mean([run["frames"] for run in self.runs[system]]))

    def reach(self, system: str) -> tuple[float | None, int]:
        """Mean wall seconds to BenchMARL's final return over the seeds that reach it, and how many do."""
        target = self.final("benchmarl")[0]
        times = [t for t in (time_to(run, target) for run in self.runs[system]) if t is not None]
        return (float(np.mean(times)) if times else None), len(times)


def report(pair: Pair) -> str:
    seeds = len(pair.runs["ours"])
    target = pair.final("benchmarl")[0]
    theirs_run, ours_run = pair.runs["benchmarl"][0], pair.runs["ours"][0]
    lines = [
        f"\n{pair.algorithm} on {pair.task}, {seeds} seed(s); final return: greedy evaluation after the last "
        f"iteration, per agent, mean ± standard error over seeds; target = BenchMARL's final return {target:.3f}",
        f"actions: {'continuous' if theirs_run['continuous_actions'] else 'discrete'}; "
        f"BenchMARL: its yamls, {theirs_run['frames_per_batch']} frames an iteration, "
        f"{theirs_run['torch_threads']} torch threads; ours: {ours_run['env']}, {ours_run['config']} "
        f"{ours_run['settings']}, "
        f"{ours_run['frames_per_round']} frames a round, evaluating every {ours_run['eval_every_rounds']} rounds",
        f"{'':10s} {'frames':>8s} {'final return':>17s} {'wall s':>8s} {'frames/s':>9s} {'s to target':>14s} "
        f"{'load before/after':>18s}",
    ]
    for system in ("benchmarl", "ours"):
        mean, stderr = pair.final(system)
        reached, count = pair.reach(system)
        to_target = f"{reached:.1f} ({count}/{seeds})" if reached is not None else f"never (0/{seeds})"
        before, after = pair.load[system]
        lines.append(
            f"{system:10s} {pair.frames(system):8d} {mean:9.3f} ± {stderr:5.3f} {pair.seconds(system):8.1f} "
            f"{pair.rate(system):9.0f} {to_target:>14s} {before:8.2f} / {after:5.2f}"
        )
    (ours, ours_stderr), (theirs, theirs_stderr) = pair.final("ours"), pair.final("benchmarl")
    ratio = f"{ours / theirs:.2f}x" if ours * theirs > 0 else "n/a (signs differ)"
    lines.append(
        f"ours against BenchMARL: return {ours - theirs:+.3f} ± {np.hypot(ours_stderr, theirs_stderr):.3f} "
        f"(ours - theirs), ratio {ratio}; frames/s "
        f"{pair.rate('ours') / pair.rate('benchmarl'):.2f}x; wall BenchMARL/ours "
        f"{pair.seconds('benchmarl') / pair.seconds('ours'):.2f}x"
    )
    return "\n".join(lines)


def task_plot(name: str, pairs: list[Pair]):
    """Greedy evaluation return (mean over seeds) against frames and against wall seconds: one
    line per algorithm and system, BenchMARL's dashed with crosses."""
    from flows.tracking import plots

    figure, (by_frames, by_time) = plots.plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for n, pair in enumerate(pairs):
        color = f"C{n}"
        for system, style, marker in (("benchmarl", "--", "x"), ("ours", "-", ".")):
            runs = pair.runs[system]
            length = min(len(run["eval"]) for run in runs)
            frames = np.mean([[p["frames"] for p in run["eval"][:length]] for run in runs], axis=0)
            seconds = np.mean([[p["seconds"] for p in run["eval"][:length]] for run in runs], axis=0)
            value = np.mean([[p["return"] for p in run["eval"][:length]] for run in runs], axis=0)
            label = f"{pair.algorithm} {'BenchMARL' if system == 'benchmarl' else 'ours'}"
            by_frames.plot(frames, value, style, marker=marker, color=color, label=label)
            by_time.plot(seconds, value, style, marker=marker, color=color, label=label)
    by_frames.set_xlabel("frames (joint environment steps)")
    by_time.set_xlabel("wall seconds")
    by_frames.set_ylabel("greedy evaluation return per agent")
    for axis in (by_frames, by_time):
        axis.grid(alpha=0.3)
    by_time.legend(fontsize=8)
    figure.suptitle(f"{name}: BenchMARL dashed (x), this project solid (mean over seeds)")
    figure.tight_layout()
    return figure


def log_to_mlflow(tracking_uri: str, name: str, pairs: list[Pair], versions: dict, text: str, args) -> str:
    """One run per task in experiment `marl-vs-benchmarl`; created here, the experiment keeps its
    artifacts in `--artifacts` (MLflow's default is `./mlruns` of the working directory)."""
    import mlflow

    from flows.tracking import plots

    mlflow.set_tracking_uri(tracking_uri)
    if mlflow.get_experiment_by_name(EXPERIMENT) is None:
        mlflow.create_experiment(EXPERIMENT, artifact_location=args.artifacts.resolve().as_uri())
    mlflow.set_experiment(EXPERIMENT)
    with mlflow.start_run(run_name=name) as run:
        mlflow.log_params(
            {
                "task": name,
                "benchmarl_task": TASKS[name].benchmarl,
                "max_steps": TASKS[name].max_steps,
                "frames": args.frames,
                "envs": args.envs,
                "seeds": ",".join(map(str, args.seeds)),
                "eval_episodes": args.eval_episodes,
                "eval_every": args.eval_every,
                "vmas_actions": args.vmas_actions,
                **{f"version/{side}/{k}": v for side, vs in versions.items() for k, v in vs.items()},
            }
        )
        for pair in pairs:
            for system in ("benchmarl", "ours"):
                mean, stderr = pair.final(system)
                prefix = f"{pair.algorithm}/{system}"
                mlflow.log_metrics(
                    {
                        f"{prefix}/final_return": mean,
                        f"{prefix}/final_return_stderr": stderr,
                        f"{prefix}/wall_seconds": pair.seconds(system),
                        f"{prefix}/frames_per_second": pair.rate(system),
                    }
                )
                runs = pair.runs[system]
                for i in range(min(len(r["eval"]) for r in runs)):
                    frames = int(np.mean([r["eval"][i]["frames"] for r in runs]))
                    value = float(np.mean([r["eval"][i]["return"] for r in runs]))
                    mlflow.log_metric(f"{prefix}/eval_return", value, step=frames)
        figure = task_plot(name, pairs)
        mlflow.log_figure(figure, f"plots/{name}.png")
        plots.close(figure)
        mlflow.log_text(text, "table.txt")
        return run.info.run_id


# --- the run -----------------------------------------------------------------------------------


def pairs_to_run(args) -> list[tuple[str, str]]:
    if args.pairs:
        out = [tuple(p.split(":")) for p in args.pairs]
        for algorithm, task in out:
            if algorithm not in ALGORITHMS or task not in TASKS:
                raise SystemExit(f"--pairs {algorithm}:{task}: algorithms {ALGORITHMS}, tasks {list(TASKS)}")
        return out
    if args.tasks or args.algorithms:
        return [(a, t) for t in (args.tasks or list(TASKS)) for a in (args.algorithms or ["mappo", "ippo"])]
    return DEFAULT_PAIRS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS))
    parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS)
    parser.add_argument("--pairs", nargs="+", metavar="ALGORITHM:TASK", help="instead of --tasks x --algorithms")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--frames", type=int, default=120_000, help="frame budget per run (joint steps of all copies)")
    parser.add_argument("--envs", type=int, default=10, help="environment copies (BenchMARL's default 10)")
    parser.add_argument(
        "--vmas-actions", choices=["discrete", "continuous"], default="discrete", help="VMAS with MAPPO and IPPO"
    )
    parser.add_argument("--eval-every", type=int, default=1, help="BenchMARL iterations between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=32)
    parser.add_argument("--timeout", type=int, default=4 * 3600, help="seconds one BenchMARL run may take")
    parser.add_argument("--peer-venv", type=Path, default=ROOT / ".bench" / "benchmarl-venv")
    parser.add_argument("--results", type=Path, default=ROOT / ".bench" / "marl-vs-benchmarl", help="runs' JSON")
    parser.add_argument("--tracking-uri", default=f"sqlite:///{ROOT / '.bench' / 'mlflow.db'}")
    parser.add_argument(
        "--artifacts", type=Path, default=ROOT / ".bench" / "mlartifacts", help="artifacts of a new MLflow experiment"
    )
    args = parser.parse_args()

    from benchmarl_differential import check
    from benchmarl_venv import peer_python

    pairs = pairs_to_run(args)
    tasks = list(dict.fromkeys(task for _, task in pairs))
    python = peer_python(args.peer_venv)
    mpe = [t for t in tasks if TASKS[t].family == "pettingzoo"]
    if mpe and not check(mpe, python):
        raise SystemExit("BenchMARL's MPE and this project's differ (above): no comparison on them")
    args.results.mkdir(parents=True, exist_ok=True)
    versions = {"ours": {d: version(d) for d in OUR_VERSIONS}}
    for name in tasks:
        described = describe(python, name)
        versions["benchmarl"] = described["versions"]
        print(f"\n{name}: BenchMARL's {TASKS[name].benchmarl} {described['task_config']}", flush=True)
        done = []
        for algorithm in [a for a, t in pairs if t == name]:
            runs, load = {}, {}
            for system in ("benchmarl", "ours"):  # one system at a time
                before, runs[system] = os.getloadavg()[0], []
                for seed in args.seeds:
                    out = args.results / f"{name}-{algorithm}-{system}-seed{seed}.json"
                    if system == "benchmarl":
                        run = run_benchmarl(python, name, algorithm, seed, args, out)
                        frames = run["frames"]  # ours trains as near to that as its rounds allow
                        eval_frames = run["frames_per_batch"] * args.eval_every
                    else:
                        run = run_ours(name, algorithm, seed, described["task_config"], frames, eval_frames, args)
                        out.write_text(json.dumps(run))
                    runs[system].append(run)
                    print(
                        f"  {algorithm} {system} seed {seed}: {run['frames']} frames in {run['seconds']:.1f} s, "
                        f"final return {run['eval'][-1]['return']:.3f}",
                        flush=True,
                    )
                load[system] = (before, os.getloadavg()[0])
            pair = Pair(name, algorithm, runs, load)
            print(report(pair), flush=True)
            done.append(pair)
        text = "\n".join(report(p) for p in done)
        text += f"\nversions: BenchMARL side {versions['benchmarl']}; this project {versions['ours']}"
        print(f"versions: BenchMARL side {versions['benchmarl']}\n          this project {versions['ours']}")
        run_id = log_to_mlflow(args.tracking_uri, name, done, versions, text, args)
        print(f"MLflow run {run_id} ({args.tracking_uri}, experiment marl-vs-benchmarl)", flush=True)


if __name__ == "__main__":
    main()
