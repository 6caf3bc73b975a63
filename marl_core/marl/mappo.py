"""MAPPO (Yu et al. 2022), read top to bottom: actor, centralized critic, value normalizer, learner.

Independent PPO (IPPO) gives every agent a critic of its own observation. In a cooperative game
that value is a poor baseline: whether the team does well depends on where the *other* agents
are, which an agent's partial observation often does not show, so the critic's error is noise in
every advantage. MAPPO keeps PPO's decentralized actors (each agent still acts on its own
observation, so execution needs nothing global) and trains them against a *centralized* critic
V(s) of the global state `batch.state` [T, E, S], which only the learner ever evaluates:
centralized training, decentralized execution. The paper shows that this plain recipe, with a
few implementation details, matches or beats off-policy MARL methods on MPE, SMAC and Hanabi.

- Actors: `policies`, one `MAPPOActor` per policy id of the `PolicyLayout`; agents mapped to one
  id act with that one network (parameter sharing). It records the log-probability of every
  action it takes, which the clipped objective needs. (It is not rl.ppo's `ActorCriticPolicy`:
  that one carries a critic of the observation, which MAPPO would evaluate at every step and
  never use.)
- Critics: one `CentralCritic` per policy id, shared by its agents like the actor. Agents of one
  id share a team state but not necessarily a reward (simple_spread adds each agent's own
  collision penalty), so the critic sees the state followed by the agent's one-hot: a simple form
  of the paper's "agent-specific global state", and V can differ per agent.
- Advantages: GAE per agent and environment copy, each agent with its own reward. As `batch.py`
  documents, a terminated step does not bootstrap; a truncated one (MPE's 25-step limit) and the
  segment's last row do, from the critic's value of `next_state`. Values are computed by the
  learner when a batch arrives: the critic has not changed since the actors that collected it
  were handed out, so they are the values of acting time.
- Value normalization (on by default; the paper's ValueNorm, with all-time statistics instead of
  its slow moving average): each critic predicts returns standardised by the mean and variance
  of every return seen so far. Returns in simple_spread are in the tens and drift as the team
  improves; standardised targets keep the critic's output layer and its gradients at one scale.
  Advantages are standardised over each policy id's batch.
- Update: `epochs` passes of shuffled minibatches over the clipped surrogate (rl.ppo's GAE and
  loss, with the critic's loss on the global state), an entropy bonus, and gradient-norm clips of
  actor and critic separately, as the paper's code does.

Continuous actions (a policy id whose agents act in a `Box`): the actor is a Gaussian
(`GaussianMAPPOActor`, `rl.gaussian`), the rest as above.

Policy ids do not share parameters, losses or data, so each trains on its own agents' rows
exactly as if the others were alone: with one id (simple_spread) this is the paper's shared-
parameter setting; with several (simple_adversary) each role has its own actor and critic.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from marl_core.envs.api import Box
from marl_core.marl import MARLAlgorithm
from marl_core.marl.settings import MAPPOConfig
from marl_core.rl import gaussian
from marl_core.rl.networks import Tanh, log_softmax, masked_argmax, masked_logits, mlp
from marl_core.rl.policy import NetworkPolicy
from marl_core.rl.ppo import compute_gae, step_metrics
from marl_core.rl.sampling import sample_rows
from marl_core.rollout.joint_experience import JointExperience
from marl_core.rollout.layout import PolicyLayout

# --- the decentralized actor: what rollout workers act with -----------------------------------


class MAPPOActor(NetworkPolicy):
    """A masked-softmax policy of one agent's observation (its one-hot included when shared).

    Exploring samples from the masked softmax; `explore=False` takes its argmax. Extras: `logp`,
    the log-probability of the chosen action.
    """

    def __init__(self, obs_size: int, num_actions: int, hidden: tuple[int, ...]):
        super().__init__(obs_size, num_actions)
        self.actor = mlp(obs_size, hidden, num_actions, Tanh)
        # Orthogonal init, and a tiny output layer so the first policy is close to uniform.
        for layer in self.actor:
            if isinstance(layer, nn.Linear):
                nn.init.orthogonal_(layer.weight, gain=np.sqrt(2))
                nn.init.zeros_(layer.bias)
        nn.init.orthogonal_(self.actor[-1].weight, gain=0.01)

    def logits(self, obs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_logits(self.actor(obs), mask)

    def act(self, obs, mask, explore, generator):
        obs_t, mask_t = self._tensors(obs, mask)
        with torch.inference_mode():
            log_probs = log_softmax(self.logits(obs_t, mask_t))
        if explore:
            action = sample_rows(log_probs.double().exp().numpy(), generator)
        else:
            action = masked_argmax(log_probs, mask_t).numpy()
        return action, {"logp": log_probs.numpy()[np.arange(len(action)), action]}

    def action_probs(self, obs, mask):
        obs_t, mask_t = self._tensors(obs, mask)
        with torch.inference_mode():
            return torch.softmax(self.logits(obs_t, mask_t).double(), dim=-1).numpy()

    def log_prob_and_entropy(self, obs, mask, action) -> tuple[torch.Tensor, torch.Tensor]:
        """The actions' log-probabilities [B] and the mean entropy: what the surrogate needs."""
        log_probs = log_softmax(self.logits(obs, mask))
        logp = log_probs.gather(1, action[:, None]).squeeze(1)
        # Illegal actions have probability exactly 0 and a finite log-probability: they add 0.
        return logp, -(log_probs.exp() * log_probs).sum(dim=-1).mean()


class GaussianMAPPOActor(MAPPOActor):
    """The actor for continuous actions in `box`: its outputs are a Gaussian's means, its log
    standard deviations learned apart from the state (`rl.gaussian`). Masks have width 0."""

    def __init__(self, obs_size: int, box: Box, hidden: tuple[int, ...]):
        super().__init__(obs_size, box.size, hidden)  # one output per action entry: the means
        self.num_actions = 0  # the width of its masks
        self.log_std = gaussian.learned_log_std(box.size)

    def act(self, obs, mask, explore, generator):
        obs_t, _ = self._tensors(obs, mask)
        with torch.inference_mode():
            action, logp = gaussian.sample(self.actor(obs_t), self.log_std, explore, generator)
        return action, {"logp": logp}

    def action_probs(self, obs, mask):
        raise gaussian.no_action_probs()

    def log_prob_and_entropy(self, obs, mask, action):
        return gaussian.log_prob(self.actor(obs), self.log_std, action), gaussian.entropy(self.log_std)


def make_actor(obs_size: int, num_actions: int, box: Box | None, hidden: tuple[int, ...]) -> MAPPOActor:
    """A policy id's actor: a masked softmax over `num_actions`, or a Gaussian in `box`."""
    return MAPPOActor(obs_size, num_actions, hidden) if box is None else GaussianMAPPOActor(obs_size, box, hidden)


# --- the centralized critic: global state (+ agent one-hot) -> value ---------------------------


class CentralCritic(nn.Module):
    """V(s, agent) for the `num_agents` agents of one policy id.

    `forward(state)` takes states [..., S] and returns [num_agents, ...]: every agent's value of
    every state. With more than one agent, agent k's input is the state followed by one-hot(k).
    """

    def __init__(self, state_size: int, num_agents: int, hidden: tuple[int, ...]):
        super().__init__()
        self.num_agents = num_agents
        self.input_size = state_size + (num_agents if num_agents > 1 else 0)
        self.net = mlp(self.input_size, hidden, 1, Tanh)
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                nn.init.orthogonal_(layer.weight, gain=np.sqrt(2))
                nn.init.zeros_(layer.bias)
        nn.init.orthogonal_(self.net[-1].weight, gain=1.0)

    def inputs(self, state: torch.Tensor) -> torch.Tensor:
        """[..., S] -> [num_agents, ..., input_size]."""
        n = self.num_agents
        x = state.expand(n, *state.shape)
        if n > 1:
            ids = torch.eye(n).view(n, *[1] * (state.dim() - 1), n).expand(n, *state.shape[:-1], n)
            x = torch.cat([x, ids], dim=-1)
        return x

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.net(self.inputs(state)).squeeze(-1)


# --- value normalization -----------------------------------------------------------------------


class RunningMeanStd:
    """Mean and variance of every return seen so far (Chan et al.'s parallel update).

    Plain floats, so a checkpoint holds them exactly. Disabled, it is the identity.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.mean, self.var, self.count = 0.0, 1.0, 0.0

    @property
    def std(self) -> float:
        return float(np.sqrt(max(self.var, 1e-8)))

    def update(self, values: np.ndarray) -> None:
        if not self.enabled or len(values) == 0:
            return
        mean, var, count = float(values.mean()), float(values.var()), float(len(values))
        if self.count == 0:
            self.mean, self.var, self.count = mean, var, count
            return
        delta, total = mean - self.mean, self.count + count
        m2 = self.var * self.count + var * count + delta**2 * self.count * count / total
        self.mean, self.var, self.count = self.mean + delta * count / total, m2 / total, total

    def normalize(self, values):
        return (values - self.mean) / self.std if self.enabled else values

    def denormalize(self, values):
        return values * self.std + self.mean if self.enabled else values

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), float(state["count"])


# --- the learner -------------------------------------------------------------------------------


def _streams(array: np.ndarray) -> np.ndarray:
    """[n, T, E, ...] -> [n*E*T, ...]: rows grouped by agent, then copy, in time order within each
    (agent, copy): the time-ordered streams that GAE runs along."""
    n, t, e = array.shape[:3]
    return np.swapaxes(array, 1, 2).reshape(n * e * t, *array.shape[3:])  # -1 is ambiguous for empty masks


class MAPPOLearner:
    """Actors (`.policies`), centralized critics, one Adam per policy id (actor and critic as two
    parameter groups) and the critics' value normalizers."""

    def __init__(self, layout: PolicyLayout, state_size: int, config: MAPPOConfig):
        self.layout, self.state_size, self.config = layout, state_size, config
        with torch.random.fork_rng(devices=[]):  # seeded initialisation without touching global state
            torch.manual_seed(config.seed)
            self.policies: dict[str, MAPPOActor] = {}
            self.critics: dict[str, CentralCritic] = {}
            for policy, agents in layout.groups.items():
                box = layout.action_boxes.get(policy)
                self.policies[policy] = make_actor(
                    layout.obs_size[policy], layout.num_actions[policy], box, config.hidden
                )
                self.critics[policy] = CentralCritic(state_size, len(agents), config.critic_hidden)
        critic_lr = config.critic_lr or config.lr
        self.optimizers = {
            p: torch.optim.Adam(
                [
                    {"params": self.policies[p].parameters(), "lr": config.lr},
                    {"params": self.critics[p].parameters(), "lr": critic_lr},
                ],
                eps=1e-5,
                fused=True,  # fused: faster on CPU
            )
            for p in layout.groups
        }
        self.value_norms = {p: RunningMeanStd(config.value_norm) for p in layout.groups}
        self.generator = np.random.default_rng(config.seed)
        self.updates = 0

    def values(self, policy: str, state: np.ndarray) -> np.ndarray:
        """Every agent of `policy`'s value (in return units) of states [T, E, S]: [n, T, E]."""
        with torch.no_grad():
            normalized = self.critics[policy](torch.from_numpy(np.asarray(state, np.float32))).numpy()
        return self.value_norms[policy].denormalize(normalized.astype(np.float64))

    def advantages(self, policy: str, batch: JointExperience) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """GAE for every agent of `policy`, each with its own reward: (advantages, returns, values),
        each [n*E*T] in `_streams` order."""
        c, agents = self.config, self.layout.groups[policy]
        n = len(agents)
        value = _streams(self.values(policy, batch.state))
        next_value = _streams(self.values(policy, batch.next_state))
        reward = _streams(np.stack([batch.reward[a] for a in agents]))
        done = _streams(np.broadcast_to(batch.terminated, (n, *batch.terminated.shape)))
        last = batch.truncated.copy()
        last[-1] = True  # the segment's end: continues into the next segment, so bootstrap
        last = _streams(np.broadcast_to(last, (n, *last.shape)))
        advantages, returns = compute_gae(reward, value, next_value, done, last, c.gamma, c.gae_lambda)
        return advantages, returns, value

    def learn(self, batch: JointExperience) -> dict[str, float]:
        """One PPO update per policy id on its agents' rows of the segment; metrics `<policy>/<name>`."""
        batch = batch.float_observations()
        metrics = {}
        for policy in self.layout.groups:
            for name, value in self._learn_policy(policy, batch).items():
                metrics[f"{policy}/{name}"] = value
        self.updates += 1
        return metrics

    def _learn_policy(self, policy: str, batch: JointExperience) -> dict[str, float]:
        c, agents = self.config, self.layout.groups[policy]
        missing = [a for a in agents if "logp" not in batch.extras.get(a, {})]
        if missing:
            raise ValueError(f"MAPPO needs extras 'logp' of {missing}, recorded by MAPPOActor.act")
        advantages, returns, values = self.advantages(policy, batch)
        norm = self.value_norms[policy]
        norm.update(returns)  # then the critic regresses onto returns in the updated units
        targets = norm.normalize(returns)
        if c.normalize_advantages and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

        def rows(name: str) -> torch.Tensor:
            return torch.from_numpy(_streams(np.stack([getattr(batch, name)[a] for a in agents])))

        obs, mask, action = rows("obs"), rows("mask"), rows("action")
        old_logp = torch.from_numpy(_streams(np.stack([batch.extras[a]["logp"] for a in agents])).astype(np.float32))
        critic_inputs = self.critics[policy].inputs(torch.from_numpy(batch.state))  # [n, T, E, S(+n)]
        critic_inputs = critic_inputs.transpose(1, 2).reshape(-1, critic_inputs.shape[-1])
        advantages = torch.from_numpy(advantages.astype(np.float32))
        targets = torch.from_numpy(targets.astype(np.float32))

        totals: dict[str, list[float]] = {}
        for _ in range(c.epochs):
            order = self.generator.permutation(len(action))
            for start in range(0, len(order), c.minibatch_size):
                index = torch.from_numpy(order[start : start + c.minibatch_size])
                step = self._gradient_step(
                    policy,
                    obs[index],
                    mask[index],
                    action[index],
                    old_logp[index],
                    advantages[index],
                    critic_inputs[index],
                    targets[index],
                )
                for name, number in step.items():
                    totals.setdefault(name, []).append(number)
        metrics = {name: float(np.mean(numbers)) for name, numbers in totals.items()}
        variance = float(returns.var())
        metrics["value"] = float(values.mean())
        metrics["explained_variance"] = 1.0 - float((returns - values).var()) / variance if variance > 0 else 0.0
        return metrics

    def _gradient_step(
        self, policy, obs, mask, action, old_logp, advantages, critic_inputs, targets
    ) -> dict[str, float]:
        c = self.config
        actor, critic = self.policies[policy], self.critics[policy]
        logp, entropy = actor.log_prob_and_entropy(obs, mask, action)
        log_ratio = logp - old_logp
        ratio = log_ratio.exp()
        policy_loss = -torch.min(ratio * advantages, ratio.clamp(1 - c.clip, 1 + c.clip) * advantages).mean()
        value_loss = 0.5 * (critic.net(critic_inputs).squeeze(-1) - targets).pow(2).mean()
        loss = policy_loss - c.entropy_coef * entropy + c.value_coef * value_loss

        optimizer = self.optimizers[policy]
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(actor.parameters(), c.max_grad_norm)
        torch.nn.utils.clip_grad_norm_(critic.parameters(), c.max_grad_norm)
        optimizer.step()
        return step_metrics(loss, policy_loss, value_loss, entropy, ratio, log_ratio, c.clip)

    def state_dict(self) -> dict:
        """Everything needed to resume exactly: networks, optimizers, value statistics, RNG, counter."""
        return {
            "policies": {p: actor.state_dict() for p, actor in self.policies.items()},
            "critics": {p: critic.state_dict() for p, critic in self.critics.items()},
            "optimizers": {p: optimizer.state_dict() for p, optimizer in self.optimizers.items()},
            "value_norms": {p: norm.state_dict() for p, norm in self.value_norms.items()},
            "generator": self.generator.bit_generator.state,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        for p in self.layout.groups:
            self.policies[p].load_state_dict(state["policies"][p])
            self.critics[p].load_state_dict(state["critics"][p])
            self.optimizers[p].load_state_dict(state["optimizers"][p])
            self.value_norms[p].load_state_dict(state["value_norms"][p])
        self.generator.bit_generator.state = state["generator"]
        self.updates = int(state["updates"])


MAPPO = MARLAlgorithm(MAPPOConfig, MAPPOLearner)
