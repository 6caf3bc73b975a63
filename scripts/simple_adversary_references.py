"""Reference points for MADDPG's simple_adversary curves: scripted agents, and what trained ones do.

    .venv/bin/python scripts/simple_adversary_references.py                 # scripted matchups
    .venv/bin/python scripts/simple_adversary_references.py --actors a.pt   # + saved actors' endings

A learning curve on simple_adversary means little without a scale: how good is an adversary
return of -15? The scripted matchups answer that on the same discrete actions (each scripted
agent takes the one of the five moves that points most directly at its target). Good agents
either stand still, both head for the goal, or split up (the nearer one to the goal, the other
to the decoy); the adversary stands still, heads for the landmarks' midpoint, for the landmark
nearest a good agent (what a good agent's position gives away), or for the goal itself, which it
cannot see in the real game (its ceiling).

`--actors` takes the file `scripts/maddpg_simple_adversary.py --save` writes (good agents sharing
the policy "agent", as that script maps them by default) and plays its greedy actors: where the
adversary ends each episode, relative to the goal and the decoy, and how often the good agents
end covering both landmarks, which is the deception the scenario is named for.
"""

from __future__ import annotations

import argparse

import numpy as np

MOVES = {1: (-1, 0), 2: (1, 0), 3: (0, -1), 4: (0, 1)}  # MPE's discrete actions; 0 stays
COVERED = 0.3  # a landmark counts as covered with a good agent this close (landmarks are 0.08 wide)


def toward(delta: np.ndarray) -> int:
    if np.abs(delta).max() < 0.02:
        return 0
    return max(MOVES, key=lambda move: float(np.dot(MOVES[move], delta)))


def scripted_targets(good: str, adversary: str, world) -> list:
    """Target positions (None: stay) of adversary_0, agent_0, agent_1."""
    adv, a0, a1 = world.agents
    goal = adv.goal_a.state.p_pos
    decoy = next(landmark for landmark in world.landmarks if landmark is not adv.goal_a).state.p_pos
    if good == "idle":
        good_targets = [None, None]
    elif good == "both_goal":
        good_targets = [goal, goal]
    else:  # split
        nearer_first = np.linalg.norm(a0.state.p_pos - goal) <= np.linalg.norm(a1.state.p_pos - goal)
        good_targets = [goal, decoy] if nearer_first else [decoy, goal]
    landmarks = [landmark.state.p_pos for landmark in world.landmarks]
    adversary_target = {
        "idle": None,
        "midpoint": (landmarks[0] + landmarks[1]) / 2,
        "nearest_good": min(landmarks, key=lambda spot: min(np.linalg.norm(a.state.p_pos - spot) for a in (a0, a1))),
        "knows_goal": goal,
    }[adversary]
    return [adversary_target, *good_targets]


def play_scripted(good: str, adversary: str, episodes: int) -> tuple[float, float]:
    from mpe2 import simple_adversary_v3

    env = simple_adversary_v3.parallel_env(max_cycles=25)
    adversary_return = good_return = 0.0
    for episode in range(episodes):
        env.reset(seed=episode)
        world = env.unwrapped.world
        while env.agents:
            targets = scripted_targets(good, adversary, world)
            actions = {a.name: 0 if t is None else toward(t - a.state.p_pos) for a, t in zip(world.agents, targets)}
            _, rewards, *_ = env.step(actions)
            adversary_return += rewards["adversary_0"]
            good_return += rewards["agent_0"]  # the good agents share one reward
    return adversary_return / episodes, good_return / episodes


def actors_endings(path: str, episodes: int) -> None:
    import torch
    from mpe2 import simple_adversary_v3

    from marl_core.marl.maddpg import GumbelSoftmaxPolicy

    actors = {}
    for policy, state in torch.load(path, weights_only=True).items():
        widths = [w.shape for name, w in state.items() if name.endswith("weight")]  # [out, in] per layer
        actors[policy] = GumbelSoftmaxPolicy(widths[0][1], widths[-1][0], tuple(out for out, _ in widths[:-1]))
        actors[policy].load_state_dict(state)
    env = simple_adversary_v3.parallel_env(max_cycles=25)
    covered, to_goal, to_decoy, returns = [], [], [], []
    for episode in range(episodes):
        obs, _ = env.reset(seed=50_000 + episode)
        world = env.unwrapped.world
        adv, a0, a1 = world.agents
        total = 0.0
        while env.agents:
            actions = {}
            for name, o in obs.items():
                if name.startswith("adversary"):
                    policy, x = "adversary", o
                else:  # the shared policy's agents see a one-hot of their index
                    policy, x = "agent", np.concatenate([o, np.eye(2)[int(name[-1])]])
                with torch.no_grad():
                    actions[name] = int(actors[policy].actor(torch.as_tensor(x, dtype=torch.float32)).argmax())
            obs, rewards, *_ = env.step(actions)
            total += rewards["adversary_0"]
        goal = adv.goal_a.state.p_pos
        decoy = next(landmark for landmark in world.landmarks if landmark is not adv.goal_a).state.p_pos

        def near(point, good_agents=(a0, a1)):
            return min(np.linalg.norm(a.state.p_pos - point) for a in good_agents) < COVERED

        covered.append(near(goal) and near(decoy))
        to_goal.append(np.linalg.norm(adv.state.p_pos - goal))
        to_decoy.append(np.linalg.norm(adv.state.p_pos - decoy))
        returns.append(total)
    print(
        f"{path}, {episodes} greedy episodes: adversary return {np.mean(returns):.2f}; it ends "
        f"{np.mean(to_goal):.2f} from the goal and {np.mean(to_decoy):.2f} from the decoy; the good agents "
        f"end covering both landmarks (each within {COVERED}) in {np.mean(covered):.0%} of episodes"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--actors", help="a file written by maddpg_simple_adversary.py --save")
    args = parser.parse_args()
    print(f"{'good agents':>12} {'adversary':>14} {'adversary return':>17} {'good return':>12}")
    for good in ("idle", "both_goal", "split"):
        for adversary in ("idle", "midpoint", "nearest_good", "knows_goal"):
            adversary_return, good_return = play_scripted(good, adversary, args.episodes)
            print(f"{good:>12} {adversary:>14} {adversary_return:>17.2f} {good_return:>12.2f}", flush=True)
    if args.actors:
        actors_endings(args.actors, args.episodes)


if __name__ == "__main__":
    main()
