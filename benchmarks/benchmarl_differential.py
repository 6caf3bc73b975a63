"""Do BenchMARL's MPE and this project's step the same task? A differential check on the same seeds and actions.

BenchMARL reaches MPE through torchrl's `PettingZooEnv`, which needs the MPE that PettingZoo
carried until 1.24.3 (the peer's venv, `benchmarl_venv.py`); this project plays `mpe2`, where
MPE moved. Two code bases, so before their learning curves are set side by side this script
plays, for each MPE task, the same episodes on both:

- BenchMARL's side (run in the peer's venv, `--side benchmarl`): the environment exactly as
  BenchMARL's experiment builds it from the task's yaml (`TaskClass.get_env_fun`, its
  transforms applied), the episode length overridden as the benchmark overrides it;
- this project's side: `make_env` of the benchmark's environment name, through its PettingZoo
  adapter;

each reset first with the seed and then unseeded (as both trainers reset between episodes),
each step the same joint action, drawn uniformly from a NumPy generator of that seed in agent
order. Every agent's observation and reward and the global state (what MAPPO and QMIX read)
must agree to float32 precision (torchrl stores rewards as float32; this project as float64),
and the episodes must end at the same step.

    python benchmarks/benchmarl_differential.py [--tasks simple_spread simple_speaker_listener] [--episodes 3]

Exits non-zero when a task fails; `marl_vs_benchmarl.py` runs it before any PettingZoo task.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-5


def joint_actions(seed: int, agents: list[str], num_actions: dict[str, int], steps: int) -> list[dict[str, int]]:
    """The same action sequence on both sides: agents in sorted order, each uniform over its actions."""
    rng = np.random.default_rng(seed)
    order = sorted(agents)
    return [{a: int(rng.integers(num_actions[a])) for a in order} for _ in range(steps)]


# --- BenchMARL's side (the peer's venv) ----------------------------------------------------------


def play_benchmarl(task_name: str, max_steps: int, seed: int, episodes: int) -> dict:
    import torch
    from benchmarl_peer import load_task
    from tensordict import TensorDict
    from torchrl.envs import Compose, TransformedEnv
    from torchrl.envs.utils import step_mdp

    task = load_task(task_name, max_steps)
    env = task.get_env_fun(num_envs=1, continuous_actions=False, seed=seed, device="cpu")()
    env = TransformedEnv(env, Compose(*task.get_env_transforms(env)))
    groups = task.group_map(env)
    agents = [a for members in groups.values() for a in members]
    num_actions = {
        a: int(env.full_action_spec[group, "action"].space.n) for group, members in groups.items() for a in members
    }
    actions = joint_actions(seed, agents, num_actions, episodes * max_steps)
    record = {"agents": agents, "episodes": []}
    t = 0
    for episode in range(episodes):
        td = env.reset(seed=seed) if episode == 0 else env.reset()
        steps = [{"observations": _observations(td, groups, root=True), "state": _state(td, root=True)}]
        while True:
            joint = actions[t]
            t += 1
            action = TensorDict(
                {g: {"action": torch.tensor([joint[a] for a in members])} for g, members in groups.items()}, []
            )
            td = env.step(td.update(action))
            steps.append(
                {
                    "observations": _observations(td, groups, root=False),
                    "state": _state(td, root=False),
                    "rewards": {
                        a: float(td.get(("next", g, "reward"))[i].item())
                        for g, members in groups.items()
                        for i, a in enumerate(members)
                    },
                }
            )
            done = bool(td.get(("next", "done")).any())
            td = step_mdp(td)
            if done:
                break
        record["episodes"].append(steps)
    env.close()
    return record


def _observations(td, groups: dict, root: bool) -> dict[str, list[float]]:
    prefix = () if root else ("next",)
    out = {}
    for group, members in groups.items():
        observations = td.get((*prefix, group, "observation"))
        out.update((agent, observations[i].tolist()) for i, agent in enumerate(members))
    return out


def _state(td, root: bool) -> list[float] | None:
    key = "state" if root else ("next", "state")
    value = td.get(key, None)
    return None if value is None else value.reshape(-1).tolist()


# --- this project's side -----------------------------------------------------------------------


def play_ours(env_name: str, agents: list[str], seed: int, episodes: int, max_steps: int) -> dict:
    from marl_core.envs import make_env

    env = make_env(env_name)
    actions = joint_actions(seed, agents, dict(env.spec.num_actions), episodes * max_steps)
    record = {"agents": list(env.spec.agents), "episodes": []}
    t = 0
    for episode in range(episodes):
        step = env.reset(seed=seed if episode == 0 else None)
        steps = [{"observations": _our_observations(step), "state": env.state().tolist()}]
        while True:
            step = env.step(actions[t])
            t += 1
            steps.append(
                {"observations": _our_observations(step), "state": env.state().tolist(), "rewards": step.rewards}
            )
            if all(step.terminations[a] or step.truncations[a] for a in step.terminations):
                break
        record["episodes"].append(steps)
    env.close()
    return record


def _our_observations(step) -> dict[str, list[float]]:
    """Every agent's observation, the last of an episode cut by the time limit included."""
    out = {a: o.tolist() for a, o in step.observations.items()}
    for agent, info in step.infos.items():
        if "final_observation" in info:
            out[agent] = info["final_observation"].tolist()
    return out


def compare(theirs: dict, ours: dict) -> tuple[bool, str]:
    """(same?, what differs first or the largest difference seen)."""
    if sorted(theirs["agents"]) != sorted(ours["agents"]):
        return False, f"agents differ: {theirs['agents']} vs {ours['agents']}"
    largest = 0.0
    for e, (a, b) in enumerate(zip(theirs["episodes"], ours["episodes"])):
        if len(a) != len(b):
            return False, f"episode {e}: {len(a) - 1} steps vs {len(b) - 1}"
        for t, (x, y) in enumerate(zip(a, b)):
            for what in ("observations", "rewards"):
                for agent in ours["agents"]:
                    if what not in x:
                        continue
                    u, v = np.asarray(x[what][agent], np.float64), np.asarray(y[what][agent], np.float64)
                    if u.shape != v.shape:
                        return False, f"episode {e} step {t}: {agent}'s {what} shapes {u.shape} vs {v.shape}"
                    largest = max(largest, float(np.max(np.abs(u - v), initial=0.0)))
                    if not np.allclose(u, v, rtol=TOLERANCE, atol=TOLERANCE):
                        return False, f"episode {e} step {t}: {agent}'s {what} {u.tolist()} vs {v.tolist()}"
            if x["state"] is not None:
                u, v = np.asarray(x["state"]), np.asarray(y["state"])
                if u.shape != v.shape or not np.allclose(u, v, rtol=TOLERANCE, atol=TOLERANCE):
                    return False, f"episode {e} step {t}: the global state differs"
    steps = sum(len(episode) - 1 for episode in ours["episodes"])
    return True, f"{len(ours['episodes'])} episodes, {steps} joint steps, largest difference {largest:.1e}"


def check(tasks: list[str], python: Path, seed: int = 0, episodes: int = 3) -> bool:
    """Plays each MPE task of `benchmarl_tasks.TASKS` on both sides; prints a line per task."""
    from benchmarl_tasks import TASKS

    passed = True
    for name in tasks:
        task = TASKS[name]
        command = [str(python), str(Path(__file__).resolve()), "--side", "benchmarl"]
        command += ["--benchmarl-task", task.benchmarl, "--max-steps", str(task.max_steps)]
        command += ["--seed", str(seed), "--episodes", str(episodes)]
        process = subprocess.run(command, capture_output=True, text=True, cwd=HERE)
        if process.returncode != 0:
            print(f"differential {name}: FAIL (BenchMARL's side failed)\n{process.stderr[-2000:]}", flush=True)
            passed = False
            continue
        theirs = json.loads(process.stdout.splitlines()[-1])
        ours = play_ours(task.ours, theirs["agents"], seed, episodes, task.max_steps)
        same, detail = compare(theirs, ours)
        verdict = "pass" if same else "FAIL"
        print(f"differential {name} ({task.benchmarl} vs {task.ours}): {verdict} ({detail})", flush=True)
        passed &= same
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["simple_spread", "simple_speaker_listener"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--peer-venv", type=Path, help="default: benchmarl_venv.DEFAULT_VENV")
    # the peer's half, run by `check` in the peer's venv
    parser.add_argument("--side", choices=["ours", "benchmarl"], default="ours", help=argparse.SUPPRESS)
    parser.add_argument("--benchmarl-task", help=argparse.SUPPRESS)
    parser.add_argument("--max-steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    if args.side == "benchmarl":
        print(json.dumps(play_benchmarl(args.benchmarl_task, args.max_steps, args.seed, args.episodes)))
        return
    from benchmarl_venv import DEFAULT_VENV, peer_python

    python = peer_python(args.peer_venv or DEFAULT_VENV)
    raise SystemExit(0 if check(args.tasks, python, args.seed, args.episodes) else 1)


if __name__ == "__main__":
    main()
