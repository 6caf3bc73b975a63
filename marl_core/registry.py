"""The one registry style: every pluggable kind of thing (oracle, evaluator, meta-solver, RL
algorithm, environment source) is a `Registry`, looked up by name.

An unknown name fails with one line that names the value and lists what is allowed, so a typo
in a config or on the command line is caught before any work starts. An entry may be given as
a ``"module:attribute"`` string and is imported on first use: RL algorithms need torch, and
listing or validating names must not pay for importing it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(ValueError):
    """A name that is not registered; the message lists the registered ones."""


class Registry(Mapping[str, T], Generic[T]):
    def __init__(self, kind: str, error: type[ValueError] = UnknownName):
        self.kind = kind  # what an entry is, for messages: "oracle", "meta-solver", ...
        self.error = error
        self._entries: dict[str, T | str] = {}

    def add(self, name: str, entry: T | str) -> None:
        """Register `entry` (or a ``"module:attribute"`` path to it) under `name`."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def __getitem__(self, name: str) -> T:
        try:
            entry = self._entries[name]
        except (KeyError, TypeError):
            raise self.error(f"unknown {self.kind} {name!r}; choose one of: {', '.join(sorted(self._entries))}") from None
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            entry = self._entries[name] = getattr(importlib.import_module(module), attribute)
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
