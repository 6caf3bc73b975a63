"""Every MARL algorithm of the registry learns: a change that breaks an algorithm's update fails
here, in CI, rather than in a user's run.

The task is the two-step game of the QMIX paper (Rashid et al. 2018; `marl_core.envs.two_step`):
uniform play returns 4.75 on average, the safe joint policy 7 and the best one 8. Within 20
rounds of 16 joint steps in 4 copies (1,280 joint steps), each algorithm's team, sampling from
its policies (`eval_greedy: false`) for 64 evaluation episodes, must return 6.5 or more: about
four standard errors of 64 uniform episodes above uniform play. A sampled evaluation, not a
greedy one: an untrained greedy team already returns 7 whenever its first agent happens to
prefer action 0.

Settings are small networks and fast learning rates for a two-step game, alike within each
family; the defaults are for MPE (docs/marl.md).
"""

import pytest

from marl_core.marl import MARL_ALGORITHMS
from marl_core.marl.config import MARLConfig
from marl_core.marl.rounds import iterate_marl_local

TWO_STEP = "pettingzoo:marl_core.envs.two_step"
UNIFORM_RETURN = 4.75  # 0.5 * 7 + 0.5 * (0 + 1 + 1 + 8) / 4
THRESHOLD = 6.5

POLICY_GRADIENT = dict(hidden=(32,), lr=3e-3)
REPLAY = dict(hidden=(32,), batch_size=32, buffer_size=500, learning_starts=0, train_every=1)
Q_LEARNING = dict(
    REPLAY, lr=5e-3, target_update_interval=100, epsilon_start=1.0, epsilon_end=0.05, epsilon_decay_steps=400
)
SETTINGS = {
    "ippo": {"ppo": dict(POLICY_GRADIENT, epochs=4, minibatch_size=32)},
    "a2c": {"a2c": dict(POLICY_GRADIENT, lr=5e-3)},
    "impala": {"impala": dict(POLICY_GRADIENT, lr=1e-2)},
    "appo": {"appo": dict(POLICY_GRADIENT, epochs=4, minibatch_size=32)},
    "mappo": dict(POLICY_GRADIENT, critic_hidden=(32,), epochs=4, minibatch_size=32),
    "iql": {"dqn": Q_LEARNING},
    "vdn": dict(Q_LEARNING, gamma=0.99),
    "qmix": dict(Q_LEARNING, gamma=0.99, mixing_embed=8, hypernet_hidden=16),
    "maddpg": dict(REPLAY, critic_hidden=(32,), actor_lr=3e-3, critic_lr=3e-3),
}


def test_the_learning_check_covers_every_registered_algorithm():
    assert set(SETTINGS) == set(MARL_ALGORITHMS), "a new MARL algorithm needs its line in SETTINGS"


def final_sampled_return(env: str, algorithm: str, settings: dict, rounds: int, steps: int, copies: int, **eval):
    """The team's return, sampling from its policies (`eval_greedy: false`), after `rounds`."""
    config = MARLConfig(
        env=env,
        algorithm=algorithm,
        settings=settings,
        rounds=rounds,
        steps_per_round=steps,
        envs_per_worker=copies,
        eval_every=rounds,
        eval_greedy=False,
        seed=0,
        **eval,
    )
    (final,) = [record.eval_returns["policy/agent"] for record, _ in iterate_marl_local(config) if record.eval_returns]
    return final


@pytest.mark.parametrize("algorithm", sorted(SETTINGS))
def test_every_algorithm_beats_uniform_play_on_the_two_step_game(algorithm):
    final = final_sampled_return(TWO_STEP, algorithm, SETTINGS[algorithm], 20, 16, 4, eval_episodes=64)
    assert final >= THRESHOLD > UNIFORM_RETURN, f"{algorithm}: {final:.2f} after 1,280 joint steps"


# VMAS's navigation with two agents, each heading for its own goal (VMAS rewards closing in):
# after 24,000 joint steps a sampled team must return 0.4, far above uniform play, whose return
# is about zero (docs/marl.md, "VMAS scenarios", has both figures).
NAVIGATION = "vmas:navigation(n_agents=2,max_steps=25)"
NAVIGATION_SETTINGS = {
    "ippo": {"ppo": dict(hidden=(64,), lr=3e-3, epochs=4, minibatch_size=256)},
    "mappo": dict(hidden=(64,), critic_hidden=(64,), lr=3e-3, epochs=4, minibatch_size=256),
}


@pytest.mark.parametrize("algorithm", sorted(NAVIGATION_SETTINGS))
def test_mappo_and_ippo_learn_vmas_navigation(algorithm):
    settings, evaluation = NAVIGATION_SETTINGS[algorithm], dict(eval_episodes=32, eval_versus_uniform=False)
    final = final_sampled_return(NAVIGATION, algorithm, settings, 30, 50, 16, **evaluation)
    assert final >= 0.4, f"{algorithm}: {final:.2f} after 24,000 joint steps on {NAVIGATION}"
