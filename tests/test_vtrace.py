"""V-trace: a hand-computed example, and its reduction to n-step returns on-policy."""

from __future__ import annotations

import numpy as np
import pytest

from marl_core.rl.ppo import compute_gae
from marl_core.rl.vtrace import VTraceClipping, vtrace


def test_vtrace_equals_a_hand_computed_example():
    """Two streams, gamma 0.9. Stream 1 (3 steps) is cut by the segment's end and bootstraps
    from V = 4; its ratios pi/mu are 2, 0.5, 1, so rho and c are 1, 0.5, 1 after truncation.
    Stream 2 (2 steps) terminates. By the recursion v_t = V_t + delta_t + gamma c_t (v_{t+1} - V_{t+1}):
      t=2: delta = 1.0 (2 + 0.9*4 - 3) = 2.6                      v = 5.6
      t=1: delta = 0.5 (0 + 0.9*3 - 2) = 0.35; 0.35 + 0.9*0.5*2.6  v = 2 + 1.52 = 3.52
      t=0: delta = 1.0 (1 + 0.9*2 - 1) = 1.8;  1.8 + 0.9*1*1.52    v = 1 + 3.168 = 4.168
    advantages min(1, rho) (r + gamma v_{t+1} - V): 1 + 0.9*3.52 - 1 = 3.168, 0.5 (0.9*5.6 - 2) = 1.52,
    2 + 0.9*4 - 3 = 2.6. Stream 2: v = 1 + 0.9*1 = 1.9, 1; advantages 1.9 - 0.5, 1 - 0.5."""
    behaviour = np.log([0.25, 0.8, 0.3, 0.5, 0.5])
    target = np.log([0.5, 0.4, 0.3, 0.5, 0.5])
    trace = vtrace(
        behaviour_logp=behaviour,
        target_logp=target,
        reward=np.array([1.0, 0.0, 2.0, 1.0, 1.0]),
        value=np.array([1.0, 2.0, 3.0, 0.5, 0.5]),
        next_value=np.array([0.0, 0.0, 4.0, 0.0, 99.0]),  # read only where last and not done
        done=np.array([False, False, False, False, True]),
        last=np.array([False, False, True, False, True]),
        gamma=0.9,
    )
    np.testing.assert_allclose(trace.targets, [4.168, 3.52, 5.6, 1.9, 1.0], atol=1e-12)
    np.testing.assert_allclose(trace.advantages, [3.168, 1.52, 2.6, 1.4, 0.5], atol=1e-12)
    np.testing.assert_allclose(trace.rho, [2.0, 0.5, 1.0, 1.0, 1.0], atol=1e-12)


def test_clipping_thresholds_apply_where_the_paper_puts_them():
    """rho_bar truncates the TD errors, c_bar the traces, pg_rho_bar the policy gradient: one step,
    ratio 3, terminal, reward 1, V = 0.5 -> delta uses min(rho_bar, 3), advantage min(pg_rho_bar, 3)."""
    args = dict(
        behaviour_logp=np.log([0.25]),
        target_logp=np.log([0.75]),
        reward=np.array([1.0]),
        value=np.array([0.5]),
        next_value=np.array([0.0]),
        done=np.array([True]),
        last=np.array([True]),
        gamma=0.9,
    )
    trace = vtrace(**args, clipping=VTraceClipping(rho_bar=2.0, pg_rho_bar=1.5))
    assert trace.targets[0] == pytest.approx(0.5 + 2.0 * 0.5)
    assert trace.advantages[0] == pytest.approx(1.5 * (1.0 - 0.5))


def test_on_policy_vtrace_is_the_n_step_return_to_the_segment_end():
    """pi = mu: every rho and c is 1, so v_t = sum_k gamma^k r_{t+k} + gamma^n V(bootstrap), cut at
    a termination: computed here by a plain forward sum, and equal to GAE(lambda=1)'s returns.
    Three segments; the first holds an episode that terminates mid-segment (the next one goes on
    in the same stream, as in a worker's fragment), the second ends in a termination."""
    rng = np.random.default_rng(0)
    n = 15
    last = np.zeros(n, bool)
    last[[4, 7, 14]] = True
    done = np.zeros(n, bool)
    done[[1, 7]] = True
    reward, value, next_value = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    logp = np.log(rng.uniform(0.1, 1.0, size=n))
    gamma = 0.95
    trace = vtrace(logp, logp, reward, value, next_value, done, last, gamma)

    expected = np.zeros(n)
    for t in range(n):
        k, discount = t, 1.0
        while True:
            expected[t] += discount * reward[k]
            if done[k]:
                break
            if last[k]:
                expected[t] += discount * gamma * next_value[k]
                break
            k, discount = k + 1, discount * gamma
    np.testing.assert_allclose(trace.targets, expected, atol=1e-10)
    _, gae_returns = compute_gae(reward, value, next_value, done, last, gamma, gae_lambda=1.0)
    np.testing.assert_allclose(trace.targets, gae_returns, atol=1e-10)
    np.testing.assert_allclose(trace.advantages, expected - value, atol=1e-10)  # r + gamma v_{t+1} - V = v_t - V
