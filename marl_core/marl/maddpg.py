"""MADDPG (Lowe et al. 2017) for discrete actions, read top to bottom: the Gumbel-softmax actor,
the centralized critic, the replay buffer with every agent's own reward, the learner.

Independent learners see the other agents as part of a non-stationary environment: as they
learn, the same action in the same observation leads to different returns, and in mixed
cooperative-competitive games (MPE's simple_adversary: one adversary against two cooperating
agents, opposite rewards) that noise swamps the learning signal. MADDPG keeps *decentralized
actors*, each acting on its own observation only (so execution needs nothing the agent cannot
see), and trains them against *centralized critics*

    Q_i(o_1..o_N, a_1..a_N): agent i's return, given every agent's observation and action.

Knowing everyone's actions, Q_i is stationary however the other policies change, and since every
agent's critic regresses on that agent's *own* reward, competing agents can have opposite goals
(a team value, as in VDN/QMIX, could not represent that).

Discrete actions. DDPG's actor gradient dQ/da * da/dtheta needs an action that is a
differentiable function of the actor's parameters. As in the paper's own discrete experiments,
the actor's categorical policy softmax(logits) is reparameterized by the Gumbel-softmax trick:
argmax(logits + g) with g ~ Gumbel(0, 1) is an exact sample of the policy, and
softmax((logits + g) / temperature) is a differentiable relaxation of its one-hot. We use the
*straight-through* estimator: the critic sees the hard one-hot that the agent would really play
(the kind of input it was trained on), and the gradient flows through the soft relaxation.
Illegal actions are masked after the noise, so they are never sampled, never valued and never
receive gradient. Exploration is the policy's own randomness: rollout workers sample from the
masked softmax; the greedy evaluation takes its argmax.

Parameter sharing. Agents mapped to one policy id (`PolicyLayout`) share its actor, as every
learner here does, and also its critic: one network estimates each of those agents' returns and
is told which agent it values by a one-hot appended to the joint input (the observations'
own agent one-hots, constant in every joint vector, are left out of it).

Each update (one every `train_every` joint steps, after `learning_starts`) samples one minibatch
of joint transitions and, for every policy id p and its agents i:

1. critic: Q_p(x, a, i) -> r_i + gamma * Q'_p(x', a', i), with a'_j a Gumbel-softmax sample of
   agent j's *target* actor at o'_j (target networks as in DDPG) and no bootstrap after a
   terminated step (a truncated one, MPE's 25-step limit, does bootstrap: see `batch.py`);
2. actor: maximize Q_p(x, a_1..mu_p(o_i)..a_N, i) with only agent i's action replaced by its
   actor's straight-through sample (the others are the replayed actions), plus a small penalty
   on the squared logits, as in the authors' code, which keeps the softmax from saturating;
3. every target network moves toward its online network by Polyak averaging (rate tau).

Frozen policies (`frozen`, or the learner's `frozen` set changed between rounds) still act and
are still played against, but their actor and critic take no step: the others then learn
against a fixed opponent, as a best response does in PSRO. On simple_adversary that is what lets
the good agents learn to deceive a trained adversary (docs/marl.md has the curves); against an
adversary that keeps adapting they rarely find it.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from marl_core.marl import MARLAlgorithm
from marl_core.marl.settings import MADDPGConfig
from marl_core.marl.value_decomposition import JointReplayBuffer
from marl_core.rl.dqn import owed_gradient_steps
from marl_core.rl.networks import masked_argmax, masked_logits, mlp
from marl_core.rl.policy import NetworkPolicy
from marl_core.rl.sampling import sample_rows
from marl_core.rollout.joint_experience import JointExperience
from marl_core.rollout.layout import PolicyLayout

# --- the actor: a categorical policy, and its Gumbel-softmax sample for training ---------------


def gumbel_softmax(
    logits: torch.Tensor, mask: torch.Tensor, temperature: float, generator: torch.Generator
) -> torch.Tensor:
    """A straight-through Gumbel-softmax sample of softmax(logits) over the legal actions.

    Forward: the one-hot of argmax(logits + g), g ~ Gumbel(0, 1), an exact sample of the policy
    (whatever the temperature). Backward: the gradient of softmax((logits + g) / temperature).
    The noise comes from `generator` (torch.nn.functional.gumbel_softmax draws from the global
    RNG, which would make training depend on everything else that uses it).
    """
    uniform = torch.rand(logits.shape, generator=generator).clamp_(min=torch.finfo(torch.float32).tiny)
    perturbed = masked_logits((logits - torch.log(-torch.log(uniform))) / temperature, mask)
    soft = torch.softmax(perturbed, dim=-1)
    hard = F.one_hot(masked_argmax(perturbed, mask), logits.shape[-1]).to(soft.dtype)
    return hard - soft.detach() + soft


class GumbelSoftmaxPolicy(NetworkPolicy):
    """A masked-softmax actor on the agent's own observation; it means softmax(logits).

    Exploring samples from that softmax (the distribution the Gumbel-softmax samples in
    training follow); `explore=False` takes its argmax. Extras: none.
    """

    def __init__(self, obs_size: int, num_actions: int, hidden: tuple[int, ...]):
        super().__init__(obs_size, num_actions)
        self.actor = mlp(obs_size, hidden, num_actions, nn.ReLU)

    def act(self, obs, mask, explore, generator):
        obs_t, mask_t = self._tensors(obs, mask)
        with torch.inference_mode():
            logits = masked_logits(self.actor(obs_t), mask_t)
            if not explore:
                return masked_argmax(logits, mask_t).numpy(), {}
            probs = torch.softmax(logits.double(), dim=-1).numpy()
        return sample_rows(probs, generator), {}

    def action_probs(self, obs, mask):
        obs_t, mask_t = self._tensors(obs, mask)
        with torch.inference_mode():
            return torch.softmax(masked_logits(self.actor(obs_t), mask_t).double(), dim=-1).numpy()


# --- the centralized critic --------------------------------------------------------------------


class CentralizedCritic(nn.Module):
    """Q(every agent's observation and one-hot action, which agent) for the n agents of one policy.

    `forward` takes one joint vector per agent valued, [B, n, J] (they differ in the actor
    update, where each agent's own action is its actor's sample), and returns [B, n]. With
    n > 1 each vector is followed by the one-hot of its agent.
    """

    def __init__(self, joint_size: int, num_agents: int, hidden: tuple[int, ...]):
        super().__init__()
        self.num_agents = num_agents
        self.in_features = joint_size + (num_agents if num_agents > 1 else 0)
        self.q = mlp(self.in_features, hidden, 1, nn.ReLU)

    def forward(self, joint: torch.Tensor) -> torch.Tensor:
        if self.num_agents > 1:
            which = torch.eye(self.num_agents).expand(len(joint), -1, -1)
            joint = torch.cat([joint, which], dim=2)
        return self.q(joint).squeeze(2)


# --- the replay buffer: joint transitions with every agent's reward and legal actions ----------


class Transitions(NamedTuple):
    """A sampled minibatch as tensors; per-policy fields stack that policy's agents on dim 1."""

    obs: dict[str, torch.Tensor]  # policy -> [B, n_p, O_p]
    mask: dict[str, torch.Tensor]  # policy -> [B, n_p, A_p]
    action: dict[str, torch.Tensor]  # policy -> [B, n_p]
    reward: dict[str, torch.Tensor]  # policy -> [B, n_p], each agent's own
    next_obs: dict[str, torch.Tensor]  # policy -> [B, n_p, O_p]
    next_mask: dict[str, torch.Tensor]  # policy -> [B, n_p, A_p]
    terminated: torch.Tensor  # [B] bool


class PerAgentReplayBuffer(JointReplayBuffer):
    """VDN/QMIX's joint replay buffer with MADDPG's fields: each agent's own reward (besides the
    team's mean) and the legal actions of the step itself (the actor update samples actions
    there). The critics see every agent's observation, so the global state is not kept."""

    PER_POLICY = {**JointReplayBuffer.PER_POLICY, "mask": "mask", "agent_reward": "reward"}
    SHARED = ("reward", "terminated")

    def sample(self, batch_size: int, generator: np.random.Generator) -> Transitions:
        index = generator.integers(self.size, size=batch_size)

        def rows(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
            return {p: torch.from_numpy(v[index]) for p, v in arrays.items()}

        return Transitions(
            obs=rows(self.obs),
            mask=rows(self.mask),
            action=rows(self.action),
            reward=rows(self.agent_reward),
            next_obs=rows(self.next_obs),
            next_mask=rows(self.next_mask),
            terminated=torch.from_numpy(self.terminated[index]),
        )


# --- the learner -------------------------------------------------------------------------------


class MADDPGLearner:
    """Actors (inside `.policies`) and centralized critics, one of each per policy id, their target
    copies, an Adam optimizer per network, and the replay buffer."""

    def __init__(self, layout: PolicyLayout, state_size: int, config: MADDPGConfig):
        self.layout, self.config = layout, config
        # What of each stored observation enters the joint vector: all but a trailing agent one-hot.
        groups, self.env_obs_size = layout.groups, {}
        for p, agents in groups.items():
            one_hot = layout.one_hot(agents[0])
            self.env_obs_size[p] = layout.obs_size[p] - (0 if one_hot is None else len(one_hot))
        self.joint_size = sum(
            len(agents) * (self.env_obs_size[p] + layout.num_actions[p]) for p, agents in groups.items()
        )
        with torch.random.fork_rng(devices=[]):  # seeded initialisation without touching global state
            torch.manual_seed(config.seed)
            self.policies: dict[str, GumbelSoftmaxPolicy] = {
                p: GumbelSoftmaxPolicy(layout.obs_size[p], layout.num_actions[p], config.hidden) for p in groups
            }
            self.critics = {
                p: CentralizedCritic(self.joint_size, len(agents), config.critic_hidden) for p, agents in groups.items()
            }
        self.actors = {p: policy.actor for p, policy in self.policies.items()}
        self.target_actors = {p: copy.deepcopy(actor).requires_grad_(False) for p, actor in self.actors.items()}
        self.target_critics = {p: copy.deepcopy(critic).requires_grad_(False) for p, critic in self.critics.items()}
        adam = lambda network, lr: torch.optim.Adam(network.parameters(), lr=lr, fused=True)  # noqa: E731  (fused: faster)
        self.actor_optimizers = {p: adam(actor, config.actor_lr) for p, actor in self.actors.items()}
        self.critic_optimizers = {p: adam(critic, config.critic_lr) for p, critic in self.critics.items()}
        unknown = sorted(set(config.frozen) - set(groups))
        if unknown:
            raise ValueError(f"frozen={unknown}: no such policy; the policies are {sorted(groups)}")
        self.frozen: set[str] = set(config.frozen)  # policy ids that take no step; may change between rounds
        self.buffer = PerAgentReplayBuffer(config.buffer_size, layout, state_size)
        self.generator = np.random.default_rng(config.seed)  # replay sampling
        self.noise = torch.Generator().manual_seed(config.seed)  # Gumbel noise
        self.env_steps = 0  # joint steps: one per environment copy per step
        self.gradient_steps = 0  # updates, each of every critic and actor

    def learn(self, batch: JointExperience) -> dict[str, float]:
        """Store the segment and make the updates owed for it."""
        self.buffer.add(batch.float_observations())
        self.env_steps += batch.steps * batch.envs
        owed = owed_gradient_steps(self)
        history: dict[str, list[float]] = {}
        for _ in range(owed):
            for name, value in self._update().items():
                history.setdefault(name, []).append(value)
        metrics = {
            "gradient_steps": float(self.gradient_steps),
            "env_steps": float(self.env_steps),
            "updates": float(owed),
        }
        metrics.update({name: float(np.mean(values)) for name, values in history.items()})
        return metrics

    def joint(self, obs: dict[str, torch.Tensor], actions: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, J]: every agent's observation, then every agent's one-hot action, in layout group order."""
        parts = [obs[p][..., : self.env_obs_size[p]].flatten(1) for p in self.layout.groups]
        parts += [actions[p].flatten(1) for p in self.layout.groups]
        return torch.cat(parts, dim=1)

    def one_hot(self, action: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {p: F.one_hot(a, self.layout.num_actions[p]).float() for p, a in action.items()}

    def _update(self) -> dict[str, float]:
        c = self.config
        batch = self.buffer.sample(c.batch_size, self.generator)
        taken = self.one_hot(batch.action)
        with torch.no_grad():  # what every agent's target actor would play next
            next_actions = {
                p: gumbel_softmax(self.target_actors[p](next_obs), batch.next_mask[p], c.gumbel_temperature, self.noise)
                for p, next_obs in batch.next_obs.items()
            }
            next_joint = self.joint(batch.next_obs, next_actions)
        joint = self.joint(batch.obs, taken)
        metrics = {}
        for p in self.layout.groups:
            if p in self.frozen:
                continue
            critic_loss, q = self.critic_loss(p, batch, joint, next_joint)
            self._step(self.critic_optimizers[p], self.critics[p], critic_loss)
            actor_loss = self.actor_loss(p, batch, taken)
            self._step(self.actor_optimizers[p], self.actors[p], actor_loss)
            metrics.update({f"{p}/critic_loss": critic_loss.item(), f"{p}/actor_loss": actor_loss.item(), f"{p}/q": q})
        with torch.no_grad():
            # (a frozen network's target keeps moving toward it, so it ends up equal to it)
            for online, target in [
                *zip(self.actors.values(), self.target_actors.values()),
                *zip(self.critics.values(), self.target_critics.values()),
            ]:
                for w, w_target in zip(online.parameters(), target.parameters()):
                    w_target.lerp_(w, c.tau)
        self.gradient_steps += 1
        return metrics

    def critic_loss(
        self, p: str, batch: Transitions, joint: torch.Tensor, next_joint: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        """Squared error of Q_p(x, a, i) against r_i + gamma * Q'_p(x', a', i) for each agent i of p."""
        n = len(self.layout.groups[p])
        q = self.critics[p](joint.unsqueeze(1).expand(-1, n, -1))  # [B, n]
        with torch.no_grad():
            next_q = self.target_critics[p](next_joint.unsqueeze(1).expand(-1, n, -1))
            # A terminated step has nothing after it (and no legal next action): its value is 0.
            next_q = torch.where(batch.terminated.unsqueeze(1), torch.zeros_like(next_q), next_q)
            target = batch.reward[p] + self.config.gamma * next_q
        return F.mse_loss(q, target), q.mean().item()

    def actor_loss(self, p: str, batch: Transitions, taken: dict[str, torch.Tensor]) -> torch.Tensor:
        """-Q_p with each agent i of p playing its actor's straight-through sample at o_i while every
        other agent plays its replayed action, averaged over the batch and p's agents; plus the
        logit penalty."""
        c, n = self.config, len(self.layout.groups[p])
        logits = self.actors[p](batch.obs[p])  # [B, n, A]
        sampled = gumbel_softmax(logits, batch.mask[p], c.gumbel_temperature, self.noise)
        per_agent = []
        for i in range(n):  # agent i's joint vector: its own action from the actor, the rest replayed
            own = (torch.arange(n) == i).view(1, n, 1)
            per_agent.append(self.joint(batch.obs, {**taken, p: torch.where(own, sampled, taken[p])}))
        q = self.critics[p](torch.stack(per_agent, dim=1))  # [B, n]: agent i valued on vector i
        return -q.mean() + c.logit_penalty * logits.pow(2).mean()

    def _step(self, optimizer: torch.optim.Optimizer, network: nn.Module, loss: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(network.parameters(), self.config.max_grad_norm)
        optimizer.step()

    def state_dict(self) -> dict:
        """Everything needed to resume exactly: networks, optimizers, replay buffer, RNGs, counters."""
        each = lambda modules: {p: m.state_dict() for p, m in modules.items()}  # noqa: E731
        return {
            "policies": each(self.policies),
            "critics": each(self.critics),
            "target_actors": each(self.target_actors),
            "target_critics": each(self.target_critics),
            "actor_optimizers": each(self.actor_optimizers),
            "critic_optimizers": each(self.critic_optimizers),
            "buffer": self.buffer.state_dict(),
            "generator": self.generator.bit_generator.state,
            "noise": self.noise.get_state(),
            "env_steps": self.env_steps,
            "gradient_steps": self.gradient_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        for name in ("policies", "critics", "target_actors", "target_critics", "actor_optimizers", "critic_optimizers"):
            for p, module in getattr(self, name).items():
                module.load_state_dict(state[name][p])
        self.buffer.load_state_dict(state["buffer"])
        self.generator.bit_generator.state = state["generator"]
        self.noise.set_state(state["noise"])
        self.env_steps = int(state["env_steps"])
        self.gradient_steps = int(state["gradient_steps"])


MADDPG = MARLAlgorithm(MADDPGConfig, MADDPGLearner)
