"""Loading a training state into a learner built with other hyperparameters.

PBT's exploit gives a member another's whole training state (networks, optimizer moments,
buffers) under hyperparameters of its own, and a league player's learner is rebuilt each
generation from its settings, which PBT may have changed. Loading an optimizer's state also
loads its param groups' hyperparameters (learning rate, ...), so they are put back after.
"""

from __future__ import annotations


def load_keeping_hyperparameters(learner, state: dict) -> None:
    """`learner.load_state_dict(state)`, but every optimizer keeps the hyperparameters (learning
    rate, ...) it was built with: loading an optimizer's state also loads its param groups'."""
    optimizers = _optimizers(learner)
    kept = [[{k: v for k, v in group.items() if k != "params"} for group in o.param_groups] for o in optimizers]
    learner.load_state_dict(state)
    for optimizer, groups in zip(optimizers, kept):
        for group, values in zip(optimizer.param_groups, groups):
            group.update(values)


def _optimizers(learner) -> list:
    import torch

    found = []
    for value in vars(learner).values():
        candidates = value.values() if isinstance(value, dict) else [value]
        found.extend(o for o in candidates if isinstance(o, torch.optim.Optimizer))
    return found
