"""VDN and QMIX (marl_core/marl/value_decomposition.py).

- On the two-step cooperative matrix game of the QMIX paper (Rashid et al. 2018, section 6.1,
  Table 1), trained by the real MARL loop with uniform exploration throughout as in the paper,
  QMIX learns the payoffs and the optimal joint policy (greedy return 8) while VDN, whose sum of
  utilities cannot represent state 2B's payoffs, settles for state 2A (return 7).
- QMIX's mixer is monotonic in every agent's utility whatever its hypernetworks' weights, and it
  conditions on the global state; VDN's does not.
- The joint replay buffer survives a weights-only save and load exactly.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from joint_rollouts import JointRollouts

from marl_core.envs import by_prefix
from marl_core.marl.config import MARLConfig
from marl_core.marl.rounds import iterate_marl_local
from marl_core.marl.settings import QMIXConfig, VDNConfig
from marl_core.marl.value_decomposition import JointReplayBuffer, QMixer, VDNMixer
from marl_core.rl.dqn import QPolicy
from marl_core.rl.settings import DQNConfig

torch.set_num_threads(1)

TWO_STEP = "pettingzoo:marl_core.envs.two_step"
SPREAD = "pettingzoo:mpe2.simple_spread_v3"
PAYOFF_2B = np.array([[0.0, 1.0], [1.0, 8.0]])


# --- the two-step game: QMIX finds 8, VDN settles for 7 -----------------------------------------


def train_two_step(algorithm: str, seed: int):
    """The paper's setting, scaled to seconds: uniform exploration for the whole run (epsilon 1),
    gamma 0.99, a small replay buffer and batch, one gradient step per joint step. Returns the
    greedy evaluation returns (one per evaluation) and the trained learner."""
    settings = dict(
        hidden=(32,),
        lr=5e-3,
        gamma=0.99,
        batch_size=32,
        buffer_size=500,
        learning_starts=0,
        train_every=1,
        target_update_interval=100,
        epsilon_start=1.0,
        epsilon_end=1.0,
        seed=seed,
    )
    if algorithm == "qmix":
        settings.update(mixing_embed=8, hypernet_hidden=16)
    config = MARLConfig(
        env=TWO_STEP,
        algorithm=algorithm,
        settings=settings,
        rounds=30,
        steps_per_round=8,
        envs_per_worker=4,
        eval_every=10,
        eval_episodes=4,
        seed=seed,
    )
    returns = []
    for record, learner in iterate_marl_local(config):  # noqa: B007 - the last learner is returned after the loop
        if record.eval_returns is not None:
            returns.append(record.eval_returns["policy/agent"])
    return returns, learner


def joint_values(learner, state: int) -> np.ndarray:
    """Q_tot(s, a_0, a_1) as a 2x2 table (rows agent_0's action), from the learned agents and mixer."""
    global_state = torch.zeros(1, 3)
    global_state[0, state] = 1.0
    obs = torch.cat([global_state.repeat(2, 1), torch.eye(2)], dim=1)  # the shared policy's one-hot agent ids
    with torch.no_grad():
        utilities = learner.policies["agent"].q(obs)  # [agent, action]
        pairs = torch.cartesian_prod(utilities[0], utilities[1])  # [4, 2]: (a_0, a_1) row-major
        return learner.mixer(pairs, global_state.repeat(4, 1)).view(2, 2).numpy()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_qmix_learns_the_optimal_joint_policy_of_the_two_step_game(seed):
    returns, learner = train_two_step("qmix", seed)
    assert returns[-2:] == [8.0, 8.0]  # greedy: B, then both pick action 1
    # It represents state 2B's payoffs (the paper's Table 1b), and values B in state 1 at gamma * 8.
    np.testing.assert_allclose(joint_values(learner, 2), PAYOFF_2B, atol=0.25)
    first = joint_values(learner, 0)
    assert first[1].min() > first[0].max()
    np.testing.assert_allclose(first[1], 0.99 * 8, atol=0.25)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vdn_settles_for_7_in_the_two_step_game(seed):
    returns, learner = train_two_step("vdn", seed)
    assert returns[-2:] == [7.0, 7.0]  # greedy: A, where every joint action pays 7
    # A sum of utilities cannot fit 2B's payoffs: its best joint action there looks worse than 7.
    state_2b = joint_values(learner, 2)
    assert state_2b.max() < 7.0
    assert abs(state_2b[1, 1] - 8.0) > 1.0


# --- the mixers: monotonic, and conditioned on the state ----------------------------------------


def randomized(mixer: QMixer, generator: torch.Generator, scale: float) -> QMixer:
    """The same mixer with every weight and bias drawn anew (normal, std `scale`)."""
    with torch.no_grad():
        for parameter in mixer.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * scale)
    return mixer


def test_qmix_is_monotonic_in_every_agents_utility_whatever_its_weights():
    generator = torch.Generator().manual_seed(0)
    num_agents, state_size, batch = 4, 10, 256
    for trial in range(12):
        torch.manual_seed(trial)
        mixer = QMixer(num_agents, state_size, embed=16, hypernet_hidden=32).double()
        if trial > 0:  # the default initialisation first, then ever larger random weights
            randomized(mixer, generator, scale=[0.5, 3.0, 20.0][trial % 3])
        state = torch.randn(batch, state_size, generator=generator, dtype=torch.float64) * (1 + trial)
        utilities = torch.randn(batch, num_agents, generator=generator, dtype=torch.float64) * 5
        utilities.requires_grad_(True)
        q_tot = mixer(utilities, state)
        (gradient,) = torch.autograd.grad(q_tot.sum(), utilities)  # row b: dQ_tot(b) / dQ_a(b)
        assert (gradient >= 0).all(), f"trial {trial}: a negative dQ_tot/dQ_a"
        assert (gradient > 0).any()  # not vacuous

        with torch.no_grad():
            base = mixer(utilities, state)
            for agent in range(num_agents):
                raised = utilities.clone()
                raised[:, agent] += torch.rand(batch, generator=generator, dtype=torch.float64) * 10
                assert (mixer(raised, state) >= base - 1e-9 * (1 + base.abs())).all(), (
                    f"trial {trial}: raising agent {agent}'s utility lowered Q_tot"
                )


def test_qmix_conditions_on_the_global_state_and_vdn_does_not():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    mixer = QMixer(num_agents=3, state_size=6, embed=8, hypernet_hidden=16)
    utilities = torch.randn(1, 3, generator=generator).repeat(2, 1)  # the same utilities ...
    states = torch.randn(2, 6, generator=generator)  # ... in two states
    q_tot = mixer(utilities, states)
    assert not torch.allclose(q_tot[0], q_tot[1])
    # Not only through the state-value bias V(s): the weighting of the agents changes with the state.
    utilities.requires_grad_(True)
    (weights,) = torch.autograd.grad(mixer(utilities, states).sum(), utilities)
    assert not torch.allclose(weights[0], weights[1])

    vdn = VDNMixer()(utilities.detach(), states)
    assert torch.equal(vdn[0], vdn[1])
    torch.testing.assert_close(vdn, utilities.detach().sum(dim=1))


# --- the replay buffer ---------------------------------------------------------------------------


def test_the_joint_replay_buffer_survives_a_weights_only_save_and_load():
    collector = JointRollouts(SPREAD, 3, by_prefix({"agent": "agent"}), seed=0)
    layout, state_size = collector.layout, collector.spec.state_size
    policies = {"agent": QPolicy(layout.obs_size["agent"], layout.num_actions["agent"], DQNConfig(hidden=(8,)))}
    buffer = JointReplayBuffer(50, layout, state_size)
    batches = [collector.collect(policies, 7)[0] for _ in range(3)]  # 21 steps x 3 copies: past capacity
    for batch in batches:
        buffer.add(batch)
    assert len(buffer) == 50 and buffer.position == (3 * 21) % 50

    # What it holds: the newest transition, agents stacked in layout order, the team reward their mean.
    last = batches[-1].flat()
    newest = (buffer.position - 1) % 50
    for k, agent in enumerate(layout.groups["agent"]):
        np.testing.assert_array_equal(buffer.obs["agent"][newest, k], last.obs[agent][-1, 0])
        np.testing.assert_array_equal(buffer.action["agent"][newest, k], last.action[agent][-1, 0])
    np.testing.assert_allclose(buffer.reward[newest], np.mean([last.reward[a][-1, 0] for a in last.agents]), rtol=1e-6)

    saved = io.BytesIO()
    torch.save(buffer.state_dict(), saved)
    saved.seek(0)
    restored = JointReplayBuffer(50, layout, state_size)
    restored.load_state_dict(torch.load(saved, weights_only=True))
    assert (len(restored), restored.position) == (len(buffer), buffer.position)

    def same_samples(a: JointReplayBuffer, b: JointReplayBuffer, seed: int) -> None:
        first, second = a.sample(64, np.random.default_rng(seed)), b.sample(64, np.random.default_rng(seed))
        for name, x in first._asdict().items():
            y = getattr(second, name)
            if isinstance(x, dict):
                assert x.keys() == y.keys()
                for policy in x:
                    assert torch.equal(x[policy], y[policy]), f"{name}[{policy}] differs"
            else:
                assert torch.equal(x, y), f"{name} differs"

    same_samples(buffer, restored, seed=3)
    # And it goes on from the same place: the next transitions overwrite the same slots.
    more = collector.collect(policies, 5)[0]
    buffer.add(more)
    restored.add(more)
    same_samples(buffer, restored, seed=4)
    collector.close()


def test_value_decomposition_settings_reject_a_buffer_smaller_than_a_batch():
    with pytest.raises(ValueError, match="smaller than batch_size"):
        QMIXConfig(buffer_size=16, batch_size=32)
    assert VDNConfig().buffer_size >= VDNConfig().batch_size
