"""Network checkpoints that load without unpickling: weights in torch's safe format, spec in JSON.

A learned population member is stored as two files: `weights.pt`, a plain state_dict of tensors
that `torch.load(weights_only=True)` reads (it refuses arbitrary objects, so a checkpoint from
someone else cannot run code), and `network.json`, which names the algorithm, its
hyperparameters and the input/output sizes needed to rebuild the network around the weights.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

WEIGHTS_FILE = "weights.pt"
SPEC_FILE = "network.json"


@dataclasses.dataclass(frozen=True)
class NetworkSpec:
    algorithm: str  # name in marl_core.rl.ALGORITHMS
    config: dict  # that algorithm's config, as JSON
    obs_size: int
    num_actions: int


def save_network(directory, spec: NetworkSpec, weights: dict[str, torch.Tensor]) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({name: tensor.detach().cpu() for name, tensor in weights.items()}, directory / WEIGHTS_FILE)
    (directory / SPEC_FILE).write_text(json.dumps(dataclasses.asdict(spec), indent=2))


def load_network(directory):
    """Rebuild the policy network stored in `directory` (from `save_network`)."""
    from marl_core.rl import ALGORITHMS

    directory = Path(directory)
    spec = NetworkSpec(**json.loads((directory / SPEC_FILE).read_text()))
    if spec.algorithm not in ALGORITHMS:
        raise ValueError(f"checkpoint {str(directory)!r} names unknown algorithm {spec.algorithm!r}; known: {', '.join(sorted(ALGORITHMS))}")
    algorithm = ALGORITHMS[spec.algorithm]
    policy = algorithm.policy(spec.obs_size, spec.num_actions, algorithm.config(**spec.config))
    policy.set_weights(torch.load(directory / WEIGHTS_FILE, weights_only=True))
    return policy
