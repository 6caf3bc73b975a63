"""Best responses learned by reinforcement learning (DQN, PPO) against the opponents' mixture,
on any environment the rollout workers can step.

MALib's split of training and rollout: the learner trains in its own task, the rollout workers
(Ray actors) play, and the pool's weight store (`marl_core.rollout.weight_store`) carries the
learner's weights to them. One round:

1. the learner pushes its weights to the store;
2. it hands each rollout worker its share of the round's episodes (the learner's network on
   every agent of its role, on every other role a population member drawn by its meta-strategy
   at the start of each episode), and the workers play them in parallel;
3. it learns from the round's experience, and plays the next round.

Each round is played by the weights the round before it learned, so nothing could overlap a
collector beside the learner: the learner drives the workers itself, in one task (a response is
one Prefect task, and one process). A round is defined by its index alone (its episodes, seeds
and split over the workers), so a retried response learns what its failed attempt would have.

The network joins its population as a `NeuralPolicy`. Where the game tree fits (and the config
asks for it) it also carries its table, the action distribution its network gives at every
information state (`marl_core.policies.tabularize`), so exact payoffs and exact NashConv stay
available and the value reported is the response's exact value against the mixture.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid

import numpy as np
import torch

from marl_core.empirical_game.game import PSROGame, psro_game_of
from marl_core.policies.neural import NeuralPolicy
from marl_core.psro.oracle_call import BestResponse, OracleCall, TrainingGames
from marl_core.rl import ALGORITHMS, Experience
from marl_core.rl.optimizers import load_keeping_hyperparameters
from marl_core.rollout.progress import Work
from marl_core.rollout.worker import AlgorithmPolicy, LearnerSpec, PolicyMixture, RolloutRequest, RolloutResult


def mixtures(populations, meta_strategy, game: PSROGame, skip: int | None = None) -> dict[str, PolicyMixture]:
    """Every role's population as the mixture its meta-strategy defines (but role `skip`)."""
    return {
        role: PolicyMixture(tuple(population.members), np.asarray(meta_strategy[r], dtype=np.float64))
        for r, (role, population) in enumerate(zip(game.roles, populations))
        if r != skip
    }


@dataclasses.dataclass(frozen=True)
class Rounds:
    """A response's training rounds, as both halves of the loop derive them from its call."""

    name: str  # the response's stage, iteration, role and seed key: its progress and its weights' key
    label: str  # what its progress is shown as
    game: PSROGame
    role: str
    opponents: dict[str, PolicyMixture]
    seed: tuple[int, ...]
    budget: int  # training episodes in all
    per_round: int
    opponent_epsilon: float

    @classmethod
    def of(cls, call: OracleCall) -> Rounds:
        config = call.config
        game = psro_game_of(config)
        role = game.roles[call.role]
        return cls(
            name="/".join(map(str, (call.stage, call.iteration, role, *call.seed_key))),
            label=f"{call.purpose} {role} ({call.stage} {call.iteration})",
            game=game,
            role=role,
            opponents=mixtures(call.populations, call.meta_strategy, game, skip=call.role),
            seed=(config.seed, call.iteration, call.role, *call.seed_key),
            budget=call.budget or config.best_response.episodes,
            per_round=config.best_response.episodes_per_round,
            opponent_epsilon=call.opponent_epsilon,
        )

    @property
    def work(self) -> Work:
        """The response's training episodes as progress, under its name."""
        return Work(self.name, self.label, self.budget, "episodes")

    @property
    def count(self) -> int:
        return math.ceil(self.budget / self.per_round)

    def requests(self, learner: LearnerSpec, round_index: int, workers: int) -> list[RolloutRequest]:
        """Round `round_index`'s episodes split over `workers`, each share seeded by its round and worker."""
        if not 0 <= round_index < self.count:
            raise ValueError(
                f"{self.name}: round {round_index} asked for, the response has rounds 0 to {self.count - 1}"
            )
        shares = np.array_split(np.arange(min(self.per_round, self.budget - round_index * self.per_round)), workers)
        return [
            RolloutRequest(
                roles=self.game.mapping,
                populations=self.opponents,
                episodes=len(share),
                seed=(*self.seed, round_index, worker),
                learners={self.role: learner},
                weights_version=round_index,
                opponent_epsilon=self.opponent_epsilon,
            )
            for worker, share in enumerate(shares)
            if len(share)
        ]


@dataclasses.dataclass(frozen=True)
class RoundExperience:
    """A round as the workers played it: its transitions, the learner role's return per episode,
    each episode's draws from the opponents' mixtures and every agent's return (each one entry
    per request, in request order), and the environment steps taken.

    The transitions stay one array per request: on Ray they arrive from the object store as
    read-only arrays, and their concatenation is the writable batch a trainer expects."""

    experience: list[Experience]
    returns: list[np.ndarray]
    draws: list[np.ndarray]
    episode_returns: list[np.ndarray]
    env_steps: int

    @classmethod
    def of(cls, results: list[RolloutResult], rounds: Rounds) -> RoundExperience:
        return cls(
            experience=[r.experience[rounds.role] for r in results],
            returns=[role_returns(r.episode_returns, rounds.game, rounds.role) for r in results],
            draws=[r.draws for r in results],
            episode_returns=[r.episode_returns for r in results],
            env_steps=sum(r.env_steps for r in results),
        )


# --- the learner ------------------------------------------------------------------------------


class ResponseLearner:
    """A learned response in progress: its trainer, and what the rounds it learned from gave.

    The sequential oracle (`train_best_response`) plays it every round of one response; Pipeline
    PSRO (`marl_core.psro.pipeline`) keeps one per active level and role, feeding it rounds
    window by window against a mixture that changes between windows. Both play the rounds by
    index, so a response learned in one go or in windows against the same mixture is the same.
    """

    def __init__(self, call: OracleCall):
        torch.set_num_threads(1)
        self.started = time.perf_counter()
        self.call, config = call, call.config
        self.rounds = Rounds.of(call)
        game = self.rounds.game
        self.algorithm_name = config.oracle
        # Each response starts from its own reproducible network initialisation.
        seed = int(
            np.random.SeedSequence([config.seed, call.iteration, call.role, *call.seed_key]).generate_state(1)[0]
        )
        self.algorithm_config = config.oracle_settings.model_copy(update={"seed": seed})
        self.trainer = ALGORITHMS[config.oracle].trainer(
            game.obs_size[self.rounds.role], game.num_actions[self.rounds.role], self.algorithm_config
        )
        if call.trainer_state is not None:  # a league player goes on, under its settings now (PBT may change them)
            load_keeping_hyperparameters(self.trainer, call.trainer_state)
        # Weights under a key of this attempt's own: a worker keeps the newest version of a key it
        # has seen, so a retried attempt's round 0 must not look older than the failed one's round 3.
        self.spec = LearnerSpec(
            key=f"{self.rounds.name}/{uuid.uuid4().hex[:8]}",
            build=AlgorithmPolicy(config.oracle, self.algorithm_config),
        )
        self.rounds_learned = self.episodes = self.env_steps = 0
        self.returns, self.draws, self.episode_returns = [], [], []  # one entry per request, in order

    @property
    def done(self) -> bool:
        """Every round of its budget learned."""
        return self.rounds_learned >= self.rounds.count

    def learn(self, batch: RoundExperience) -> None:
        self.trainer.learn(Experience.concat(batch.experience))
        self.rounds_learned += 1
        self.episodes += sum(len(r) for r in batch.returns)
        self.env_steps += batch.env_steps
        self.returns.extend(batch.returns)
        self.draws.extend(batch.draws)
        self.episode_returns.extend(batch.episode_returns)

    def play_and_learn(self, pool, rounds: Rounds) -> None:
        """Publish the weights that play the next round, have the pool's workers play it against
        `rounds`' mixture, and learn from it."""
        pool.push(self.spec.key, self.rounds_learned, self.trainer.policy.get_weights())
        requests = rounds.requests(self.spec, self.rounds_learned, pool.size)
        self.learn(RoundExperience.of(pool.collect(requests, progress=rounds.name), rounds))

    def recent_return(self) -> float:
        """The mean return over the last tenth of its training."""
        return float(np.concatenate(self.returns[-max(1, len(self.returns) // 10) :]).mean())

    def member(self, table: np.ndarray | None = None) -> NeuralPolicy:
        """The network as it is now, as a population member (with `table`, its tabular form, if given)."""
        return NeuralPolicy.of(self.algorithm_name, self.algorithm_config, self.trainer.policy, table)

    def response(self, call: OracleCall | None = None) -> BestResponse:
        """The response as it stands, valued against `call`'s mixture (default its own)."""
        call = call or self.call
        game = self.rounds.game
        metrics = {
            "episodes": float(self.episodes),
            "env_steps": float(self.env_steps),
            "training_return": self.recent_return(),
        }
        table, value = None, None
        if game.has_tree:  # reported wherever a tree exists; the member keeps its table if asked to
            table, value, gap = _tabular_form(call.config.game, call, self.trainer.policy)
            metrics.update(value=value, gap_to_exact=gap)  # gap: how far from a true best response it stayed
            if not call.config.tabularize:
                table = None
        metrics["seconds"] = time.perf_counter() - self.started
        member = self.member(table)
        if not call.report_training:
            return BestResponse(role=call.role, policy=member, value=value, metrics=metrics)
        games = TrainingGames(np.concatenate(self.draws), np.concatenate(self.episode_returns))
        return BestResponse(call.role, member, value, metrics, trainer_state=self.trainer.state_dict(), games=games)


def train_best_response(call: OracleCall) -> BestResponse:
    """The learned oracle: a network trained round by round on what the pool's workers play."""
    learner, pool = ResponseLearner(call), call.pool
    try:
        with pool.tracking(learner.rounds.work):
            while not learner.done:
                learner.play_and_learn(pool, learner.rounds)
    finally:
        pool.drop(learner.spec.key)
    return learner.response()


def role_returns(episode_returns: np.ndarray, game: PSROGame, role: str) -> np.ndarray:
    """[episodes] a role's return per episode: the mean of its agents' returns."""
    columns = [i for i, agent in enumerate(game.agents) if game.mapping(agent) == role]
    return episode_returns[:, columns].mean(axis=1)


def _tabular_form(game_string: str, call: OracleCall, network):
    """The network's table, its exact value against the mixture, and its gap to the exact best response."""
    from marl_core.games.exploitability import mixed_reach
    from marl_core.games.tree import best_response, build_tree, profile_values, sequence_reach
    from marl_core.policies.tabularize import tabular_forms, tabularize

    tree = build_tree(game_string)
    table = tabularize(network, tree, call.role)
    reaches = mixed_reach(tree, tabular_forms(call.populations, tree), call.meta_strategy)
    exact_best = best_response(tree, call.role, reaches)[0]
    reaches[call.role] = sequence_reach(tree.players[call.role], table[None])[0]
    value = float(profile_values(tree, reaches)[call.role])
    return table, value, exact_best - value


def estimate_value(
    pool, game: PSROGame, role_index: int, policy, populations, meta_strategy, *, episodes: int, seed
) -> tuple[float, float]:
    """Mean and standard error of `policy`'s return in role `role_index` against the others'
    mixture, from `episodes` episodes split over the pool's workers."""
    role = game.roles[role_index]
    fixed = {role: PolicyMixture((policy,), np.ones(1))}
    others = mixtures(populations, meta_strategy, game, skip=role_index)
    shares = np.array_split(np.arange(episodes), pool.size)
    requests = [
        RolloutRequest(
            roles=game.mapping,
            populations={**others, **fixed},
            episodes=len(share),
            seed=(*seed, worker),
            explore=False,
        )
        for worker, share in enumerate(shares)
        if len(share)
    ]
    values = np.concatenate([role_returns(r.episode_returns, game, role) for r in pool.collect(requests)])
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{game.name}: a non-finite return while estimating role {role!r}'s value")
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values)))
