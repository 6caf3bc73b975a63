"""Value decomposition (VDN and QMIX), read top to bottom: mixers, replay buffer, learner.

Independent Q-learners (IQL) each regress their own Q-value onto their own reward and treat the
other agents as part of a moving environment. Value decomposition instead learns one *team*
value Q_tot(s, a_1..a_n) from the team reward, written as a function of per-agent utilities
Q_a(o_a, a_a) that each depend only on the agent's own observation. If raising any agent's
utility never lowers Q_tot, the joint greedy action is every agent's own greedy action, so agents
still act independently and cheaply while they learn from the one team signal:

- VDN (Sunehag et al. 2018): Q_tot = sum_a Q_a. Additive, so it cannot represent payoffs in
  which one agent's best action depends on another's (the two-step game of `envs.two_step`).
- QMIX (Rashid et al. 2018): Q_tot = a small mixing network of the utilities whose weights are
  produced from the global state by hypernetworks and made non-negative (abs), so Q_tot is
  monotonic in every Q_a yet can weigh agents differently in different states.

Both share everything but the mixer. Each policy id of the `PolicyLayout` has one agent network,
a `QPolicy` (single-agent DQN's epsilon-greedy acting network: epsilon is one of its buffers, so
rollout workers that receive the policies explore exactly as the learner intends); agents that
share the id share that network. The learner keeps a replay buffer of joint transitions and, for
every `train_every` joint environment steps, takes one gradient step on

    (Q_tot(s, o, a) - [r + gamma * Q_tot_target(s', o', a*)])^2,

where a* are the agents' greedy *legal* next actions (chosen by the online agent networks with
`double=True`, as in double DQN, and valued by the target agents and target mixer). As
`batch.py` documents, a terminated step does not bootstrap and a truncated one does: MPE's
25-step limit is not part of the task, so its last step's value is the value of going on.

Team reward: the *mean* of the agents' rewards. In MPE's simple_spread every agent's reward is
the same shared term (how well the landmarks are covered) plus its own collision penalty; the
mean keeps the shared term at its own scale and counts every collision, and it makes Q_tot
estimate exactly what the MARL loop reports (a policy's return: the mean over its agents). With
identical rewards (the two-step game) the mean is the reward itself.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from marl_core.marl import MARLAlgorithm
from marl_core.marl.settings import QMIXConfig, ValueDecompositionConfig, VDNConfig
from marl_core.rl.dqn import QPolicy, linear_epsilon, take_owed_gradient_steps
from marl_core.rl.networks import masked_argmax
from marl_core.rl.settings import DQNConfig
from marl_core.rollout.joint_experience import JointExperience
from marl_core.rollout.layout import PolicyLayout

# --- mixers: [B, N] agent utilities and [B, S] global states -> [B] team values ---------------


class VDNMixer(nn.Module):
    """Q_tot = sum of the utilities; the state is not used."""

    def forward(self, utilities: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return utilities.sum(dim=1)


class QMixer(nn.Module):
    """Q_tot = w2(s) . elu(W1(s) q + b1(s)) + V(s), with W1(s) >= 0 and w2(s) >= 0 elementwise.

    Hypernetworks map the global state to the mixing network's weights and biases. Taking the
    absolute value of the generated *weights* makes every path from a utility to Q_tot a product
    of non-negative weights and a monotonically increasing activation (ELU), so dQ_tot/dQ_a >= 0
    for every agent and state, whatever the hypernetworks' own parameters are. The biases need no
    constraint: they do not multiply a utility. Both weight hypernetworks have a hidden layer
    (the common two-layer variant, which fits state-dependent weightings better than one linear
    map), and the final bias V(s) is a small network too: it carries the part of the team value
    that no agent's action changes, which a state-independent bias could not.
    """

    def __init__(self, num_agents: int, state_size: int, embed: int, hypernet_hidden: int):
        super().__init__()
        self.num_agents, self.embed = num_agents, embed
        self.hyper_w1 = nn.Sequential(
            nn.Linear(state_size, hypernet_hidden), nn.ReLU(), nn.Linear(hypernet_hidden, num_agents * embed)
        )
        self.hyper_b1 = nn.Linear(state_size, embed)
        self.hyper_w2 = nn.Sequential(
            nn.Linear(state_size, hypernet_hidden), nn.ReLU(), nn.Linear(hypernet_hidden, embed)
        )
        self.value = nn.Sequential(nn.Linear(state_size, embed), nn.ReLU(), nn.Linear(embed, 1))

    def forward(self, utilities: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        w1 = torch.abs(self.hyper_w1(state)).view(-1, self.num_agents, self.embed)  # [B, N, embed]
        b1 = self.hyper_b1(state)  # [B, embed]
        hidden = F.elu(torch.bmm(utilities.unsqueeze(1), w1).squeeze(1) + b1)  # [B, embed]
        w2 = torch.abs(self.hyper_w2(state))  # [B, embed]
        return (hidden * w2).sum(dim=1) + self.value(state).squeeze(1)


# --- the replay buffer of joint transitions ----------------------------------------------------


class JointTransitions(NamedTuple):
    """A sampled minibatch as tensors; per-policy fields stack that policy's agents on dim 1."""

    obs: dict[str, torch.Tensor]  # policy -> [B, n_p, O_p]
    action: dict[str, torch.Tensor]  # policy -> [B, n_p]
    next_obs: dict[str, torch.Tensor]  # policy -> [B, n_p, O_p]
    next_mask: dict[str, torch.Tensor]  # policy -> [B, n_p, A_p]
    reward: torch.Tensor  # [B] team reward
    state: torch.Tensor  # [B, S]
    next_state: torch.Tensor  # [B, S]
    terminated: torch.Tensor  # [B] bool


_DTYPES = {
    "obs": np.float32,
    "next_obs": np.float32,
    "action": np.int64,
    "mask": np.bool_,
    "next_mask": np.bool_,
    "reward": np.float32,
    "state": np.float32,
    "next_state": np.float32,
    "terminated": np.bool_,
}


def _tail(source: str, layout: PolicyLayout, policy: str) -> tuple[int, ...]:
    """The shape of one agent's entry of a per-agent field, e.g. its observation size."""
    if source in ("obs", "next_obs"):
        return (layout.obs_size[policy],)
    if source in ("mask", "next_mask"):
        return (layout.num_actions[policy],)
    return ()  # action, reward


class JointReplayBuffer:
    """A numpy ring buffer of joint transitions: once full, new ones overwrite the oldest.

    Agents are stored stacked by policy id (in the layout's group order), so a minibatch feeds
    each shared network in one forward pass. The legal-action masks of the step itself are not
    kept: the action taken was legal, and only the next step's masks enter the target.

    The fields are declared, not written out: `PER_POLICY` maps each per-policy field to the
    per-agent `JointExperience` field it copies, `SHARED` names the fields of the whole step
    (`reward` is the team's: the mean over agents). A subclass that needs other fields (MADDPG)
    changes the two declarations; storing, saving and loading follow them.
    """

    PER_POLICY = {"obs": "obs", "action": "action", "next_obs": "next_obs", "next_mask": "next_mask"}
    SHARED = ("reward", "state", "next_state", "terminated")

    def __init__(self, capacity: int, layout: PolicyLayout, state_size: int):
        self.capacity, self.layout = capacity, layout
        for name, source in self.PER_POLICY.items():
            setattr(
                self,
                name,
                {
                    policy: np.zeros((capacity, len(agents), *_tail(source, layout, policy)), _DTYPES[source])
                    for policy, agents in layout.groups.items()
                },
            )
        for name in self.SHARED:
            setattr(self, name, np.zeros((capacity, *((state_size,) if "state" in name else ())), _DTYPES[name]))
        self.size = 0  # transitions held
        self.position = 0  # where the next one goes

    def __len__(self) -> int:
        return self.size

    def add(self, batch: JointExperience) -> None:
        """Every [t, e] row of the batch as one joint transition."""
        rows = batch.float_observations().flat()  # [T*E, 1, ...]: each row a transition that stands alone
        n = min(rows.steps, self.capacity)  # more than fits: only the newest survive anyway
        if n == 0:
            return
        slots = (self.position + np.arange(n)) % self.capacity
        for name, source in self.PER_POLICY.items():
            for policy, agents in self.layout.groups.items():
                getattr(self, name)[policy][slots] = np.stack(
                    [getattr(rows, source)[a][-n:, 0] for a in agents], axis=1
                )
        for name in self.SHARED:
            if name == "reward":
                self.reward[slots] = np.mean([rows.reward[a][-n:, 0] for a in rows.agents], axis=0)
            else:
                getattr(self, name)[slots] = getattr(rows, name)[-n:, 0]
        self.position = (self.position + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, generator: np.random.Generator) -> JointTransitions:
        index = generator.integers(self.size, size=batch_size)
        per_policy = {
            name: {p: torch.from_numpy(v[index]) for p, v in getattr(self, name).items()} for name in self.PER_POLICY
        }
        shared = {name: torch.from_numpy(getattr(self, name)[index]) for name in self.SHARED}
        return JointTransitions(**per_policy, **shared)

    def state_dict(self) -> dict:
        """The filled part as tensors (so it loads with `torch.load(weights_only=True)`)."""
        out: dict = {"size": self.size, "position": self.position}
        for name in self.PER_POLICY:
            out[name] = {p: torch.from_numpy(v[: self.size].copy()) for p, v in getattr(self, name).items()}
        for name in self.SHARED:
            out[name] = torch.from_numpy(getattr(self, name)[: self.size].copy())
        return out

    def load_state_dict(self, state: dict) -> None:
        self.size, self.position = int(state["size"]), int(state["position"])
        for name in self.PER_POLICY:
            for policy, values in getattr(self, name).items():
                values[: self.size] = state[name][policy].numpy()
        for name in self.SHARED:
            getattr(self, name)[: self.size] = state[name].numpy()


# --- the learner -------------------------------------------------------------------------------


class ValueDecompositionLearner:
    """Agent networks (inside `.policies`), the mixer, their target copies, one optimizer over
    agents and mixer together, and the joint replay buffer."""

    def __init__(self, layout: PolicyLayout, state_size: int, config: ValueDecompositionConfig):
        self.layout, self.config = layout, config
        num_agents = sum(len(agents) for agents in layout.groups.values())
        # QPolicy reads its hidden widths and first epsilon from a DQNConfig.
        acting = DQNConfig(hidden=config.hidden, epsilon_start=config.epsilon_start)
        with torch.random.fork_rng(devices=[]):  # seeded initialisation without touching global state
            torch.manual_seed(config.seed)
            self.policies: dict[str, QPolicy] = {
                policy: QPolicy(layout.obs_size[policy], layout.num_actions[policy], acting) for policy in layout.groups
            }
            self.mixer = self.make_mixer(num_agents, state_size)
        self.target_agents = {p: copy.deepcopy(policy.q).requires_grad_(False) for p, policy in self.policies.items()}
        self.target_mixer = copy.deepcopy(self.mixer).requires_grad_(False)
        self.parameters = [w for policy in self.policies.values() for w in policy.q.parameters()]
        self.parameters += list(self.mixer.parameters())
        self.optimizer = torch.optim.Adam(self.parameters, lr=config.lr, fused=True)  # fused: faster on CPU
        self.buffer = JointReplayBuffer(config.buffer_size, layout, state_size)
        self.generator = np.random.default_rng(config.seed)
        self.env_steps = 0  # joint steps: one per environment copy per step
        self.gradient_steps = 0

    def make_mixer(self, num_agents: int, state_size: int) -> nn.Module:
        raise NotImplementedError

    def epsilon(self) -> float:
        return linear_epsilon(self.config, self.env_steps)

    def learn(self, batch: JointExperience) -> dict[str, float]:
        """Store the segment, move epsilon on, and take the gradient steps owed for it."""
        self.buffer.add(batch)
        self.env_steps += batch.steps * batch.envs
        for policy in self.policies.values():
            policy.epsilon.fill_(self.epsilon())
        return take_owed_gradient_steps(self, q_name="q_tot")

    def utilities(self, networks: dict[str, nn.Module], obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each policy's Q-values [B, n_p, A_p] for its stacked agents: one forward pass per policy."""
        return {p: networks[p](obs[p]) for p in self.layout.groups}

    def _gradient_step(self) -> tuple[float, float]:
        c = self.config
        batch = self.buffer.sample(c.batch_size, self.generator)
        online = {p: policy.q for p, policy in self.policies.items()}
        q = self.utilities(online, batch.obs)
        chosen = torch.cat([q[p].gather(2, batch.action[p].unsqueeze(2)).squeeze(2) for p in self.layout.groups], dim=1)
        q_tot = self.mixer(chosen, batch.state)
        with torch.no_grad():
            next_q = self.utilities(self.target_agents, batch.next_obs)
            chooser = self.utilities(online, batch.next_obs) if c.double else next_q
            next_values = []
            for p in self.layout.groups:
                next_action = masked_argmax(chooser[p], batch.next_mask[p])  # only legal next actions
                next_values.append(next_q[p].gather(2, next_action.unsqueeze(2)).squeeze(2))
            next_tot = self.target_mixer(torch.cat(next_values, dim=1), batch.next_state)
            # A terminated step has nothing after it (and no legal next action): its value is 0.
            next_tot = torch.where(batch.terminated, torch.zeros_like(next_tot), next_tot)
            target = batch.reward + c.gamma * next_tot
        # Squared error: Q_tot must be the mean return (see rl/dqn.py on Huber losses).
        loss = F.mse_loss(q_tot, target)
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.parameters, c.max_grad_norm)
        self.optimizer.step()
        self.gradient_steps += 1
        if self.gradient_steps % c.target_update_interval == 0:
            for p, policy in self.policies.items():
                self.target_agents[p].load_state_dict(policy.q.state_dict())
            self.target_mixer.load_state_dict(self.mixer.state_dict())
        return loss.item(), q_tot.mean().item()

    def state_dict(self) -> dict:
        """Everything needed to resume exactly: networks, optimizer, replay buffer, RNG, counters."""
        return {
            "policies": {p: policy.state_dict() for p, policy in self.policies.items()},
            "mixer": self.mixer.state_dict(),
            "target_agents": {p: target.state_dict() for p, target in self.target_agents.items()},
            "target_mixer": self.target_mixer.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "generator": self.generator.bit_generator.state,
            "env_steps": self.env_steps,
            "gradient_steps": self.gradient_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        for p, policy in self.policies.items():
            policy.load_state_dict(state["policies"][p])
            self.target_agents[p].load_state_dict(state["target_agents"][p])
        self.mixer.load_state_dict(state["mixer"])
        self.target_mixer.load_state_dict(state["target_mixer"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        self.generator.bit_generator.state = state["generator"]
        self.env_steps = int(state["env_steps"])
        self.gradient_steps = int(state["gradient_steps"])


class VDNLearner(ValueDecompositionLearner):
    def make_mixer(self, num_agents: int, state_size: int) -> nn.Module:
        return VDNMixer()


class QMIXLearner(ValueDecompositionLearner):
    def make_mixer(self, num_agents: int, state_size: int) -> nn.Module:
        return QMixer(num_agents, state_size, self.config.mixing_embed, self.config.hypernet_hidden)


VDN = MARLAlgorithm(VDNConfig, VDNLearner)
QMIX = MARLAlgorithm(QMIXConfig, QMIXLearner)
