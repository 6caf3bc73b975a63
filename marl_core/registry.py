"""The one registry style: every pluggable kind of thing (oracle, evaluator, meta-solver, RL or
MARL algorithm, environment source) is a `Registry`, filled by one `add` line per entry and
looked up by name.

An unknown name fails with one line that names the value and lists what is allowed, so a typo
in a config or on the command line is caught before any work starts. Each entry carries a
one-line summary, so a listing (`psro oracles`, `psro marl algorithms`) prints what is there
without loading anything. An entry may be given as a ``"module:attribute"`` string and is
imported on first use: algorithms need torch, and listing or validating names must not pay for
importing it. For the same reason an entry may carry its typed settings (a pydantic class that
imports no torch), which a config checks its settings against.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownName(ValueError):
    """A name that is not registered; the message lists the registered ones."""


@dataclasses.dataclass
class _Entry:
    value: Any  # the entry, or its "module:attribute" path until first use
    summary: str
    settings: type | None


class Registry(Mapping[str, T], Generic[T]):
    def __init__(self, kind: str, error: type[ValueError] = UnknownName):
        self.kind = kind  # what an entry is, for messages: "oracle", "meta-solver", ...
        self.error = error
        self._entries: dict[str, _Entry] = {}

    def add(self, name: str, entry: T | str, summary: str, settings: type | None = None) -> None:
        """Register `entry` (or a ``"module:attribute"`` path to it) under `name`, with a one-line
        `summary` and, for an entry that takes settings, their pydantic class."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if not summary or "\n" in summary:
            raise ValueError(f"{self.kind} {name!r}: the summary must be one line")
        self._entries[name] = _Entry(entry, summary, settings)

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise self.error(
                f"unknown {self.kind} {name!r}; choose one of: {', '.join(sorted(self._entries))}"
            ) from None

    def __getitem__(self, name: str) -> T:
        entry = self._entry(name)
        if isinstance(entry.value, str):
            module, _, attribute = entry.value.partition(":")
            entry.value = getattr(importlib.import_module(module), attribute)
        return entry.value

    def summary(self, name: str) -> str:
        return self._entry(name).summary

    def settings(self, name: str) -> type:
        """The pydantic class of `name`'s settings, without loading the entry."""
        settings = self._entry(name).settings
        if settings is None:
            raise self.error(f"{self.kind} {name!r} takes no settings")
        return settings

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
