"""Population members on disk (and in MLflow's artifact store) as weights only, never pickles.

A member is a folder:

- `policy.json`: a tabular policy (or a network's tabular form) as information-state string ->
  action probabilities, the format OpenSpiel-side tools read;
- `uniform.json`: the uniform policy over legal actions, which has no weights;
- `network.json` + `weights.pt`: a network member's description (algorithm, settings, sizes) and
  its state_dict, which `torch.load(weights_only=True)` reads: a checkpoint from someone else
  cannot run code.
"""

from __future__ import annotations

import json
from pathlib import Path

from marl_core.policies.base import Policy, UniformPolicy
from marl_core.policies.neural import NeuralPolicy
from marl_core.policies.tabular import TabularPolicy, policy_from_dict, policy_to_dict

TABLE_FILE = "policy.json"
UNIFORM_FILE = "uniform.json"
NETWORK_FILE = "network.json"
WEIGHTS_FILE = "weights.pt"


def save_policy(directory, policy: Policy, game: str | None = None, player: int | None = None) -> None:
    """Write `policy` into `directory`; a network's tabular form needs its `game` and `player`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(policy, TabularPolicy):
        game, player = policy.game, policy.player
    if isinstance(policy, UniformPolicy):
        (directory / UNIFORM_FILE).write_text(json.dumps(policy.description()))
    if policy.tabular is not None:
        from marl_core.games.tree import build_tree

        table = policy_to_dict(build_tree(game).players[player], policy.tabular)
        (directory / TABLE_FILE).write_text(json.dumps(table))
    if isinstance(policy, NeuralPolicy):
        import torch

        (directory / NETWORK_FILE).write_text(json.dumps(policy.description(), indent=2))
        torch.save({k: v.detach().cpu() for k, v in policy.weights().items()}, directory / WEIGHTS_FILE)


def load_policy(directory, game: str | None = None, player: int | None = None) -> Policy:
    """The member `save_policy` wrote; a table is read only when `game` and `player` are given."""
    directory = Path(directory)
    if (directory / UNIFORM_FILE).exists():
        return UniformPolicy()
    table = None
    if (directory / TABLE_FILE).exists() and game is not None:
        from marl_core.games.tree import build_tree

        table = policy_from_dict(build_tree(game).players[player], json.loads((directory / TABLE_FILE).read_text()))
    if not (directory / NETWORK_FILE).exists():
        if table is None:
            raise ValueError(f"{str(directory)!r} holds neither a network ({NETWORK_FILE}) nor a table for {game!r}")
        return TabularPolicy(game, player, table)
    return load_network(directory, table)


def load_network(directory, table=None) -> NeuralPolicy:
    import torch

    from marl_core.rl import acting_networks

    directory = Path(directory)
    description = json.loads((directory / NETWORK_FILE).read_text())
    algorithm = description.get("algorithm")
    if algorithm not in acting_networks():
        raise ValueError(
            f"checkpoint {str(directory)!r} names unknown algorithm {algorithm!r}; known: "
            f"{', '.join(acting_networks())}"
        )
    policy = NeuralPolicy(
        algorithm, description["config"], description["obs_size"], description["num_actions"], table=table
    )
    return policy.load_weights(torch.load(directory / WEIGHTS_FILE, weights_only=True))
