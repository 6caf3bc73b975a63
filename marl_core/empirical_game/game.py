"""What populations play (in PSRO and in a league): an environment, the roles that own
populations, and whether a game tree exists for exact methods. The empirical game is built on
it: a payoff entry is a profile of one member per role, evaluated on this environment.

A role is a population's name. On an OpenSpiel game each player is a role ("player_0", ...).
On a PettingZoo environment agents map to roles through `roles` in the config, a table of
agent-name prefixes (`{adversary: adversary, agent: good}` puts `agent_0` and `agent_1` in
the population "good"); without it every agent is its own role. All agents of a role act with
the same member, drawn once per episode, and must share observation and action sizes.
"""

from __future__ import annotations

import dataclasses
import functools

from marl_core.envs import AgentMapping, MultiAgentEnv, by_prefix, make_env, one_population_per_agent


@dataclasses.dataclass(frozen=True)
class PSROGame:
    name: str  # the config's game: an OpenSpiel game string or "pettingzoo:<module>"
    agents: tuple[str, ...]  # every agent of the environment, in its order
    roles: tuple[str, ...]  # the populations, in payoff-table order (first appearance among agents)
    mapping: AgentMapping  # agent -> role
    is_openspiel: bool
    obs_size: dict[str, int]  # per role
    num_actions: dict[str, int]  # per role

    def make_env(self) -> MultiAgentEnv:
        """The environment rollouts play. An OpenSpiel game is the one its tree is built on:
        a simultaneous-move game in its turn-based form, so information states match."""
        if self.is_openspiel:
            from marl_core.envs import OpenSpielEnv
            from marl_core.games.openspiel import load_game

            return OpenSpielEnv(load_game(self.name))
        return make_env(self.name)

    def agents_of(self, role: str) -> tuple[str, ...]:
        return tuple(a for a in self.agents if self.mapping(a) == role)

    @property
    def num_roles(self) -> int:
        return len(self.roles)

    @functools.cached_property
    def has_tree(self) -> bool:
        """An OpenSpiel game whose tree enumerates within the exact methods' limit."""
        if not self.is_openspiel:
            return False
        from marl_core.games.openspiel import GameError
        from marl_core.games.tree import build_tree

        try:
            build_tree(self.name)
        except GameError:
            return False
        return True


def is_openspiel_name(game: str) -> bool:
    prefix, colon, _ = game.partition(":")
    return not colon or "(" in prefix


@functools.lru_cache(maxsize=16)
def psro_game(game: str, roles: tuple[tuple[str, str], ...] | None = None) -> PSROGame:
    """The PSROGame of a config's `game` and `roles` (as sorted (prefix, role) pairs)."""
    env = PSROGame(game, (), (), one_population_per_agent, is_openspiel_name(game), {}, {}).make_env()
    try:
        spec = env.spec
    finally:
        env.close()
    if spec.action_boxes:
        raise ValueError(
            f"game {game!r} has continuous actions; populations (PSRO, leagues) act on discrete actions only "
            "(train it with psro marl: ippo or mappo)"
        )
    mapping = by_prefix(dict(roles)) if roles else one_population_per_agent
    role_of = {}
    for agent in spec.agents:
        try:
            role_of[agent] = mapping(agent)
        except KeyError as error:
            raise ValueError(f"roles: {error.args[0]}") from None
    ordered = tuple(dict.fromkeys(role_of.values()))
    obs_size, num_actions = {}, {}
    for role in ordered:
        members = [a for a in spec.agents if role_of[a] == role]
        sizes = {(spec.observation_size[a], spec.num_actions[a]) for a in members}
        if len(sizes) > 1:
            raise ValueError(
                f"roles: agents {members} of role {role!r} differ in observation or action sizes {sorted(sizes)}; "
                "give them separate roles"
            )
        obs_size[role], num_actions[role] = sizes.pop()
    return PSROGame(game, spec.agents, ordered, mapping, is_openspiel_name(game), obs_size, num_actions)


def psro_game_of(config) -> PSROGame:
    """The PSROGame a run's config names (its `game` and, where given, its `roles`)."""
    roles = getattr(config, "roles", None)
    return psro_game(config.game, tuple(sorted(roles.items())) if roles else None)
