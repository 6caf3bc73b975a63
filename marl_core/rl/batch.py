"""`Experience`: the one format in which rollout workers hand transitions to trainers.

A batch is a set of *streams* (one per environment copy and agent). Each stream's transitions are
contiguous and in time order, and streams are concatenated one after another. Two flags end
things:

- `done`: the episode terminated at this transition; nothing follows, so no value is bootstrapped
  from `next_obs`.
- `last`: this stream's segment ends here (the worker stopped collecting, or the episode was
  truncated by a time limit). If `done` is False the return continues beyond the segment, so
  on-policy methods bootstrap from the value of `next_obs`.

DQN only needs `done` (each transition stands alone); PPO's GAE needs both.

Actions are discrete indices, legal by their masks, or continuous (`envs.api.Box`): float32
vectors [N, size] with masks of width 0, which only PPO's Gaussian policies learn from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# name -> (dtype, number of dimensions); extras are free-form but must have one row per transition.
_SCHEMA = {
    "obs": (np.float32, 2),
    "mask": (np.bool_, 2),
    "action": (np.int64, 1),
    "reward": (np.float32, 1),
    "next_obs": (np.float32, 2),
    "next_mask": (np.bool_, 2),
    "done": (np.bool_, 1),
    "last": (np.bool_, 1),
}


@dataclass
class Experience:
    """N transitions as numpy arrays (shapes: O = observation size, A = number of actions).

    `extras` holds what the policy returned when it acted (PPO: `logp` and `value`), row-aligned
    with the transitions. `next_mask` of a terminal transition may be all False.
    """

    obs: np.ndarray  # [N, O] float32
    mask: np.ndarray  # [N, A] bool, True = legal (A = 0: continuous actions)
    action: np.ndarray  # [N] int64, or [N, size] float32 continuous actions
    reward: np.ndarray  # [N] float32
    next_obs: np.ndarray  # [N, O] float32
    next_mask: np.ndarray  # [N, A] bool
    done: np.ndarray  # [N] bool, episode terminated: no bootstrap
    last: np.ndarray  # [N] bool, end of a contiguous stream segment
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.action)

    @property
    def continuous(self) -> bool:
        return self.action.ndim == 2

    @classmethod
    def concat(cls, batches: list[Experience]) -> Experience:
        """Streams of several batches, one after another (each batch keeps its own `last` flags)."""
        if not batches:
            raise ValueError("cannot concatenate an empty list of Experience")
        keys = set(batches[0].extras)
        if any(set(b.extras) != keys for b in batches):
            raise ValueError("cannot concatenate Experience with different extras keys")
        arrays = {name: np.concatenate([getattr(b, name) for b in batches]) for name in _SCHEMA}
        extras = {key: np.concatenate([b.extras[key] for b in batches]) for key in keys}
        return cls(**arrays, extras=extras)

    def validate(self) -> Experience:
        """Raise ValueError unless shapes, dtypes and values are consistent; return self.

        Trainers call this first: a wrong batch fails here with a clear message instead of
        training silently on garbage (a nan reward would poison every network weight).
        """
        n = len(self)
        for name, (dtype, ndim) in _SCHEMA.items():
            array = getattr(self, name)
            if name == "action" and self.continuous:
                dtype, ndim = np.float32, 2
            if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != ndim:
                raise ValueError(f"Experience.{name} must be a {ndim}-d {np.dtype(dtype).name} array")
            if len(array) != n:
                raise ValueError(f"Experience.{name} has {len(array)} rows, action has {n}")
        for key, array in self.extras.items():
            if len(array) != n:
                raise ValueError(f"Experience.extras[{key!r}] has {len(array)} rows, action has {n}")
        if self.next_obs.shape != self.obs.shape or self.next_mask.shape != self.mask.shape:
            raise ValueError("next_obs/next_mask must have the shapes of obs/mask")
        if not np.isfinite(self.reward).all():
            raise ValueError("Experience.reward holds non-finite values")
        if not np.isfinite(self.obs).all() or not np.isfinite(self.next_obs).all():
            raise ValueError("Experience observations hold non-finite values")
        if self.continuous:
            if self.mask.shape[1] or not np.isfinite(self.action).all():
                raise ValueError("continuous Experience.action must be finite, with masks of width 0")
        else:
            if n and not (0 <= self.action.min() and self.action.max() < self.mask.shape[1]):
                raise ValueError("Experience.action out of range")
            if not self.mask[np.arange(n), self.action].all():
                raise ValueError("Experience.action holds actions its mask marks illegal")
        if n and not self.last[-1]:
            raise ValueError("every stream segment ends with last=True, so the final transition must too")
        if not self.continuous and not self.next_mask[~self.done].any(axis=1).all():
            raise ValueError("a non-terminal transition's next_mask has no legal action")
        return self
