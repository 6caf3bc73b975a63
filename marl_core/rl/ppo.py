"""PPO with legal-action masks, read top to bottom: GAE, trainer (hyperparameters: `rl.settings`).

Rollout workers act with `trainer.policy` (an `ActorCriticPolicy`), which records the
log-probability and value of every action in `Experience.extras`. `update(experience)` then:

1. computes advantages with GAE, stream by stream (`compute_gae`): a `done` transition ends the
   return; a `last` one that is not done bootstraps from the critic's value of `next_obs`;
2. runs `epochs` passes of shuffled minibatches over the clipped surrogate objective
   (Schulman et al. 2017), a squared-error value loss and an entropy bonus, with illegal actions
   masked out of every softmax, log-probability and entropy.

With an action box (`envs.api.Box`: continuous actions) the actor is a Gaussian instead
(`GaussianActorCriticPolicy`, `rl.gaussian`); the clipped objective, the critic and GAE are the
same, fed the Gaussian's log-probabilities and entropy.

PPO is on-policy: pass each batch once, collected by the current (or a very recent) policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from marl_core.rl import Algorithm, gaussian
from marl_core.rl.batch import Experience
from marl_core.rl.gradient_steps import LossStep, LossStepTrainer
from marl_core.rl.networks import NatureCNN, Tanh, features, log_softmax, masked_argmax, masked_logits, mlp
from marl_core.rl.policy import NetworkPolicy
from marl_core.rl.sampling import sample_rows
from marl_core.rl.settings import PPOConfig

if TYPE_CHECKING:  # an annotation only: importing marl_core.envs would import every environment source
    from marl_core.envs.api import Box


class ActorCriticPolicy(NetworkPolicy):
    """A masked-softmax actor and a state-value critic, separate or on a shared trunk.

    With `encoder: nature_cnn` the trunk is Mnih et al.'s convolutions over stacked frames
    (`networks.NatureCNN`) followed by the `hidden` layers, always shared: as in every Atari
    actor-critic, two copies of the convolutions would double the cost for no gain.

    Exploring samples from the masked softmax; `explore=False` takes its argmax. Extras: `logp`
    (log-probability of the chosen action) and `value` (critic estimate), which PPO needs from
    the moment of acting.
    """

    def __init__(self, obs_size: int, num_actions: int, config: PPOConfig):
        super().__init__(obs_size, num_actions)
        hidden = config.hidden
        self.shared_trunk = config.shared_trunk or config.encoder == "nature_cnn"
        if config.encoder == "nature_cnn":
            cnn = NatureCNN(obs_size, config.frame_size)
            trunk = nn.Sequential(cnn, features(cnn.out_size, hidden, nn.ReLU))
        elif self.shared_trunk:
            trunk = features(obs_size, hidden, Tanh)
        if self.shared_trunk:
            self.actor = nn.Sequential(trunk, nn.Linear(hidden[-1], num_actions))
            self.critic = nn.Sequential(trunk, nn.Linear(hidden[-1], 1))
        else:
            self.actor = mlp(obs_size, hidden, num_actions, Tanh)
            self.critic = mlp(obs_size, hidden, 1, Tanh)
        self._orthogonal_init()

    def _orthogonal_init(self) -> None:
        """Orthogonal weights, zero biases; a tiny actor output layer so the first policy is
        close to uniform over legal actions (the PPO implementation details of Huang et al.)."""
        for layer in self.modules():
            if isinstance(layer, (nn.Linear, nn.Conv2d)):
                nn.init.orthogonal_(layer.weight, gain=np.sqrt(2))
                nn.init.zeros_(layer.bias)
        nn.init.orthogonal_(self.actor[-1].weight, gain=0.01)
        nn.init.orthogonal_(self.critic[-1].weight, gain=1.0)

    def logits(self, obs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Masked actor logits: illegal actions have probability exactly 0."""
        return masked_logits(self.actor(obs), mask)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's outputs and the values, the shared trunk (if any) run once."""
        if not self.shared_trunk:
            return self.actor(obs), self.value(obs)
        hidden = self.actor[0](obs)
        return self.actor[1](hidden), self.critic[1](hidden).squeeze(-1)

    def logits_and_value(self, obs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outputs, value = self.heads(obs)
        return masked_logits(outputs, mask), value

    def evaluate(self, obs, mask, action) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What PPO's loss needs of a minibatch: the actions' log-probabilities [B], the mean
        entropy and the values [B]."""
        logits, value = self.logits_and_value(obs, mask)
        log_probs = log_softmax(logits)
        logp = log_probs.gather(1, action[:, None]).squeeze(1)
        # Illegal actions have probability exactly 0 and a finite log-probability: they add 0.
        entropy = -(log_probs.exp() * log_probs).sum(dim=-1).mean()
        return logp, entropy, value

    def act(self, obs, mask, explore, generator):
        obs_t, mask_t = self._tensors(obs, mask)
        with torch.inference_mode():
            logits, value = self.logits_and_value(obs_t, mask_t)
            log_probs = log_softmax(logits)
        if explore:
            action = sample_rows(log_probs.double().exp().numpy(), generator)
        else:
            action = masked_argmax(log_probs, mask_t).numpy()
        logp = log_probs.numpy()[np.arange(len(action)), action]
        return action, {"logp": logp, "value": value.numpy()}

    def action_probs(self, obs, mask):
        obs_t, mask_t = self._tensors(obs, mask)
        with torch.inference_mode():
            return torch.softmax(self.logits(obs_t, mask_t).double(), dim=-1).numpy()


class GaussianActorCriticPolicy(ActorCriticPolicy):
    """The actor-critic for continuous actions in `box`: the actor's outputs are the means of a
    Gaussian whose log standard deviations are learned apart from the state (`rl.gaussian`).
    Its masks have width 0 (`num_actions` 0: no discrete actions); extras as the discrete one's."""

    def __init__(self, obs_size: int, box: Box, config: PPOConfig):
        super().__init__(obs_size, box.size, config)  # one output per action entry: the means
        self.num_actions = 0  # the width of its masks
        self.log_std = gaussian.learned_log_std(box.size)

    def act(self, obs, mask, explore, generator):
        obs_t, _ = self._tensors(obs, mask)
        with torch.inference_mode():
            mean, value = self.heads(obs_t)
            action, logp = gaussian.sample(mean, self.log_std, explore, generator)
        return action, {"logp": logp, "value": value.numpy()}

    def action_probs(self, obs, mask):
        raise gaussian.no_action_probs()

    def evaluate(self, obs, mask, action):
        mean, value = self.heads(obs)
        return gaussian.log_prob(mean, self.log_std, action), gaussian.entropy(self.log_std), value


def compute_gae(
    reward: np.ndarray,
    value: np.ndarray,
    next_value: np.ndarray,
    done: np.ndarray,
    last: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates and returns (advantage + value), one backward pass.

    `value[t]` is V(obs[t]); `next_value[t]` is V(next_obs[t]) and is read only where a segment
    ends without termination (`last and not done`); inside a segment V(next_obs[t]) is value[t+1].
    Neither the bootstrap value nor the running advantage crosses a `done` or `last` boundary, so
    concatenated streams do not leak into one another.
    """
    advantages = np.zeros(len(reward), np.float64)
    running = 0.0
    for t in reversed(range(len(reward))):
        if last[t]:
            following_value, running = next_value[t], 0.0
        else:
            following_value = value[t + 1]
        continues = 0.0 if done[t] else 1.0
        delta = reward[t] + gamma * continues * following_value - value[t]
        running = delta + gamma * gae_lambda * continues * running
        advantages[t] = running
    return advantages, advantages + value


class PPOTrainer(LossStepTrainer):
    """Owns the actor-critic (inside `.policy`) and its optimizer; `action_box`: the actions are
    continuous, in that box (a Gaussian actor), and `num_actions` is 0."""

    def __init__(self, obs_size: int, num_actions: int, config: PPOConfig | None = None, action_box: Box | None = None):
        self.config = config = config or PPOConfig()
        with torch.random.fork_rng(devices=[]):  # seeded initialisation without touching global state
            torch.manual_seed(config.seed)
            if action_box is None:
                self.policy = ActorCriticPolicy(obs_size, num_actions, config)
            else:
                self.policy = GaussianActorCriticPolicy(obs_size, action_box, config)
        self.optimizer = torch.optim.Adam(
            self.policy.parameters(), lr=config.lr, eps=1e-5, fused=True
        )  # fused: one kernel for all parameters (docs/performance.md)
        self.generator = np.random.default_rng(config.seed)
        self.updates = 0

    def loss_steps(self, experience: Experience) -> Iterator[LossStep]:
        """The update as losses (`marl_core.rl.gradient_steps`): advantages once, with the critic
        as the batch arrives, then one loss per minibatch of each epoch."""
        c = self.config
        experience.validate()
        if "logp" not in experience.extras or "value" not in experience.extras:
            raise ValueError("PPO needs extras 'logp' and 'value', recorded by ActorCriticPolicy.act")
        advantages, returns = self._advantages(experience)

        obs = torch.from_numpy(experience.obs)
        mask = torch.from_numpy(experience.mask)
        action = torch.from_numpy(experience.action)
        old_logp = torch.from_numpy(experience.extras["logp"].astype(np.float32))
        advantages = torch.from_numpy(advantages.astype(np.float32))
        returns = torch.from_numpy(returns.astype(np.float32))
        for _ in range(c.epochs):
            order = self.generator.permutation(len(experience))
            for start in range(0, len(order), c.minibatch_size):
                index = torch.from_numpy(order[start : start + c.minibatch_size])
                yield self._loss(
                    obs[index], mask[index], action[index], old_logp[index], advantages[index], returns[index]
                )

    def _advantages(self, experience: Experience) -> tuple[np.ndarray, np.ndarray]:
        """GAE with values from acting time and the current critic's values of bootstrap states."""
        c = self.config
        bootstrap = experience.last & ~experience.done
        next_value = np.zeros(len(experience), np.float32)
        if bootstrap.any():
            with torch.no_grad():
                next_value[bootstrap] = self.policy.value(torch.from_numpy(experience.next_obs[bootstrap])).numpy()
        return compute_gae(
            experience.reward,
            experience.extras["value"].astype(np.float64),
            next_value,
            experience.done,
            experience.last,
            c.gamma,
            c.gae_lambda,
        )

    def _loss(self, obs, mask, action, old_logp, advantages, returns) -> LossStep:
        c = self.config
        if c.normalize_advantages and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return clipped_surrogate_loss(self.policy, obs, mask, action, old_logp, advantages, returns, c)

    def state_dict(self) -> dict:
        """Everything needed to resume exactly: networks, optimizer, RNG, counter."""
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.bit_generator.state,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.bit_generator.state = state["generator"]
        self.updates = int(state["updates"])


ALGORITHM = Algorithm(PPOConfig, PPOTrainer, ActorCriticPolicy)


def clipped_surrogate_loss(policy: ActorCriticPolicy, obs, mask, action, old_logp, advantages, returns, c) -> LossStep:
    """PPO's clipped surrogate, a squared-error value loss and an entropy bonus on one minibatch;
    `c` carries `clip`, `value_coef` and `entropy_coef` (PPO's and APPO's settings both do)."""
    logp, entropy, value = policy.evaluate(obs, mask, action)
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    policy_loss = -torch.min(ratio * advantages, ratio.clamp(1 - c.clip, 1 + c.clip) * advantages).mean()
    value_loss = 0.5 * (value - returns).pow(2).mean()
    loss = policy_loss + c.value_coef * value_loss - c.entropy_coef * entropy
    return LossStep(loss, len(action), step_metrics(loss, policy_loss, value_loss, entropy, ratio, log_ratio, c.clip))


def step_metrics(loss, policy_loss, value_loss, entropy, ratio, log_ratio, clip: float) -> dict[str, float]:
    """A PPO gradient step's figures, with the two that say how far the policy moved."""
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # Schulman's low-variance KL estimator
        clip_fraction = ((ratio - 1).abs() > clip).float().mean()
    return {
        "loss": loss.item(),
        "policy_loss": policy_loss.item(),
        "value_loss": value_loss.item(),
        "entropy": entropy.item(),
        "approx_kl": approx_kl.item(),
        "clip_fraction": clip_fraction.item(),
    }
