"""Multi-agent environments behind one interface (see `api.py`), and `make_env` to name them.

make_env("leduc_poker")                       # an OpenSpiel game string (the default)
make_env("pettingzoo:mpe2.simple_spread_v3")  # a module: parallel_env(), else env()
make_env("pettingzoo:classic.connect_four_v3")  # a module of PettingZoo itself
make_env("pettingzoo:classic/tictactoe-v3")   # a PettingZoo registry id: parallel if registered so
make_env("gymnasium:CartPole-v1")             # a Gymnasium id, as one agent "agent_0"
make_env("atari:pong_v3")                     # a PettingZoo Atari game from pixels, preprocessed
make_env("vmas:navigation(n_agents=2)")       # a VMAS scenario, one copy
make_env("vmas:navigation(continuous_actions=True)")  # the same, with VMAS's continuous actions

`make_batched_env` gives the sources that step many copies in one call (VMAS) as a `BatchedEnv`.
"""

from __future__ import annotations

import importlib

import gymnasium
import pettingzoo
from pettingzoo.env_registry.exceptions import PettingZooRegistryError

from marl_core.envs.agent_mapping import (
    AgentMapping,
    by_prefix,
    from_dict,
    group_by_policy,
    one_population_per_agent,
    shared_population,
)
from marl_core.envs.api import AgentID, Box, EnvSpec, MultiAgentEnv, TimeStep
from marl_core.envs.atari import AtariEnv, AtariSettings, rom_directory
from marl_core.envs.batched import BatchedEnv, BatchedStep
from marl_core.envs.gymnasium_env import GymnasiumEnv
from marl_core.envs.openspiel_env import OpenSpielEnv
from marl_core.envs.pettingzoo_env import PettingZooAECEnv, PettingZooParallelEnv
from marl_core.envs.pettingzoo_export import to_pettingzoo
from marl_core.envs.vector import BatchedCopies, EnvCopies
from marl_core.envs.vmas_env import VmasBatchedEnv, VmasEnv
from marl_core.registry import Registry

__all__ = [
    "AgentID",
    "AgentMapping",
    "ENVIRONMENT_SOURCES",
    "AtariEnv",
    "AtariSettings",
    "BatchedCopies",
    "BatchedEnv",
    "BatchedStep",
    "Box",
    "EnvCopies",
    "EnvSpec",
    "GymnasiumEnv",
    "MultiAgentEnv",
    "OpenSpielEnv",
    "PettingZooAECEnv",
    "PettingZooParallelEnv",
    "TimeStep",
    "accepted_forms",
    "by_prefix",
    "from_dict",
    "group_by_policy",
    "make_batched_env",
    "make_env",
    "one_population_per_agent",
    "shared_population",
    "to_pettingzoo",
]


def accepted_forms() -> str:
    """What an environment's name may be, as every message and help says it: from the
    registry of sources, so a new source is named the day it is registered."""
    return f"an OpenSpiel game string, or SOURCE:NAME with SOURCE one of: {', '.join(sorted(ENVIRONMENT_SOURCES))}"


def _prefixed(name: str) -> tuple[str, str] | None:
    """("vmas", "navigation") for "vmas:navigation"; None for an OpenSpiel game string, whose
    parameters may hold a colon (one inside brackets is not a prefix)."""
    prefix, colon, rest = name.partition(":")
    return None if not colon or "(" in prefix else (prefix, rest)


def make_env(name: str) -> MultiAgentEnv:
    """The environment `name` refers to; a ValueError names it and the accepted forms otherwise."""
    if (prefixed := _prefixed(name)) is None:
        return OpenSpielEnv(name)
    prefix, rest = prefixed
    if prefix not in ENVIRONMENT_SOURCES:
        raise ValueError(f"unknown environment prefix in {name!r}; use {accepted_forms()}")
    return ENVIRONMENT_SOURCES[prefix](name, rest)


def make_batched_env(name: str, num_envs: int) -> BatchedEnv | None:
    """`num_envs` copies of environment `name` stepped in one call, where its source batches
    (`BATCHED_SOURCES`); None for the others, whose copies step one by one."""
    prefixed = _prefixed(name)
    if prefixed is None or prefixed[0] not in BATCHED_SOURCES:
        return None
    return BATCHED_SOURCES[prefixed[0]](name, prefixed[1], num_envs)


def _pettingzoo(name: str, target: str) -> MultiAgentEnv:
    """A registry id such as classic/tictactoe-v3 (PettingZoo 1.27 deprecates importing its own
    environment modules), else a module path such as mpe2.simple_spread_v3."""
    # Atari games find their ROMs in ale-py's wheel instead of downloading them (envs/atari.py)
    options = {"auto_rom_install_path": str(rom_directory())} if target.startswith(("atari/", "atari.")) else {}
    if "/" in target:
        kind = "parallel" if target in pettingzoo.parallel_registry else "aec"
        try:
            env = pettingzoo.make(kind, target, **options)
        except PettingZooRegistryError as exc:
            reason = str(exc).split(". Available")[0]
            raise ValueError(f"cannot make environment {name!r} ({reason}); use {accepted_forms()}") from None
        return PettingZooParallelEnv(env) if kind == "parallel" else PettingZooAECEnv(env)
    try:
        module = importlib.import_module(target)
    except (ImportError, ValueError) as exc:  # ValueError: an empty module path
        try:  # PettingZoo's own families are named without the package: classic.connect_four_v3
            module = importlib.import_module(f"pettingzoo.{target}")
        except (ImportError, ValueError):
            raise ValueError(
                f"cannot import {target!r} for environment {name!r} ({exc}); use {accepted_forms()}"
            ) from None
    if hasattr(module, "parallel_env"):
        return PettingZooParallelEnv(module.parallel_env(**options))
    if hasattr(module, "env"):
        return PettingZooAECEnv(module.env(**options))
    raise ValueError(
        f"module {target!r} for environment {name!r} has no parallel_env() or env(); use {accepted_forms()}"
    )


def _gymnasium(name: str, env_id: str) -> MultiAgentEnv:
    try:
        env = gymnasium.make(env_id)
    except gymnasium.error.Error as exc:
        raise ValueError(f"cannot make Gymnasium environment {name!r} ({exc}); use {accepted_forms()}") from None
    return GymnasiumEnv(env)


def _atari(name: str, game: str) -> MultiAgentEnv:
    return AtariEnv(game)


def _vmas(name: str, scenario: str) -> MultiAgentEnv:
    return VmasEnv(name, scenario)


# Where environments come from, by the prefix of their name ("pettingzoo:mpe2.simple_spread_v3");
# a name without a prefix is an OpenSpiel game string.
ENVIRONMENT_SOURCES: Registry = Registry("environment source")
ENVIRONMENT_SOURCES.add(
    "pettingzoo",
    _pettingzoo,
    "PettingZoo: a registry id (classic/tictactoe-v3) or a module path (mpe2.simple_spread_v3)",
)
ENVIRONMENT_SOURCES.add("gymnasium", _gymnasium, "Gymnasium: a single-agent environment id (CartPole-v1)")
ENVIRONMENT_SOURCES.add("atari", _atari, "PettingZoo's multi-player Atari from pixels, preprocessed as DQN's (pong_v3)")
ENVIRONMENT_SOURCES.add("vmas", _vmas, "VMAS: a vectorized scenario in torch (navigation, balance, simple_spread)")

# The sources whose copies step together in one call, by prefix; each entry is made from the
# name, the part after the prefix and the number of copies.
BATCHED_SOURCES: Registry = Registry("batched environment source")
BATCHED_SOURCES.add("vmas", VmasBatchedEnv, "VMAS: every copy of a scenario stepped in one torch call")
