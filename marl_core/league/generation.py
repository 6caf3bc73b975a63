"""League training as generations, each three named steps over the one rollout engine:

1. ``train-player``: every learning player trains each of its roles, going on from where its
   trainer left off, against the opponents its matchmaking draws (the league's
   `League.opponents`, fixed for the generation: every training episode draws one), each
   learner playing its rounds on the rollout workers, as a PSRO learned oracle does
   (`marl_core.psro.learned_oracle`);
2. the league is updated in this process (it is bookkeeping, not work): every training game
   goes into the match table and the ratings, in a fixed order, and every player its snapshot
   rule calls ready adds a frozen copy of itself, main exploiters (always) and league exploiters
   (by chance) going back to the initial weights; with `pbt` set, at each perturbation point
   the lower-rated players of each kind copy higher-rated ones (`exploit_players`);
3. ``measure-players``: each main agent's exact exploitability where the game tree fits, and its
   record against uniform play in greedy games on the workers.

`run_generation` wires them once over a `Runner` (`marl_core.runner.Runner`): this
module's `iterate_league_local` runs them in this process, `flows/scenarios/league.py` as Prefect
tasks on Ray. A generation is defined by the state it starts from, so a generation run again
from its committed state (a resumed run) gives the same table, ratings and snapshots.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

import numpy as np

from marl_core.empirical_game.game import PSROGame, psro_game_of
from marl_core.league.match_table import Game
from marl_core.league.players import KINDS, MAIN_AGENT, League, LearningPlayer
from marl_core.league.ratings import Ratings
from marl_core.pbt.schedule import LineageEntry, due, exploit_and_explore
from marl_core.policies.base import Policy, UniformPolicy
from marl_core.policies.population import Population
from marl_core.psro.oracle_call import BestResponse, OracleCall


@dataclasses.dataclass
class LeagueState:
    league: League
    ratings: Ratings
    members: dict[str, tuple[Policy, ...]]  # learning player or snapshot id -> its policy per role
    trainers: dict[str, tuple[dict, ...]]  # learning player id -> its trainer's state per role
    generation: int = 0  # the last generation completed (0: the seeded league)
    settings: dict[str, dict] = dataclasses.field(default_factory=dict)  # learning player -> its own algorithm settings
    lineage: list[LineageEntry] = dataclasses.field(default_factory=list)  # PBT's copies so far

    def copy(self) -> LeagueState:
        """A state the next generation may change; members and trainer states are never changed
        in place, only replaced, so they are shared."""
        return LeagueState(
            League.from_state(self.league.settings, self.league.state()),
            Ratings.from_state(self.ratings.state()),
            dict(self.members),
            dict(self.trainers),
            self.generation,
            {p: dict(v) for p, v in self.settings.items()},
            list(self.lineage),
        )


@dataclasses.dataclass(frozen=True)
class GenerationRecord:
    generation: int
    opponents: dict[str, dict[str, float]]  # learning player -> the distribution it drew from
    snapshots: list[str]  # taken at the generation's end
    resets: list[str]  # players that went back to the initial weights
    measured: dict[str, float]  # "<main agent>/exploitability", "<main agent>/win_rate_vs_uniform", ...
    training: dict[str, float]  # "<player>/<role>/<metric>" of its learners
    ratings: list[dict]  # one row per rated player, best first
    seconds: float
    elapsed_seconds: float
    lineage: list[LineageEntry] = dataclasses.field(default_factory=list)  # PBT's copies at the generation's end
    hyperparameters: dict[str, dict] = dataclasses.field(
        default_factory=dict
    )  # learning player -> PBT's values after them

    def summary(self) -> str:
        parts = []
        for key in sorted(self.measured):
            if key.endswith("/exploitability"):
                parts.append(f"{key.split('/')[0]} exploitability {self.measured[key]:.4f}")
            elif key.endswith("/win_rate_vs_uniform"):
                parts.append(f"{key.split('/')[0]} vs uniform {self.measured[key]:.3f}")
        best = self.ratings[0] if self.ratings else None
        if best:
            parts.append(f"top {best['player']} (mu {best['mu']:.1f} ± {best['sigma']:.1f})")
        parts.append(f"{len(self.snapshots)} snapshot(s)")
        parts.extend(f"{e.member} copies {e.source}" for e in self.lineage)
        return "  ".join(parts)

    def metrics(self) -> dict[str, float]:
        metrics = {
            "generation_seconds": self.seconds,
            "elapsed_seconds": self.elapsed_seconds,
            "snapshots_taken": float(len(self.snapshots)),
        }
        metrics.update(self.measured)
        metrics.update(self.training)
        for row in self.ratings:  # the learning players' (each generation's table has every snapshot's)
            if row["player"] in self.opponents:
                metrics.update(
                    {
                        f"rating/{row['player']}/elo": row["elo"],
                        f"rating/{row['player']}/mu": row["mu"],
                        f"rating/{row['player']}/sigma": row["sigma"],
                    }
                )
        for player, values in self.hyperparameters.items():
            metrics.update({f"hp/{player}/{k}": float(v) for k, v in values.items() if isinstance(v, (int, float))})
        if self.hyperparameters:
            metrics["pbt_copies"] = float(len(self.lineage))
        return metrics


# --- the league's start ----------------------------------------------------------------------


def initial_trainer(config, role_index: int):
    """Role `role_index`'s untrained trainer, the one every learning player starts from (and a
    reset returns to): one initialisation, seeded by the run's seed and the role."""
    from marl_core.rl import ALGORITHMS

    game = psro_game_of(config)
    role = game.roles[role_index]
    seed = int(np.random.SeedSequence([config.seed, role_index]).generate_state(1)[0])
    settings = config.learner_settings.model_copy(update={"seed": seed})
    return ALGORITHMS[config.algorithm].trainer(game.obs_size[role], game.num_actions[role], settings), settings


def member_of(config, role_index: int, trainer, settings) -> Policy:
    """A trainer's network as a league member: a copy, with its table where the tree fits."""
    from marl_core.policies.neural import NeuralPolicy

    table = None
    game = psro_game_of(config)
    if config.tabularize and game.has_tree:
        from marl_core.games.tree import build_tree
        from marl_core.policies.tabularize import tabularize

        table = tabularize(trainer.policy, build_tree(config.game), role_index)
    return NeuralPolicy.of(config.algorithm, settings, trainer.policy, table)


def initial_members(config) -> tuple[tuple[Policy, ...], tuple[dict, ...]]:
    """Every role's initial member and trainer state."""
    members, states = [], []
    for r in range(psro_game_of(config).num_roles):
        trainer, settings = initial_trainer(config, r)
        members.append(member_of(config, r, trainer, settings))
        states.append(trainer.state_dict())
    return tuple(members), tuple(states)


def initial_state(config) -> LeagueState:
    """The seeded league: every learning player at the initial weights, and one snapshot of each
    main agent as it starts (AlphaStar's seed)."""
    members, trainers = initial_members(config)
    league = League.seeded(config.league)
    ratings = Ratings(config.ratings)
    for player in league.players:
        ratings.add(player.id)
    for snapshot in league.snapshots:
        ratings.add(snapshot.id, like=snapshot.parent)
    everyone = [p.id for p in league.players] + [s.id for s in league.snapshots]
    settings = {p.id: dict(config.player_settings.get(p.id, {})) for p in league.players}
    return LeagueState(
        league, ratings, {id: members for id in everyone}, {p.id: trainers for p in league.players}, settings=settings
    )


# --- the steps -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Matchup:
    """What one learning player trains against this generation: its opponents (by id, in the
    league's order) with their probabilities, and their policies as one population per role."""

    player: str
    index: int  # its position among the learning players: its seed and its learners' mailboxes
    opponents: tuple[str, ...]
    probabilities: np.ndarray
    populations: list[Population]
    settings: dict  # the player's own algorithm settings over the config's

    @classmethod
    def of(cls, state: LeagueState, game: PSROGame, player: LearningPlayer) -> Matchup:
        distribution = state.league.opponents(player)
        opponents = tuple(distribution)
        populations = [
            Population.of(role, [state.members[o][r] for o in opponents]) for r, role in enumerate(game.roles)
        ]
        probabilities = np.array([distribution[o] for o in opponents])
        return cls(
            player.id,
            state.league.players.index(player),
            opponents,
            probabilities,
            populations,
            dict(state.settings.get(player.id, {})),
        )

    def call(
        self,
        config,
        role: int,
        generation: int,
        pool,
        trainer_state: dict | None = None,
    ) -> OracleCall:
        return OracleCall(
            config.oracle_config(self.settings),
            role,
            self.populations,
            [self.probabilities] * len(self.populations),
            generation,
            pool,
            seed_key=(self.index,),
            opponent_epsilon=config.opponent_epsilon,
            purpose=self.player,
            stage="generation",
            trainer_state=trainer_state,
            report_training=True,
        )


def train_player(config, matchup: Matchup, role: int, trainer_state: dict, generation: int, pool=None) -> BestResponse:
    """One learning player's role trained for a generation from `trainer_state`; the answer
    carries the trainer's new state and the games it played."""
    from marl_core.psro.oracles import get_oracle

    return get_oracle(config.algorithm).compute(matchup.call(config, role, generation, pool, trainer_state))


def measure_players(config, members: dict[str, tuple[Policy, ...]], generation: int, pool=None) -> dict[str, float]:
    """Each given player's exact exploitability (where the game tree fits) and its record against
    uniform play over `eval_episodes` greedy games per seat."""
    game = psro_game_of(config)
    measured = {}
    for player, policies in members.items():
        if game.has_tree:
            measured[f"{player}/exploitability"] = exploitability_of(config, policies)
        if config.eval_episodes > 0:
            for key, value in record_vs_uniform(config, policies, generation, pool).items():
                measured[f"{player}/{key}"] = value
    return measured


def exploitability_of(config, policies: tuple[Policy, ...]) -> float:
    """The exact exploitability of one member playing every seat (NashConv / 2)."""
    from marl_core.games.exploitability import nash_conv
    from marl_core.games.tree import build_tree
    from marl_core.policies.tabularize import tabular_forms

    game = psro_game_of(config)
    tree = build_tree(config.game)
    populations = [Population.of(role, [policies[r]]) for r, role in enumerate(game.roles)]
    return nash_conv(tree, tabular_forms(populations, tree), [np.ones(1)] * game.num_roles).exploitability


def record_vs_uniform(config, policies: tuple[Policy, ...], generation: int, pool=None) -> dict[str, float]:
    """Greedy games of `policies` in each seat against uniform play in the other: the share won,
    the share drawn, and the win rate (wins plus half the draws) with its standard error."""
    from marl_core.psro.learned_oracle import role_returns
    from marl_core.rollout.pool import pool_or_local
    from marl_core.rollout.worker import PolicyMixture, RolloutRequest

    game = psro_game_of(config)
    scores = []
    with pool_or_local(pool, game.make_env, config.rollout.envs_per_worker) as workers:
        for r, role in enumerate(game.roles):
            other = game.roles[1 - r]
            mixtures = {
                role: PolicyMixture((policies[r],), np.ones(1)),
                other: PolicyMixture((UniformPolicy(),), np.ones(1)),
            }
            shares = np.array_split(np.arange(config.eval_episodes), workers.size)
            requests = [
                RolloutRequest(
                    roles=game.mapping,
                    populations=mixtures,
                    episodes=len(share),
                    seed=(config.seed, generation, r, 3, worker),
                    explore=False,
                    experience=False,
                )
                for worker, share in enumerate(shares)
                if len(share)
            ]
            for result in workers.collect(requests):
                own, theirs = (
                    role_returns(result.episode_returns, game, role),
                    role_returns(result.episode_returns, game, other),
                )
                scores.append(np.where(own > theirs, 1.0, np.where(own < theirs, 0.0, 0.5)))
    scores = np.concatenate(scores)
    return {
        "wins_vs_uniform": float(np.mean(scores == 1.0)),
        "draws_vs_uniform": float(np.mean(scores == 0.5)),
        "win_rate_vs_uniform": float(scores.mean()),
        "win_rate_vs_uniform_stderr": float(scores.std(ddof=1) / np.sqrt(len(scores)))
        if len(scores) > 1
        else float("nan"),
    }


STEPS: dict[str, Callable] = {
    "train-player": train_player,
    "measure-players": measure_players,
}


# --- the league's bookkeeping ----------------------------------------------------------------


def training_games(game: PSROGame, matchup: Matchup, response: BestResponse) -> list[Game]:
    """A learner's training episodes as games of its player (home) against the opponent each
    episode drew (away), in the order they were played."""
    role, other = game.roles[response.role], game.roles[1 - response.role]
    from marl_core.psro.learned_oracle import role_returns

    own, theirs = role_returns(response.games.returns, game, role), role_returns(response.games.returns, game, other)
    opponents = [matchup.opponents[i] for i in response.games.draws[:, 0]]
    return [Game(matchup.player, away, float(h), float(a)) for away, h, a in zip(opponents, own, theirs)]


def update_league(
    config, state: LeagueState, matchups: list[Matchup], responses: list[list[BestResponse]], generation: int
) -> tuple[list[str], list[str]]:
    """Record the generation's games, take the new members and trainer states, then the
    snapshots; returns the snapshots taken and the players reset. Changes `state`."""
    game = psro_game_of(config)
    league, ratings = state.league, state.ratings
    for matchup, by_role in zip(matchups, responses):
        player = league.player(matchup.player)
        for response in by_role:
            for played in training_games(game, matchup, response):
                league.table.record(played)
                if played.away != played.home:
                    ratings.record(played)
            player.steps += int(response.metrics["env_steps"])
        state.members[player.id] = tuple(r.policy for r in by_role)
        state.trainers[player.id] = tuple(r.trainer_state for r in by_role)
    taken, reset = [], []
    rng = np.random.default_rng([config.seed, generation, 7])
    initial = None
    for player in list(league.players):
        if not league.ready_to_snapshot(player):
            continue
        snapshot = league.take_snapshot(player, generation)
        state.members[snapshot.id] = state.members[player.id]
        ratings.add(snapshot.id, like=player.id)
        taken.append(snapshot.id)
        if league.resets_at_snapshot(player, rng):
            initial = initial or initial_members(config)
            state.members[player.id], state.trainers[player.id] = initial
            ratings.reset(player.id, like=league.snapshots[0].id)  # the seed: the same initial network
            reset.append(player.id)
    return taken, reset


def exploit_players(config, state: LeagueState, generation: int) -> list[LineageEntry]:
    """PBT among the learning players of each kind, at a perturbation point: ranked by rating,
    each bottom player takes a top one's networks and trainer state (so it goes on from them)
    and its settings with the mutated ones explored, and is rated as that player is now. Per
    policy, inside one league: what a Tune trial cannot do (ray#8452). Changes `state`."""
    if config.pbt is None or not due(config.pbt, generation):
        return []
    metric = config.pbt.metric or "mu"
    entries = []
    for k, kind in enumerate(KINDS):
        players = [p.id for p in state.league.of_kind(kind)]
        if len(players) < 2:
            continue
        scores = [getattr(state.ratings[p], metric) for p in players]
        values = [_hyperparameters(config, state, p) for p in players]
        rng = np.random.default_rng([config.seed, generation, 9, k])
        for entry in exploit_and_explore(generation, scores, values, config.pbt, rng):
            member, source = players[entry.member], players[entry.source]
            state.members[member], state.trainers[member] = state.members[source], state.trainers[source]
            state.settings[member] = {**state.settings.get(source, {}), **entry.after}
            state.ratings.reset(member, like=source)
            entries.append(dataclasses.replace(entry, member=member, source=source))
    state.lineage.extend(entries)
    return entries


def _hyperparameters(config, state: LeagueState, player: str) -> dict:
    values = config.settings_of(state.settings.get(player)).model_dump()
    return {name: values[name] for name in config.pbt.hyperparam_mutations}


# --- one generation, wired once --------------------------------------------------------------


def run_generation(
    config, previous: LeagueState, generation: int, runner, pool=None, run_started: float = 0.0
) -> tuple[GenerationRecord, LeagueState]:
    """Every learner of the generation submitted at once, then the league's
    update, then the main agents measured. `previous` is left as it was."""
    began = time.perf_counter()
    game = psro_game_of(config)
    state = previous.copy()
    matchups = [Matchup.of(state, game, player) for player in state.league.players]
    learners = []
    for matchup in matchups:
        shared = runner.share(matchup)
        by_role = []
        for r in range(game.num_roles):
            learner = runner.submit(
                "train-player", config, shared, r, runner.share(state.trainers[matchup.player][r]), generation, pool
            )
            by_role.append(learner)
        learners.append(by_role)
    responses = [[runner.result(learner) for learner in by_role] for by_role in learners]
    snapshots, resets = update_league(config, state, matchups, responses, generation)
    lineage = exploit_players(config, state, generation)
    mains = {p.id: state.members[p.id] for p in state.league.of_kind(MAIN_AGENT)}
    measured = runner.result(runner.submit("measure-players", config, mains, generation, pool))
    state.generation = generation
    training = {}
    for matchup, by_role in zip(matchups, responses):
        for response in by_role:
            for key in ("training_return", "env_steps", "seconds"):
                training[f"{matchup.player}/{game.roles[response.role]}/{key}"] = response.metrics[key]
    now = time.perf_counter()
    record = GenerationRecord(
        generation=generation,
        opponents={m.player: dict(zip(m.opponents, m.probabilities.tolist())) for m in matchups},
        snapshots=snapshots,
        resets=resets,
        measured=measured,
        training=training,
        ratings=state.ratings.table(),
        seconds=now - began,
        elapsed_seconds=now - run_started,
        lineage=lineage,
        hyperparameters={p.id: _hyperparameters(config, state, p.id) for p in state.league.players}
        if config.pbt
        else {},
    )
    return record, state


def iterate_league_local(config, state: LeagueState | None = None) -> Iterator[tuple[GenerationRecord, LeagueState]]:
    """Every generation in this process, from `state` (default the seeded league)."""
    from marl_core.psro.steps import rollout_pool_config
    from marl_core.rollout.pool import WorkerPool
    from marl_core.runner import LocalRunner

    started = time.perf_counter()
    state = state or initial_state(config)
    pool = WorkerPool(rollout_pool_config(config.oracle_config()))
    try:
        runner = LocalRunner(STEPS)
        for generation in range(state.generation + 1, config.generations + 1):
            record, state = run_generation(config, state, generation, runner, pool, started)
            yield record, state
    finally:
        pool.close()


def write_main_agent_export(directory, config, state: LeagueState, wall_seconds: float):
    """The first main agent as it ends, in PSRO's export format (one member per role, played
    with certainty), which `scripts/verify_export.py` checks with OpenSpiel alone."""
    from marl_core.games.exploitability import nash_conv
    from marl_core.games.tree import build_tree
    from marl_core.policies.tabularize import tabular_forms
    from marl_core.psro.export import write_export

    game = psro_game_of(config)
    main = state.league.of_kind(MAIN_AGENT)[0].id
    populations = [Population.of(role, [state.members[main][r]]) for r, role in enumerate(game.roles)]
    meta = [np.ones(1)] * game.num_roles
    report = (
        nash_conv(build_tree(config.game), tabular_forms(populations, build_tree(config.game)), meta)
        if game.has_tree
        else None
    )
    return write_export(directory, config.oracle_config(), populations, meta, report, state.generation, wall_seconds)
