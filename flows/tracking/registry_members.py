"""Populations read back from MLflow: registry members for `psro evaluate`, finished runs for
`psro export --run`.

A member is a version of a registered model `{experiment}-{game}-{role}`; the version's source
is the member's folder as `marl_core.policies.storage` wrote it (a table as JSON, a network as
its JSON description and a weights-only state_dict), and its tags name its game, role and run
(see `flows.tracking.layout`). Which roles the game has, and which agents play each, is the
run's: a PettingZoo run may map agents to roles (`roles` in its settings), so members are
grouped and played by the roles of the run that trained them, read from its logged settings.
Loading goes through `storage.load_policy`: nothing is ever unpickled, so a member from an
untrusted store cannot run code.

Every failure is a `PopulationError` whose message is one line naming the bad value and what
would have been accepted; the CLI prints it and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from flows.tracking import layout
from flows.tracking.patient import mlflow_client
from marl_core.policies.base import Policy
from marl_core.policies.population import Population

if TYPE_CHECKING:
    from marl_core.empirical_game.game import PSROGame

MEMBER_SYNTAX = "NAME@ALIAS or NAME/VERSION (as in MLflow's models:/ URIs), e.g. psro-kuhn_poker-player_0@newest"
EVALUATE_EXPERIMENT = "psro-evaluate"


class PopulationError(ValueError):
    """Bad member spec, unknown model, alias, version or run: one line for the user."""


@dataclasses.dataclass(frozen=True)
class MemberSpec:
    text: str
    name: str
    alias: str | None = None
    version: str | None = None


# a run's `roles` as sorted (prefix, role) pairs, as `psro_game` takes them
RoleTable = tuple[tuple[str, str], ...] | None


@dataclasses.dataclass(frozen=True)
class Member:
    spec: MemberSpec
    name: str
    version: str
    game: str
    roles: RoleTable  # of the run that registered it; None: one role per agent
    role: str
    run_id: str
    policy: Policy

    @property
    def label(self) -> str:
        return f"{self.name}/{self.version}"


def parse_member(text: str) -> MemberSpec:
    """`NAME@ALIAS` or `NAME/VERSION`, with or without MLflow's `models:/` prefix."""
    body = text.removeprefix("models:/")
    alias_form = re.fullmatch(r"(?P<name>[^@/]+)@(?P<alias>[A-Za-z0-9_-]+)", body)
    if alias_form:
        return MemberSpec(text, alias_form["name"], alias=alias_form["alias"])
    version_form = re.fullmatch(r"(?P<name>[^@/]+)/(?P<version>[1-9][0-9]*)", body)
    if version_form:
        return MemberSpec(text, version_form["name"], version=version_form["version"])
    raise PopulationError(f"member {text!r} is not {MEMBER_SYNTAX}")


def open_store(tracking_uri: str):
    """An MLflow client on an existing store; never creates an empty SQLite file by accident."""
    if tracking_uri.startswith("sqlite:///"):
        path = Path(tracking_uri.removeprefix("sqlite:///"))
        if not path.is_file():
            raise PopulationError(
                f"no MLflow store at {str(path)!r} (--tracking-uri {tracking_uri}); pass the store a run wrote to"
            )
    return mlflow_client(tracking_uri)


# --- registry members --------------------------------------------------------------------------


def load_member(client, spec: MemberSpec) -> Member:
    from flows.tracking.resume import table_key
    from marl_core.empirical_game.game import psro_game
    from marl_core.policies.storage import load_policy

    version = _resolve_version(client, spec)
    label = f"{spec.name}/{version.version}"
    try:
        tags = layout.VersionTags.of(version.tags or {})
    except (KeyError, ValueError):
        raise PopulationError(
            f"{label} lacks the tags `psro run` registers members with (game, role, member, ...); "
            "only versions it registered are population members"
        ) from None
    roles = _run_roles(client, label, tags)
    game = psro_game(tags.game, roles)
    if tags.role not in game.roles:
        raise PopulationError(
            f"{label} is tagged role {tags.role!r}, which {tags.game} does not have; its roles: {', '.join(game.roles)}"
        )
    try:
        with tempfile.TemporaryDirectory() as directory:
            folder = _download(client, version.source, directory)
            policy = load_policy(folder, *table_key(game, tags.role))
    except Exception as error:  # a missing file, a table that does not fit the game, bad JSON: all one line
        raise PopulationError(f"cannot load {label} from {version.source}: {str(error).splitlines()[0]}") from None
    return Member(spec, spec.name, str(version.version), tags.game, roles, tags.role, tags.run_id, policy)


def _run_roles(client, label: str, tags: layout.VersionTags) -> RoleTable:
    """The role table of the run that registered a member, from the settings it logged."""
    from mlflow.exceptions import MlflowException

    from flows.tracking.resume import logged_config

    try:
        settings = logged_config(client, tags.run_id)
    except (MlflowException, OSError, ValueError) as error:  # the run or its config.json is gone or unreadable
        raise PopulationError(
            f"{label}: cannot read the settings of its run {tags.run_id} ({str(error).splitlines()[0]}); "
            "members are played by their run's roles"
        ) from None
    if settings.get("game") != tags.game:
        raise PopulationError(
            f"{label} is tagged game {tags.game!r} but its run {tags.run_id} played {settings.get('game')!r}"
        )
    roles = settings.get("roles")
    return tuple(sorted(roles.items())) if roles else None


def describe_roles(roles: RoleTable) -> str:
    return ", ".join(f"{prefix}*->{role}" for prefix, role in roles) if roles else "one role per agent"


def _download(client, artifact_uri: str, directory: str) -> str:
    import mlflow

    return mlflow.artifacts.download_artifacts(
        artifact_uri=artifact_uri, dst_path=directory, tracking_uri=client.tracking_uri
    )


def _resolve_version(client, spec: MemberSpec):
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(spec.name)
    except MlflowException:
        known = sorted(m.name for m in client.search_registered_models())
        raise PopulationError(
            f"no registered model {spec.name!r} in {client.tracking_uri}; "
            f"registered models: {', '.join(known) or 'none'}"
        ) from None
    if spec.alias:
        aliases = sorted(model.aliases or {})
        if spec.alias not in aliases:
            raise PopulationError(
                f"model {spec.name!r} has no alias {spec.alias!r}; its aliases: {', '.join(aliases) or 'none'}"
            )
        return client.get_model_version_by_alias(spec.name, spec.alias)
    try:
        return client.get_model_version(spec.name, spec.version)
    except MlflowException:
        versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{spec.name}'"))
        span = f"{versions[0]}-{versions[-1]}" if versions else "none"
        raise PopulationError(f"model {spec.name!r} has no version {spec.version}; its versions: {span}") from None


def populations_of(members: list[Member]) -> tuple[PSROGame, list[list[Member]]]:
    """The game the members' runs played, with their roles, and the members grouped by role (in
    the order given; roles in the game's order). All must come from one game played with the
    same roles, and every role needs at least one."""
    from marl_core.empirical_game.game import psro_game

    games = sorted({m.game for m in members})
    if len(games) > 1:
        by_game = ", ".join(f"{m.label} ({m.game})" for m in members)
        raise PopulationError(f"members come from different games: {by_game}; pick members of one game")
    if len({m.roles for m in members}) > 1:
        by_roles = ", ".join(f"{m.label} ({describe_roles(m.roles)})" for m in members)
        raise PopulationError(
            f"members come from runs with different roles: {by_roles}; pick members of runs with the same roles"
        )
    game = psro_game(games[0], members[0].roles)
    groups = [[m for m in members if m.role == role] for role in game.roles]
    for role, group in zip(game.roles, groups):
        if not group:
            raise PopulationError(f"no member for role {role!r} of {game.name}; add --member with a {role} model")
    return game, groups


def check_evaluable(game: str, groups: list[list[Member]], evaluator: str = "exact") -> None:
    """The exact evaluator walks the game tree, so every member needs its table (a network member
    has one where the run could compute it); the sampled one plays any member by rollouts."""
    untabled = [m.label for group in groups for m in group if m.policy.tabular is None]
    if untabled and evaluator == "exact":
        raise PopulationError(
            f"member(s) {', '.join(untabled)} of {game} are networks without a tabular form; "
            "evaluate them with --eval sampled"
        )


def evaluate(game: PSROGame, groups: list[list[Member]], evaluator: str, episodes: int, seed: int):
    """Every profile of the populations, by one of marl_core's evaluators; a PayoffTable."""
    from marl_core.empirical_game.evaluation import EVALUATORS
    from marl_core.empirical_game.payoffs import PayoffTable

    populations = [Population.of(group[0].role, [m.policy for m in group]) for group in groups]
    table = PayoffTable(len(populations))
    table.grow(tuple(len(group) for group in groups))
    profiles = table.missing_profiles()
    result = EVALUATORS[evaluator](game, populations, profiles, episodes=episodes, seed=seed)
    table.record(profiles, result.mean, result.stderr, result.episodes)
    return table


def log_evaluation(client, experiment: str, game: PSROGame, groups, table, settings: dict) -> str:
    """A new MLflow run: the settings (and the game's roles) as params, `payoffs.csv`
    (PayoffTable's frame, members by position, roles in the game's order) and `members.json`
    (position -> registry name, version, source run)."""
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    run = client.create_run(experiment_id, run_name=f"evaluate-{game.name}", tags={"game": game.name})
    run_id = run.info.run_id
    try:
        for key, value in {"game": game.name, "roles": " ".join(game.roles), **settings}.items():
            client.log_param(run_id, key, str(value))
        client.log_text(run_id, table.to_frame().to_csv(index=False), layout.EVALUATION_PAYOFFS)
        members = {
            str(player): [
                {"name": m.name, "version": m.version, "spec": m.spec.text, "run_id": m.run_id} for m in group
            ]
            for player, group in enumerate(groups)
        }
        client.log_dict(run_id, members, layout.EVALUATION_MEMBERS)
    except Exception:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    return run_id


# --- finished runs -----------------------------------------------------------------------------


def export_run(client, run_id: str, directory: Path) -> dict:
    """Write a finished run's final population and meta-strategy in the export format
    (`marl_core.psro.export`: tables OpenSpiel checks, network members as weights beside them).

    The summary carries the NashConv (exact and/or approximate) the run logged by its last
    committed iteration, so `scripts/verify_export.py` checks the run's own claim against
    OpenSpiel. Returns the summary plus the exact NashConv recomputed here from the same
    artifacts where the game has a tree (else None).
    """
    from flows.tracking.resume import committed_iteration, game_of_logged, logged_config, read_population
    from marl_core.games.exploitability import NashConvReport, nash_conv
    from marl_core.games.tree import build_tree
    from marl_core.policies.population import stacked_tables
    from marl_core.psro.export import write_export
    from marl_core.psro.steps import ApproxNashConv

    run = _finished_run(client, run_id)
    iteration = committed_iteration(run)
    if not run.data.params.get("game") or iteration is None:
        raise PopulationError(
            f"run {run_id} has no 'game' param or committed no iteration; it was not written by `psro run`"
        )
    exact = _logged_by(client, run_id, iteration, ("nash_conv", "exploitability"))
    approx = _logged_by(
        client,
        run_id,
        iteration,
        ("approx_nash_conv", "approx_nash_conv_stderr", "approx_exploitability", "approx_exploitability_stderr"),
    )
    if exact is None and approx is None:
        raise PopulationError(
            f"run {run_id} logged neither nash_conv nor approx_nash_conv; it was not written by `psro run`"
        )
    settings = logged_config(client, run_id)
    game = game_of_logged(settings)
    with tempfile.TemporaryDirectory() as scratch:
        populations, meta_strategy = read_population(client, run_id, settings, iteration, scratch)
    recomputed = None
    if game.has_tree:
        try:
            tables = stacked_tables(populations)
        except ValueError as error:
            raise PopulationError(f"run {run_id}: {error}; the export is checked by OpenSpiel on tables") from None
        recomputed = nash_conv(build_tree(game.name), tables, meta_strategy)
    logged = NashConvReport(*exact, [], []) if exact else None
    logged_approx = ApproxNashConv(*approx, gains=[], gains_stderr=[]) if approx else None
    wall = ((run.info.end_time or run.info.start_time) - run.info.start_time) / 1000
    write_export(
        directory, SimpleNamespace(**settings), populations, meta_strategy, logged, iteration, wall, logged_approx
    )
    return {
        "game": game.name,
        "iterations": iteration,
        "population_sizes": [len(p) for p in populations],
        "logged": logged,
        "approx": logged_approx,
        "recomputed": recomputed,
    }


def _logged_by(client, run_id: str, iteration: int, names: tuple[str, ...]):
    """The metrics' values at the last step up to `iteration` where the first was logged; None if never."""
    history = [m for m in client.get_metric_history(run_id, names[0]) if m.step <= iteration]
    if not history:
        return None
    step = max(m.step for m in history)
    return tuple(next(m.value for m in client.get_metric_history(run_id, name) if m.step == step) for name in names)


def _finished_run(client, run_id: str):
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise PopulationError(
            f"no MLflow run {run_id!r} in {client.tracking_uri}; "
            "run ids are listed in MLflow's UI and by `mlflow runs list`"
        ) from None
    if run.info.status != "FINISHED":
        raise PopulationError(f"run {run_id} is {run.info.status}; only a FINISHED run can be exported")
    return run
