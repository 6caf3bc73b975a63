"""Tabular Q-learning (`marl_core.rl.tabular_q`): the Q-values of the empirical model computed by
hand, weights and trainer state round trips, the refusal of too many observations, and a learned
best response on Kuhn poker that is the exact one."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from marl_core.rl import ALGORITHMS, Experience
from marl_core.rl.settings import TabularQConfig
from marl_core.rl.tabular_q import TabularQPolicy, TabularQTrainer

A, B, UNSEEN = np.eye(3, dtype=np.float32)[:1], np.eye(3, dtype=np.float32)[1:2], np.eye(3, dtype=np.float32)[2:]


def _experience(obs, action, reward, next_obs, done) -> Experience:
    mask = np.ones((len(action), 2), bool)
    done = np.asarray(done, bool)
    return Experience(
        np.concatenate(obs),
        mask,
        np.asarray(action),
        np.asarray(reward, np.float32),
        np.concatenate(next_obs),
        mask.copy(),
        done,
        done.copy(),
    )


def _two_states() -> Experience:
    """From A, action 0 ends the episode with reward 1 and action 1 leads to B with nothing; from B,
    action 0 pays 3, 3, -1, -1 (mean 1) and action 1 pays 0.5."""
    return _experience(
        obs=[A, A, B, A, B, A, B, A, B, B],
        action=[0, 1, 0, 1, 0, 1, 0, 1, 0, 1],
        reward=[1, 0, 3, 0, 3, 0, -1, 0, -1, 0.5],
        next_obs=[A, B, B, B, B, B, B, B, B, B],
        done=[1, 0, 1, 0, 1, 0, 1, 0, 1, 1],
    )


def _round_trip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_q_values_are_those_of_the_empirical_model_by_hand():
    trainer = TabularQTrainer(3, 2, TabularQConfig(gamma=0.5))
    trainer.learn(_two_states())
    # Q(B) = (mean of 3, 3, -1, -1; 0.5) = (1, 0.5); V(B) = 1; Q(A) = (1, 0 + 0.5 * V(B)) = (1, 0.5)
    np.testing.assert_allclose(trainer.policy.q.numpy(), [[1.0, 0.5], [1.0, 0.5]])
    # B's rewards change its value and, through it, A's: Q(B, 1) = (0.5 + 4) / 2, Q(A, 1) = 0.5 * 2.25
    trainer.learn(_experience([B], [1], [4.0], [B], [1]))
    np.testing.assert_allclose(trainer.policy.q.numpy(), [[1.0, 1.125], [1.0, 2.25]])
    probs = trainer.policy.action_probs(np.concatenate([A, B, UNSEEN]), np.ones((3, 2), bool))
    np.testing.assert_array_equal(probs, [[0, 1], [0, 1], [0.5, 0.5]])  # an observation never seen: uniform


def test_greedy_choice_is_among_tried_legal_actions_and_untried_states_play_uniformly():
    trainer = TabularQTrainer(3, 2, TabularQConfig(gamma=1.0, epsilon_start=0.0, epsilon_end=0.0))
    trainer.learn(_experience([A], [1], [-5.0], [A], [1]))  # only action 1 tried at A, and it loses
    policy = trainer.policy
    assert policy.action_probs(A, np.ones((1, 2), bool)).tolist() == [[0, 1]]  # not the untried action 0
    only_untried = np.array([[True, False]])
    assert policy.action_probs(A, only_untried).tolist() == [[1, 0]]
    actions, _ = policy.act(np.repeat(UNSEEN, 400, axis=0), np.ones((400, 2), bool), False, np.random.default_rng(0))
    assert 150 < actions.sum() < 250  # uniform where nothing is known, even when not exploring


def test_weights_and_trainer_state_round_trip_and_continue_identically():
    config = TabularQConfig(gamma=0.9, epsilon_start=0.6)
    original = TabularQTrainer(3, 2, config)
    original.learn(_two_states())
    worker_side = TabularQPolicy(3, 2, TabularQConfig())  # what a rollout worker builds, then loads
    worker_side.set_weights(_round_trip(original.policy.get_weights()))
    obs, mask = np.concatenate([A, B, UNSEEN] * 30), np.ones((90, 2), bool)
    np.testing.assert_array_equal(
        worker_side.act(obs, mask, True, np.random.default_rng(3))[0],
        original.policy.act(obs, mask, True, np.random.default_rng(3))[0],
    )

    resumed = TabularQTrainer(3, 2, config)
    resumed.load_state_dict(_round_trip(original.state_dict()))
    more = _experience([A, B], [1, 1], [0.0, 2.0], [B, B], [0, 1])
    assert original.learn(more) == resumed.learn(more)
    torch.testing.assert_close(resumed.policy.q, original.policy.q, rtol=0, atol=0)


def test_more_observations_than_the_table_may_hold_are_refused_in_one_line():
    trainer = TabularQTrainer(3, 2, TabularQConfig(max_states=1))
    with pytest.raises(ValueError) as refused:
        trainer.learn(_two_states())
    assert str(refused.value) == (
        "tabular_q: 2 distinct observations, more than max_states=1; "
        "this environment's observations do not fit a table (use a network oracle such as dqn)"
    )


@pytest.mark.timeout(120)
def test_a_learned_response_on_kuhn_is_the_exact_best_response():
    """Kuhn poker against its first population (the uniform policy): with enough episodes the
    model's greedy policy is a true best response, its gap to the exact one 0."""
    from marl_core.psro.config import build_config
    from marl_core.psro.oracles import OracleCall, get_oracle
    from marl_core.psro.steps import initial_populations, rollout_pool_config
    from marl_core.rollout.pool import WorkerPool

    torch.set_num_threads(1)
    config = build_config(
        {
            "oracle": "tabular_q",
            "best_response": {"episodes": 6000, "episodes_per_round": 1000},
            "rollout": {"workers": 1, "envs_per_worker": 32},
        }
    )
    populations, uniform = initial_populations(config), [np.ones(1), np.ones(1)]
    pool = WorkerPool(rollout_pool_config(config))
    for role in (0, 1):
        call = OracleCall(config, role, populations, uniform, 1, pool)
        response = get_oracle("tabular_q").compute(call)
        assert response.metrics["gap_to_exact"] == pytest.approx(0.0, abs=1e-12), role
    assert ALGORITHMS.settings("tabular_q") is TabularQConfig
