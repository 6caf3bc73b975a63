"""V-trace (Espeholt et al. 2018, IMPALA): value targets and policy-gradient advantages for
experience that a slightly older policy collected.

An asynchronous learner trains on fragments its workers played with the weights they last
pulled, the behaviour policy mu, while it has moved on to pi. V-trace corrects for the gap with
truncated importance weights, one backward pass per stream:

    rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))      c_t = lambda * min(c_bar, pi / mu)
    delta_t = rho_t * (r_t + gamma * V(x_{t+1}) - V(x_t))
    v_t - V(x_t) = delta_t + gamma * c_t * (v_{t+1} - V(x_{t+1}))

and the actor follows min(pg_rho_bar, pi/mu) * (r_t + gamma * v_{t+1} - V(x_t)). The clipping
thresholds default to 1.0, as in DeepMind's `scalable_agent` and RLlib. When pi equals mu the
weights are all 1 and, with lambda 1, v_t is the n-step return to the end of the segment
bootstrapped from the critic: what A2C and GAE(lambda=1) compute.

Streams follow `Experience`'s rules: a `done` transition ends the return (no bootstrap); a
`last` one that is not done bootstraps from `next_value`, the critic's value of `next_obs`.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class VTraceClipping:
    rho_bar: float = 1.0  # truncates the importance weight of the value target's TD errors
    c_bar: float = 1.0  # truncates the traces that carry later errors back
    pg_rho_bar: float = 1.0  # truncates the importance weight of the policy gradient
    trace_lambda: float = 1.0  # scales every trace (the paper's lambda)


@dataclasses.dataclass(frozen=True)
class VTrace:
    targets: np.ndarray  # [N] v_t, the critic's regression targets
    advantages: np.ndarray  # [N] the policy gradient's weights, importance weight included
    rho: np.ndarray  # [N] untruncated pi/mu, for metrics


def vtrace(
    behaviour_logp: np.ndarray,
    target_logp: np.ndarray,
    reward: np.ndarray,
    value: np.ndarray,
    next_value: np.ndarray,
    done: np.ndarray,
    last: np.ndarray,
    gamma: float,
    clipping: VTraceClipping = VTraceClipping(),
) -> VTrace:
    """V-trace targets and advantages of one batch of streams (all arrays [N], float64 out).

    `value[t]` is V(x_t) under the current critic; inside a stream V(x_{t+1}) is `value[t+1]`,
    and `next_value[t]` is read only where a segment ends without termination.
    """
    rho = np.exp(np.asarray(target_logp, np.float64) - np.asarray(behaviour_logp, np.float64))
    clipped_rho = np.minimum(clipping.rho_bar, rho)
    c = clipping.trace_lambda * np.minimum(clipping.c_bar, rho)
    value = np.asarray(value, np.float64)
    targets = np.zeros(len(reward), np.float64)
    correction = 0.0  # v_{t+1} - V(x_{t+1})
    for t in reversed(range(len(reward))):
        if last[t]:
            following_value, correction = float(next_value[t]), 0.0
        else:
            following_value = value[t + 1]
        continues = 0.0 if done[t] else 1.0
        delta = clipped_rho[t] * (reward[t] + gamma * continues * following_value - value[t])
        correction = delta + gamma * continues * c[t] * correction
        targets[t] = value[t] + correction
    following_targets = np.where(last, next_value, np.roll(targets, -1))
    following_targets = np.where(done, 0.0, following_targets)
    advantages = np.minimum(clipping.pg_rho_bar, rho) * (reward + gamma * following_targets - value)
    return VTrace(targets, advantages, rho)
