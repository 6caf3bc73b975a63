"""The MPE benchmark suite: every MARL algorithm on five particle-environment tasks, over seeds.

Each applicable (task, algorithm) pair trains for the same budget of joint environment steps
from several seeds, through `iterate_marl_local` (the rollout engine and rounds the flows use).
The figure is an evaluation, before training and every so often during it, beside uniform-random
play scored the same way (`--uniform-episodes` episodes):

- a cooperative task (`simple_spread`, `simple_speaker_listener`, `simple_tag`): the team's
  return, the mean over its agents of their episode returns, every agent playing its policy
  greedily; uniform play: every agent uniformly random. simple_tag's predators hunt a scripted
  prey (`marl_core.envs.predator_prey`), as in EPyMARL's and JaxMARL's tables: a prey that
  learns with its predators can end worse than chance against others;
- a competitive task (`simple_adversary`, `simple_push`): each role's return when
  one of its agents plays its policy alone against uniformly random play by every other agent
  (`eval_versus_uniform`), the mean over the role's agents; uniform play: that agent random too.
  Two sides that learn together can both improve while their self-play returns stand still.
  The policies play as they learned to, sampling their actions (`eval_greedy: false`): a
  competitive policy may be a mixed strategy, and its most likely action repeated can be a poor
  one (an agent that always moves the same way may leave the field).
  The table adds, per role, the final self-play return and that of uniform play in the role's
  seats against the trained others: whether the role beats chance against the opponents it
  trained with, where they may have learned to exploit it.

The margin is the final return's mean over seeds minus uniform play's, in standard errors of
that difference. VDN and QMIX learn one team value from one team reward, so they run on the
cooperative tasks only.

A pair's settings are `configs/marl/<task>/<algorithm>.yaml` where that file exists (the
BenchMARL layout: a file only where a task needs its own settings) and the algorithm's defaults
otherwise; its rollout shape (`steps_per_round`, `envs_per_worker`, `workers`) too. The suite
sets the rounds from the budget, the seeds (of the environments and of the networks), the
evaluations, and, on competitive tasks, `agent_ids: false` (an agent alone among uniform players
has no teammates to be told apart from).

Prints the table of final returns (mean ± standard error over seeds) beside uniform play, the
untrained policies and the joint steps each pair played, and logs to MLflow (experiment
`marl-suite`): one plot per task, return against joint steps, a line per algorithm (the mean
over seeds) in a band over the seeds' spread (their minimum to maximum), uniform play dashed;
the table; each pair's final return and margin as metrics.

Each finished run is saved under `--results` (one JSON file a run, with the config it ran): a
suite stopped by Ctrl-C, SIGTERM or a crash, run again with the same arguments, reruns only the
runs that did not finish, and any whose config has changed since.

    python benchmarks/marl_suite.py [--budget 100000] [--seeds 5] [--jobs 2] [--tasks ...] [--algorithms ...]
    python benchmarks/marl_suite.py --quick     # a smoke run: every pair, one short round, one seed
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from marl_core.marl import MARL_ALGORITHMS  # noqa: E402
from marl_core.marl.config import MARLConfig  # noqa: E402

CONFIGS = ROOT / "configs" / "marl"
TEAM_REWARD_ONLY = ("vdn", "qmix")  # one value of one team reward: cooperative tasks only


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    env: str
    cooperative: bool

    def applies(self, algorithm: str) -> bool:
        return self.cooperative or algorithm not in TEAM_REWARD_ONLY


TASKS = {
    task.name: task
    for task in (
        Task("simple_spread", "pettingzoo:mpe2.simple_spread_v3", cooperative=True),
        Task("simple_speaker_listener", "pettingzoo:mpe2.simple_speaker_listener_v4", cooperative=True),
        Task("simple_adversary", "pettingzoo:mpe2.simple_adversary_v3", cooperative=False),
        Task("simple_tag", "pettingzoo:marl_core.envs.predator_prey", cooperative=True),
        Task("simple_push", "pettingzoo:mpe2.simple_push_v3", cooperative=False),
    )
}


@dataclasses.dataclass(frozen=True)
class Job:
    task: Task
    algorithm: str
    seed: int
    budget: int  # joint environment steps (over every copy)
    evaluations: int  # during training, besides the one before it
    eval_episodes: int
    configs: Path = CONFIGS  # <task>/<algorithm>.yaml files


@dataclasses.dataclass
class Curve:
    """One seed's evaluations: joint steps, and per score ("team", or a role) its returns."""

    job: Job
    steps: list[int]
    scores: dict[str, list[float]]
    seconds: float
    # competitive tasks, per role after training: self-play, and uniform play in its seats against the trained others
    self_play: dict[str, float] = dataclasses.field(default_factory=dict)
    in_seats: dict[str, float] = dataclasses.field(default_factory=dict)


def result_path(results: Path, job: Job) -> Path:
    return results / job.task.name / f"{job.algorithm}-seed{job.seed}.json"


def run_identity(job: Job) -> dict:
    """What a saved run must match to stand for `job`: its whole config, the algorithm's
    settings with their defaults resolved, and the suite's evaluation settings."""
    config = run_config(job)
    return {
        "config": config.model_dump(mode="json"),
        "settings": config.algorithm_settings.model_dump(mode="json"),
        "evaluations": job.evaluations,
    }


def save(results: Path, curve: Curve) -> None:
    path = result_path(results, curve.job)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "identity": run_identity(curve.job),
        "steps": curve.steps,
        "scores": curve.scores,
        "seconds": curve.seconds,
        "self_play": curve.self_play,
        "in_seats": curve.in_seats,
        "commit": commit(),
        "finished": time.time(),
    }
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(record))
    temporary.replace(path)  # whole or absent, whenever the suite is stopped


def commit() -> str | None:
    """The code a run ran, for the record: a resumed suite may join runs of several commits."""
    import subprocess

    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def load(results: Path, job: Job) -> Curve | None:
    """The saved run of `job`, or None where there is none or it ran another config."""
    path = result_path(results, job)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    if record["identity"] != run_identity(job):
        return None
    return Curve(job, record["steps"], record["scores"], record["seconds"], record["self_play"], record["in_seats"])


def settings_with_seed(algorithm: str, settings: dict, seed: int) -> dict:
    """`settings` with the learner's seed set, at whatever level its settings class keeps it
    (IPPO's under `ppo`, MAPPO's at the top)."""
    fields = MARL_ALGORITHMS.settings(algorithm).model_fields
    if "seed" in fields:
        return {**settings, "seed": seed}
    out = dict(settings)
    for name, field in fields.items():
        nested = getattr(field.annotation, "model_fields", {})
        if "seed" in nested:
            out[name] = {**out.get(name, {}), "seed": seed}
    return out


def run_config(job: Job) -> MARLConfig:
    """The pair's config file (or its defaults) with the suite's budget, seed and evaluations."""
    path = job.configs / job.task.name / f"{job.algorithm}.yaml"
    base = yaml.safe_load(path.read_text()) if path.exists() else {"env": job.task.env, "algorithm": job.algorithm}
    if (base["env"], base["algorithm"]) != (job.task.env, job.algorithm):
        raise ValueError(
            f"{path}: env {base['env']!r} / algorithm {base['algorithm']!r}, "
            f"expected {job.task.env!r} / {job.algorithm!r}"
        )
    shape = MARLConfig(
        env=job.task.env,
        algorithm=job.algorithm,
        **{k: v for k, v in base.items() if k in ("steps_per_round", "envs_per_worker", "workers")},
    )
    rounds = max(1, round(job.budget / (shape.steps_per_round * shape.envs_per_worker * shape.workers)))
    return shape.model_copy(
        update=dict(
            settings=settings_with_seed(job.algorithm, base.get("settings", {}), job.seed),
            agent_ids=base.get("agent_ids", True) and job.task.cooperative,
            rounds=rounds,
            eval_every=max(1, rounds // job.evaluations),
            eval_episodes=job.eval_episodes,
            eval_greedy=job.task.cooperative,
            eval_versus_uniform=not job.task.cooperative,
            checkpoint_every=rounds,
            seed=job.seed,
        )
    )


def score_groups(task: Task, groups: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The agents behind each score: the whole team on a cooperative task, each role's on a
    competitive one."""
    if task.cooperative:
        return {"team": tuple(agent for members in groups.values() for agent in members)}
    return dict(groups)


def scores(
    task: Task, returns: dict[str, float], groups: dict[str, tuple[str, ...]], self_play: bool = False
) -> dict[str, float]:
    """Each score's return, the mean over its agents: a team's, or a role's against uniform play
    (`self_play`: against the trained others)."""
    column = "{}" if task.cooperative or self_play else "vs_uniform/{}"
    return {
        key: float(np.mean([returns[column.format(agent)] for agent in members]))
        for key, members in score_groups(task, groups).items()
    }


def uniform_in_seats(config: MARLConfig, task: Task, learner, episodes: int) -> dict[str, float]:
    """Per score: its agents' return when they play uniformly at random and every other agent
    plays its trained policy as the evaluations do (on a pool of its own, as the untrained evaluation)."""
    from marl_core.marl.config import layout_and_spec, policy_mapping, pool_config
    from marl_core.marl.learner_handles import LocalLearner
    from marl_core.marl.steps import UniformInSeats
    from marl_core.rollout.pool import WorkerPool
    from marl_core.rollout.worker import RolloutRequest

    layout, _ = layout_and_spec(config)
    handle = LocalLearner(learner)
    pool = WorkerPool(pool_config(config))
    try:
        handle.publish(pool, 0)
        requests, keys = [], []
        for key, members in score_groups(task, layout.groups).items():
            roles = UniformInSeats(tuple(members), policy_mapping(config))
            playing = {roles(agent) for agent in layout.agents if agent not in members}
            requests.append(
                RolloutRequest(
                    roles=roles,
                    populations=roles.populations(),
                    learners={policy: handle.specs()[policy] for policy in playing},
                    episodes=episodes,
                    seed=(config.seed, 5, len(keys)),
                    explore=not config.eval_greedy,
                    agent_ids=config.agent_ids,
                    experience=False,
                )
            )
            keys.append(key)
        results = pool.collect(requests)
    finally:
        pool.close()
    agents = list(layout.agents)
    return {
        key: float(result.episode_returns[:, [agents.index(a) for a in score_groups(task, layout.groups)[key]]].mean())
        for key, result in zip(keys, results)
    }


def train(job: Job) -> Curve:
    """One seed of one pair: evaluated untrained, then after every `eval_every` rounds."""
    import torch

    from marl_core.marl.config import layout_and_spec, make_learner, pool_config
    from marl_core.marl.learner_handles import LocalLearner
    from marl_core.marl.rounds import iterate_marl_local
    from marl_core.marl.steps import evaluate_policies, summarize_evaluation
    from marl_core.rollout.pool import WorkerPool

    torch.set_num_threads(1)
    started = time.perf_counter()
    config = run_config(job)
    layout, spec = layout_and_spec(config)
    learner = make_learner(config, layout, spec.state_size)
    # The untrained policies play the first evaluation's episodes, on a pool of their own: the
    # training pool's workers keep the weights versions its rounds publish.
    before = WorkerPool(pool_config(config))
    try:
        untrained = evaluate_policies(config, before, LocalLearner(learner), round=0)
    finally:
        before.close()
    mean, _ = summarize_evaluation(untrained, layout)
    curve = Curve(job, [0], {key: [value] for key, value in scores(job.task, mean, layout.groups).items()}, 0.0)
    pool = WorkerPool(pool_config(config))
    try:
        for record, _ in iterate_marl_local(config, learner=learner, pool=pool):
            if record.eval_returns:
                curve.steps.append(record.env_steps)
                for key, value in scores(job.task, record.eval_returns, layout.groups).items():
                    curve.scores[key].append(value)
                final = record.eval_returns
    finally:
        pool.close()
    if not job.task.cooperative:
        curve.self_play = scores(job.task, final, layout.groups, self_play=True)
        curve.in_seats = uniform_in_seats(config, job.task, learner, job.eval_episodes)
    curve.seconds = time.perf_counter() - started
    return curve


def uniform_play(task: Task, episodes: int) -> dict[str, tuple[float, float]]:
    """Every agent uniformly random: per score, the mean return and its standard error."""
    from marl_core.marl.config import layout_and_spec
    from marl_core.marl.steps import UniformInSeats, summarize
    from marl_core.rollout.pool import PoolConfig, WorkerPool
    from marl_core.rollout.worker import RolloutRequest

    layout, _ = layout_and_spec(MARLConfig(env=task.env))
    roles = UniformInSeats(tuple(layout.agents), str)  # every seat
    pool = WorkerPool(PoolConfig(task.env, 1, 8))
    try:
        (result,) = pool.collect(
            [
                RolloutRequest(
                    roles=roles,
                    populations=roles.populations(),
                    episodes=episodes,
                    seed=(9, 9, 9),
                    experience=False,
                )
            ]
        )
    finally:
        pool.close()
    groups = score_groups(task, layout.groups)
    mean, stderr = summarize(result.episode_returns, list(layout.agents), groups)
    return {key: (mean[f"policy/{key}"], stderr[f"policy/{key}"]) for key in groups}


@dataclasses.dataclass
class Row:
    """One score of one pair, over its seeds."""

    task: str
    score: str  # "team" or a role
    algorithm: str
    uniform: tuple[float, float]  # uniform play: mean, standard error
    final: list[float] = dataclasses.field(default_factory=list)  # per seed
    untrained: list[float] = dataclasses.field(default_factory=list)
    self_play: list[float] = dataclasses.field(default_factory=list)  # competitive tasks
    in_seats: list[float] = dataclasses.field(default_factory=list)
    steps: list[int] = dataclasses.field(default_factory=list)  # per seed: joint steps played by its last evaluation
    seconds: float = 0.0  # all seeds together

    @property
    def margin(self) -> float:
        """Standard errors (of the difference) by which the final return beats uniform play."""
        mean, stderr = mean_and_stderr(self.final)
        spread = math.hypot(stderr, self.uniform[1])
        return (mean - self.uniform[0]) / spread if spread > 0 else float("nan")


def mean_and_stderr(values) -> tuple[float, float]:
    values = np.asarray(values, dtype=float)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else float("nan")


def rows(curves: list[Curve], uniform: dict[str, dict[str, tuple[float, float]]]) -> list[Row]:
    out = {}
    for curve in curves:
        task, algorithm = curve.job.task.name, curve.job.algorithm
        for key, values in curve.scores.items():
            row = out.setdefault((task, key, algorithm), Row(task, key, algorithm, uniform[task][key]))
            row.final.append(values[-1])
            row.untrained.append(values[0])
            row.steps.append(curve.steps[-1])
            if key in curve.self_play:
                row.self_play.append(curve.self_play[key])
                row.in_seats.append(curve.in_seats[key])
        out[(task, next(iter(curve.scores)), algorithm)].seconds += curve.seconds
    return list(out.values())


def table(rows_: list[Row]) -> str:
    lines = [
        "| task | return of | algorithm | final | uniform play | margin (SE) | untrained | gain over untrained "
        "| self-play | uniform in its seats against the trained | joint steps | seconds |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows_:
        final, final_stderr = mean_and_stderr(row.final)
        gain, gain_stderr = mean_and_stderr(np.subtract(row.final, row.untrained))
        against_trained = (
            "| | |" if not row.self_play else (f"| {np.mean(row.self_play):.2f} | {np.mean(row.in_seats):.2f} |")
        )
        lines.append(
            f"| {row.task} | {row.score} | {row.algorithm} | {final:.2f} ± {final_stderr:.2f} "
            f"| {row.uniform[0]:.2f} ± {row.uniform[1]:.2f} | {row.margin:.1f} | {np.mean(row.untrained):.2f} "
            f"| {gain:+.2f} ± {gain_stderr:.2f} {against_trained} {np.mean(row.steps):,.0f} | {row.seconds:.0f} |"
        )
    return "\n".join(lines)


def suite_plot(task: Task, curves: list[Curve], uniform: dict[str, tuple[float, float]]):
    """One panel per score of the task: a line per algorithm (the mean over seeds) in a band from
    the seeds' minimum to maximum, and uniform play dashed."""
    from flows.tracking import plots

    keys = list(uniform)
    figure, axes = plots.plt.subplots(1, len(keys), figsize=(7 * len(keys), 4.2), squeeze=False)
    for axis, key in zip(axes[0], keys):
        for algorithm in sorted({c.job.algorithm for c in curves}):
            seeds = [c for c in curves if c.job.algorithm == algorithm]
            length = min(len(c.steps) for c in seeds)
            steps = seeds[0].steps[:length]
            values = np.array([c.scores[key][:length] for c in seeds])
            (line,) = axis.plot(steps, values.mean(axis=0), label=algorithm, lw=1.6)
            axis.fill_between(steps, values.min(axis=0), values.max(axis=0), color=line.get_color(), alpha=0.15)
        axis.axhline(uniform[key][0], color="black", ls="--", lw=1, label="uniform play")
        axis.set_xlabel("joint environment steps")
        axis.set_ylabel("greedy evaluation return" if task.cooperative else "sampled return against uniform opponents")
        axis.set_title(f"{task.name}: {key}")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


def log_to_mlflow(tracking_uri: str, args, curves: list[Curve], uniform, rows_: list[Row], text: str) -> str:
    import mlflow

    from flows.tracking import plots

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("marl-suite")
    with mlflow.start_run(run_name="quick" if args.quick else f"budget {args.budget}") as run:
        mlflow.log_params(
            dict(
                budget=args.budget,
                seeds=args.seeds,
                tasks=",".join(args.tasks),
                algorithms=",".join(args.algorithms),
                eval_episodes=args.eval_episodes,
            )
        )
        for name in args.tasks:
            task_curves = [c for c in curves if c.job.task.name == name]
            if task_curves:
                figure = suite_plot(TASKS[name], task_curves, uniform[name])
                mlflow.log_figure(figure, f"plots/{name}.png")
                plots.close(figure)
        for row in rows_:
            mlflow.log_metrics(
                {
                    f"{row.task}/{row.score}/{row.algorithm}/final": float(np.mean(row.final)),
                    f"{row.task}/{row.score}/{row.algorithm}/margin": row.margin,
                }
            )
        mlflow.log_text(text, "table.md")
        return run.info.run_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--algorithms", nargs="+", default=sorted(MARL_ALGORITHMS), choices=sorted(MARL_ALGORITHMS))
    parser.add_argument("--budget", type=int, default=100_000, help="joint environment steps per run")
    parser.add_argument(
        "--seeds",
        type=int,
        default=5,
        help="seeds per pair (simple_tag's sparse catches need 5 to tell its learners from chance)",
    )
    parser.add_argument(
        "--evaluations", type=int, default=8, help="evaluations during a run, besides the one before it"
    )
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--uniform-episodes", type=int, default=2000)
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count(), help="runs at once, each in a process of its own (0: here)"
    )
    parser.add_argument(
        "--configs", type=Path, default=CONFIGS, help="a folder of <task>/<algorithm>.yaml files to run instead"
    )
    parser.add_argument(
        "--results", type=Path, default=Path("marl-suite-runs"), help="where each finished run is saved"
    )
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one seed, one round a run, few episodes")
    args = parser.parse_args(argv)
    if args.quick:
        args.budget, args.seeds, args.evaluations, args.eval_episodes, args.uniform_episodes = 1, 1, 1, 2, 16
    for name, value in (
        ("--budget", args.budget),
        ("--seeds", args.seeds),
        ("--evaluations", args.evaluations),
        ("--eval-episodes", args.eval_episodes),
        ("--uniform-episodes", args.uniform_episodes),
    ):
        if value < (2 if "episodes" in name else 1):
            parser.error(f"{name} {value}: must be at least {2 if 'episodes' in name else 1}")
    jobs = [
        Job(TASKS[name], algorithm, seed, args.budget, args.evaluations, args.eval_episodes, args.configs)
        for name in args.tasks
        for algorithm in args.algorithms
        if TASKS[name].applies(algorithm)
        for seed in range(args.seeds)
    ]
    for job in {(j.task.name, j.algorithm): j for j in jobs}.values():
        run_config(job)  # a broken config file fails here, before any run starts
    started = time.perf_counter()
    print(
        f"{len(jobs)} runs ({args.seeds} seeds, {args.budget:,} joint steps each), {max(args.jobs, 1)} at a time; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    curves = [curve for curve in (load(args.results, job) for job in jobs) if curve is not None]
    if curves:
        print(f"{len(curves)} of them finished before, in {args.results}", flush=True)
    done = {(c.job.task.name, c.job.algorithm, c.job.seed) for c in curves}
    todo = [job for job in jobs if (job.task.name, job.algorithm, job.seed) not in done]
    uniform = {name: uniform_play(TASKS[name], args.uniform_episodes) for name in args.tasks}

    def finished(curve: Curve) -> None:
        save(args.results, curve)
        curves.append(curve)
        report(curve, len(curves), len(jobs))

    if args.jobs == 0:
        for job in todo:
            finished(train(job))
    elif todo:
        # SIGTERM ends the suite as Ctrl-C does: its runs' processes are terminated, none left behind
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        pool = multiprocessing.get_context("spawn").Pool(args.jobs)
        try:
            for curve in pool.imap_unordered(train, todo):
                finished(curve)
        finally:
            pool.terminate()
            pool.join()
    order = {(j.task.name, j.algorithm, j.seed): k for k, j in enumerate(jobs)}
    curves.sort(key=lambda c: order[(c.job.task.name, c.job.algorithm, c.job.seed)])
    rows_ = rows(curves, uniform)
    elapsed = time.perf_counter() - started
    text = (
        f"{table(rows_)}\n\n{len(jobs)} runs, {args.seeds} seeds, {args.budget:,} joint steps each, "
        f"{args.eval_episodes} evaluation episodes; {sum(c.seconds for c in curves) / 60:.1f} minutes of runs, "
        f"{elapsed / 60:.1f} minutes of this invocation with {max(args.jobs, 1)} at a time; "
        f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(text)
    run_id = log_to_mlflow(args.tracking_uri, args, curves, uniform, rows_, text)
    print(f"MLflow run {run_id} ({args.tracking_uri}, experiment marl-suite)")
    return 0


def report(curve: Curve, done: int, total: int) -> None:
    finals = "; ".join(f"{key} {' '.join(f'{v:.2f}' for v in values)}" for key, values in curve.scores.items())
    print(
        f"[{done}/{total}] {curve.job.task.name} {curve.job.algorithm} seed {curve.job.seed}: {finals} "
        f"({curve.seconds:.0f} s)",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
