"""simple_tag with a scripted prey (`marl_core.envs.predator_prey`): the suite's predator task."""

import numpy as np

from marl_core.envs import make_env
from marl_core.envs.predator_prey import MOVES, flee

LEFT, RIGHT, DOWN, UP = 1, 2, 3, 4


def test_the_prey_runs_from_the_nearest_predator_and_back_from_the_edge():
    assert flee(np.array([0.0, 0.0]), np.array([[-0.3, 0.0]])) == RIGHT
    assert flee(np.array([0.0, 0.0]), np.array([[0.0, -0.3]])) == UP
    # a far predator on the left pushes less than a near one below
    assert flee(np.array([0.0, 0.0]), np.array([[-0.9, 0.0], [0.0, -0.2]])) == UP
    # at the right edge, with a predator below, it turns back in rather than on out of the arena
    assert flee(np.array([0.95, 0.0]), np.array([[0.95, -0.5]])) == LEFT


def test_only_the_predators_are_agents_and_they_share_simple_tags_rewards():
    tag, hunt = make_env("pettingzoo:mpe2.simple_tag_v3"), make_env("pettingzoo:marl_core.envs.predator_prey")
    predators = ("adversary_0", "adversary_1", "adversary_2")
    assert hunt.spec.agents == predators
    assert {a: hunt.spec.observation_size[a] for a in predators} == {a: tag.spec.observation_size[a] for a in predators}
    assert hunt.spec.state_size == tag.spec.state_size == 62  # the global state still sees the prey
    returns = episode_returns(hunt, chase, episodes=5)
    assert (returns == returns[:, :1]).all() and returns.max() > 0  # one team reward, paid per catch


def test_fleeing_keeps_the_prey_from_predators_that_chase_it():
    """Predators that head straight for the prey catch it in most steps of an episode when it
    stands still, and rarely when it flees (it is faster than they are)."""
    hunt = make_env("pettingzoo:marl_core.envs.predator_prey")
    still = make_env("pettingzoo:mpe2.simple_tag_v3")  # the prey there plays no-op
    fleeing = episode_returns(hunt, chase, episodes=40)[:, 0].mean()
    standing = episode_returns(still, chase, episodes=40)[:, 0].mean()
    assert 0 < fleeing < standing / 3, (fleeing, standing)


def chase(env, agent: str) -> int:
    """A predator's move toward the prey; the prey itself (when it is an agent) stays put."""
    world = env.env.unwrapped.world
    me = next(a for a in world.agents if a.name == agent)
    if not me.adversary:
        return 0
    prey = next(a for a in world.agents if not a.adversary)
    return int(np.argmax(MOVES @ (prey.state.p_pos - me.state.p_pos)))


def episode_returns(env, policy, episodes: int) -> np.ndarray:
    """[episodes, agents] summed rewards, the episodes seeded 0, 1, ..."""
    returns = []
    for episode in range(episodes):
        step = env.reset(seed=episode)
        total = dict.fromkeys(env.spec.agents, 0.0)
        while step.observations:
            step = env.step({agent: policy(env, agent) for agent in step.observations})
            for agent, reward in step.rewards.items():
                total[agent] += reward
        returns.append([total[agent] for agent in env.spec.agents])
    return np.array(returns)
