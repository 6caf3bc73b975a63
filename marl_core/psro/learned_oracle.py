"""Best responses learned by reinforcement learning (DQN, PPO) against the opponents' mixture,
on any environment the rollout workers can step.

The learner loop, one round at a time:

1. push the current weights to the pool's parameter store;
2. every rollout worker plays its share of the round's episodes: the learner's network on every
   agent of its role, and on every other role a population member drawn by its meta-strategy at
   the start of each episode;
3. the trainer learns from the round's experience.

The network joins its population as a `NeuralPolicy`. Where the game tree fits (and the config
asks for it) it also carries its table, the action distribution its network gives at every
information state (`marl_core.games.tabularize`), so exact payoffs and exact NashConv stay
available and the value reported is the response's exact value against the mixture.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from marl_core.policies.neural import NeuralPolicy
from marl_core.psro.game import PSROGame, psro_game_of
from marl_core.psro.oracles import BestResponse, OracleCall
from marl_core.rl import ALGORITHMS, Experience
from marl_core.rollout.worker import LearnerSpec, PolicyMixture, RolloutRequest


def mixtures(populations, meta_strategy, game: PSROGame, skip: int | None = None) -> dict[str, PolicyMixture]:
    """Every role's population as the mixture its meta-strategy defines (but role `skip`)."""
    return {
        role: PolicyMixture(tuple(population.members), np.asarray(meta_strategy[r], dtype=np.float64))
        for r, (role, population) in enumerate(zip(game.roles, populations))
        if r != skip
    }


def train_best_response(call: OracleCall) -> BestResponse:
    torch.set_num_threads(1)
    started = time.perf_counter()
    config, pool = call.config, call.pool
    game = psro_game_of(config)
    role = game.roles[call.role]
    algorithm = ALGORITHMS[config.oracle]
    # Each response starts from its own reproducible network initialisation.
    seed = int(np.random.SeedSequence([config.seed, call.iteration, call.role, *call.seed_key]).generate_state(1)[0])
    algorithm_config = getattr(config, config.oracle).model_copy(update={"seed": seed})
    trainer = algorithm.trainer(game.obs_size[role], game.num_actions[role], algorithm_config)
    key = "/".join(map(str, ("iteration", call.iteration, role, *call.seed_key)))
    learner = LearnerSpec(key=key, algorithm=config.oracle, config=algorithm_config)
    opponents = mixtures(call.populations, call.meta_strategy, game, skip=call.role)
    budget = call.budget or config.best_response.episodes
    per_round = config.best_response.episodes_per_round
    episodes = env_steps = 0
    returns = []
    for round_index in range(math.ceil(budget / per_round)):
        pool.push(learner.key, round_index, trainer.policy.get_weights())
        shares = np.array_split(np.arange(min(per_round, budget - episodes)), pool.size)
        requests = [
            RolloutRequest(
                roles=game.mapping,
                populations=opponents,
                episodes=len(share),
                seed=(config.seed, call.iteration, call.role, *call.seed_key, round_index, worker),
                learner=learner,
                learner_role=role,
                weights_version=round_index,
            )
            for worker, share in enumerate(shares)
            if len(share)
        ]
        results = pool.collect(requests)
        trainer.learn(Experience.concat([r.experience for r in results]))
        episodes += sum(len(r.episode_returns) for r in results)
        env_steps += sum(r.env_steps for r in results)
        returns.extend(role_returns(r.episode_returns, game, role) for r in results)
    pool.drop(learner.key)

    recent = np.concatenate(returns[-max(1, len(returns) // 10):])
    metrics = {"episodes": float(episodes), "env_steps": float(env_steps), "training_return": float(recent.mean())}
    table, value = None, None
    if config.tabularize and game.has_tree:
        table, value, gap = _tabular_form(config.game, call, trainer.policy)
        metrics.update(value=value, gap_to_exact=gap)  # gap: how far from a true best response it stayed
    metrics["seconds"] = time.perf_counter() - started
    member = NeuralPolicy.of(config.oracle, algorithm_config, trainer.policy, table)
    return BestResponse(role=call.role, policy=member, value=value, metrics=metrics)


def role_returns(episode_returns: np.ndarray, game: PSROGame, role: str) -> np.ndarray:
    """[episodes] a role's return per episode: the mean of its agents' returns."""
    columns = [i for i, agent in enumerate(game.agents) if game.mapping(agent) == role]
    return episode_returns[:, columns].mean(axis=1)


def _tabular_form(game_string: str, call: OracleCall, network):
    """The network's table, its exact value against the mixture, and its gap to the exact best response."""
    from marl_core.games.exploitability import mixed_reach
    from marl_core.games.tabularize import tabularize
    from marl_core.games.tree import best_response, build_tree, profile_values, sequence_reach
    from marl_core.policies.population import stacked_tables

    tree = build_tree(game_string)
    table = tabularize(network, tree, call.role)
    reaches = mixed_reach(tree, stacked_tables(call.populations), call.meta_strategy)
    exact_best = best_response(tree, call.role, reaches)[0]
    reaches[call.role] = sequence_reach(tree.players[call.role], table[None])[0]
    value = float(profile_values(tree, reaches)[call.role])
    return table, value, exact_best - value


def estimate_value(pool, game: PSROGame, role_index: int, policy, populations, meta_strategy, *, episodes: int, seed) -> tuple[float, float]:
    """Mean and standard error of `policy`'s return in role `role_index` against the others'
    mixture, from `episodes` episodes split over the pool's workers."""
    role = game.roles[role_index]
    fixed = {role: PolicyMixture((policy,), np.ones(1))}
    others = mixtures(populations, meta_strategy, game, skip=role_index)
    shares = np.array_split(np.arange(episodes), pool.size)
    requests = [
        RolloutRequest(roles=game.mapping, populations={**others, **fixed}, episodes=len(share), seed=(*seed, worker), explore=False)
        for worker, share in enumerate(shares)
        if len(share)
    ]
    values = np.concatenate([role_returns(r.episode_returns, game, role) for r in pool.collect(requests)])
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{game.name}: a non-finite return while estimating role {role!r}'s value")
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values)))
