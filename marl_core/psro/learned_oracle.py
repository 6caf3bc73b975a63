"""Best responses learned by reinforcement learning (DQN, PPO) against the opponents' mixture.

The learner loop, one round at a time:

1. push the current weights to the pool's parameter store;
2. every rollout worker plays its share of the round's episodes: the learner's network on the
   player's seat, and on every other seat a population member drawn by its meta-strategy at the
   start of each episode;
3. the trainer learns from the round's experience.

The learned network then joins the population as a tabular policy: its action distribution at
every information state (`marl_core.games.tabularize`). That keeps exact payoffs, exact NashConv and
the OpenSpiel-checkable export available for learned populations, and the value reported for
the response is its exact value against the mixture, not a training estimate.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from marl_core.games.exploitability import mixed_reach
from marl_core.games.tree import GameTree, best_response, profile_values, sequence_reach
from marl_core.rl import ALGORITHMS, Experience
from marl_core.rollout.worker import LearnerSpec, RolloutRequest, TabularPopulation
from marl_core.games.tabularize import infostate_observations, tabularize


def agent_id(player: int) -> str:
    return f"player_{player}"


def train_best_response(config, tree: GameTree, player: int, populations, meta_strategy, *, iteration: int, pool):
    """Learn a response for `player`; returns (tabular policy, exact value, weights, metrics)."""
    torch.set_num_threads(1)
    started = time.perf_counter()
    algorithm = ALGORITHMS[config.oracle]
    # Each response starts from its own reproducible network initialisation.
    seed = int(np.random.SeedSequence([config.seed, iteration, player]).generate_state(1)[0])
    algorithm_config = getattr(config, config.oracle).model_copy(update={"seed": seed})
    obs_size = infostate_observations(tree.game_string)[player].shape[1]
    trainer = algorithm.trainer(obs_size, tree.num_actions, algorithm_config)
    learner = LearnerSpec(key=f"iteration{iteration}/player{player}", algorithm=config.oracle, config=algorithm_config)
    opponents = {
        agent_id(q): TabularPopulation(tree.game_string, q, np.asarray(populations[q]), np.asarray(meta_strategy[q]))
        for q in range(tree.num_players)
        if q != player
    }
    budget = config.best_response
    rounds = math.ceil(budget.episodes / budget.episodes_per_round)
    episodes = env_steps = 0
    returns = []
    for round_index in range(rounds):
        pool.push(learner.key, round_index, trainer.policy.get_weights())
        round_episodes = min(budget.episodes_per_round, budget.episodes - episodes)
        shares = np.array_split(np.arange(round_episodes), pool.size)
        requests = [
            RolloutRequest(
                learner=learner,
                learner_agents=(agent_id(player),),
                opponents=opponents,
                episodes=len(share),
                seed=(config.seed, iteration, player, round_index, worker),
                weights_version=round_index,
            )
            for worker, share in enumerate(shares)
            if len(share)
        ]
        results = pool.collect(requests)
        experience = Experience.concat([r.experience for r in results])
        trainer.learn(experience)
        episodes += sum(len(r.episode_returns) for r in results)
        env_steps += sum(r.env_steps for r in results)
        returns.extend(r.episode_returns[:, player] for r in results)
    pool.drop(learner.key)

    policy = tabularize(trainer.policy, tree, player)
    reaches = mixed_reach(tree, populations, meta_strategy)
    value = exact_value(tree, player, policy, reaches)
    exact_best = best_response(tree, player, reaches)[0]
    recent = np.concatenate(returns[-max(1, len(returns) // 10):])
    metrics = {
        "value": value,
        "gap_to_exact": exact_best - value,  # how far from a true best response it stayed
        "episodes": float(episodes),
        "env_steps": float(env_steps),
        "training_return": float(recent.mean()),
        "seconds": time.perf_counter() - started,
    }
    return policy, value, trainer.policy.get_weights(), metrics


def exact_value(tree: GameTree, player: int, policy: np.ndarray, reaches: list[np.ndarray]) -> float:
    """The exact expected return of `policy` for `player` against the others' mixture
    (`reaches`: every player's mixed sequence reach, as `mixed_reach` gives)."""
    reaches = list(reaches)
    reaches[player] = sequence_reach(tree.players[player], policy[None])[0]
    return float(profile_values(tree, reaches)[player])
