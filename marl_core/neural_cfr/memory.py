"""A reservoir of training samples that keeps a uniform sample of everything ever added.

Why a reservoir: the advantage network must fit the (weighted) average of the regrets of *all*
past iterations, and the average-policy network the average of all past strategies. Past samples
cannot be recomputed, so each iteration's samples join a memory in which every sample ever
added has the same chance of still being present (Vitter's algorithm R), whatever its age.

The contents are torch tensors, so a checkpoint of a memory is a weights-only state dict.
"""

from __future__ import annotations

import torch


class Reservoir:
    """Named tensor fields of equal length, one of them "weight"; `add` and `sample` draw from
    the caller's generator."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.seen = 0  # samples ever added
        self.fields: dict[str, torch.Tensor] = {}  # allocated on the first `add`, grown as it fills
        self._cumulative: torch.Tensor | None = None  # of the weights, for `sample`; reset by `add`

    def __len__(self) -> int:
        return min(self.seen, self.capacity)

    def _reserve(self, batch: dict[str, torch.Tensor], size: int) -> None:
        """Grow the storage to hold `size` rows (doubling, up to the capacity)."""
        allocated = len(next(iter(self.fields.values()))) if self.fields else 0
        if size <= allocated:
            return
        rows = min(self.capacity, max(size, 2 * allocated, 1024))
        for name, values in batch.items():
            grown = torch.zeros((rows, *values.shape[1:]), dtype=values.dtype)
            if name in self.fields:
                grown[:allocated] = self.fields[name]
            self.fields[name] = grown

    def add(self, batch: dict[str, torch.Tensor], generator: torch.Generator) -> None:
        count = len(next(iter(batch.values())))
        if count == 0:
            return
        self._cumulative = None
        self._reserve(batch, min(self.capacity, self.seen + count))
        free = max(0, min(count, self.capacity - self.seen))
        for name, values in batch.items():
            self.fields[name][self.seen : self.seen + free] = values[:free]
        if free < count:
            # The n-th sample ever added replaces a uniformly drawn row with probability capacity / n.
            ordinals = torch.arange(self.seen + free + 1, self.seen + count + 1, dtype=torch.float64)
            slots = (torch.rand(count - free, dtype=torch.float64, generator=generator) * ordinals).long()
            kept = slots < self.capacity
            for name, values in batch.items():
                self.fields[name][slots[kept]] = values[free:][kept]
        self.seen += count

    def sample(self, size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """`size` rows drawn with replacement, each with probability proportional to its
        "weight" field: the batch's plain mean loss then estimates the weighted loss, with far
        less variance than weighting a uniform batch when weights span orders of magnitude."""
        if self._cumulative is None:
            self._cumulative = self.fields["weight"][: len(self)].double().cumsum(0)
        draws = torch.rand(size, dtype=torch.float64, generator=generator) * self._cumulative[-1]
        rows = torch.searchsorted(self._cumulative, draws, right=True).clamp_(max=len(self) - 1)
        return {name: values[rows] for name, values in self.fields.items()}

    def state_dict(self) -> dict:
        return {
            "seen": self.seen,
            "fields": {name: values[: len(self)].clone() for name, values in self.fields.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.seen = int(state["seen"])
        self.fields = {name: values.clone() for name, values in state["fields"].items()}
        self._cumulative = None
