"""Populations read back from MLflow: registry members for `psro evaluate`, finished runs for
`psro export --run`.

A member is a version of a registered model `{experiment}-{game}-player{p}`; the RunTracker
stored its policy as `policy.json` (information state -> action probabilities) next to the
version's source, and tagged the version with its game and player. Loading reads that JSON and
rebuilds the array with `policy_from_dict`: nothing is ever unpickled, so a member from an
untrusted store cannot run code.

Every failure is a `PopulationError` whose message is one line naming the bad value and what
would have been accepted; the CLI prints it and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

MEMBER_SYNTAX = "NAME@ALIAS or NAME/VERSION (as in MLflow's models:/ URIs), e.g. psro-kuhn_poker-player0@newest"
EVALUATE_EXPERIMENT = "psro-evaluate"


class PopulationError(ValueError):
    """Bad member spec, unknown model, alias, version or run: one line for the user."""


@dataclasses.dataclass(frozen=True)
class MemberSpec:
    text: str
    name: str
    alias: str | None = None
    version: str | None = None


@dataclasses.dataclass(frozen=True)
class Member:
    spec: MemberSpec
    name: str
    version: str
    game: str
    player: int
    run_id: str
    policy: np.ndarray

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
    import mlflow

    if tracking_uri.startswith("sqlite:///"):
        path = Path(tracking_uri.removeprefix("sqlite:///"))
        if not path.is_file():
            raise PopulationError(f"no MLflow store at {str(path)!r} (--tracking-uri {tracking_uri}); pass the store a run wrote to")
    return mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


# --- registry members --------------------------------------------------------------------------


def load_member(client, spec: MemberSpec) -> Member:
    from marl_core.games.tree import build_tree
    from marl_core.policies.tabular import policy_from_dict

    version = _resolve_version(client, spec)
    tags = version.tags or {}
    if "game" not in tags or "player" not in tags:
        raise PopulationError(f"{spec.name}/{version.version} has no game and player tags; only versions registered by `psro run` are population members")
    game, player = tags["game"], int(tags["player"])
    table = _read_json(client, f"{version.source}/policy.json", f"{spec.name}/{version.version}")
    try:
        policy = policy_from_dict(build_tree(game).players[player], table)
    except ValueError as error:
        raise PopulationError(f"{spec.name}/{version.version}: policy.json does not fit {game} player {player}: {error}") from None
    return Member(spec, spec.name, str(version.version), game, player, version.run_id or "", policy)


def load_member_network(client, version):
    """A learned member's network, rebuilt from its weights-only checkpoint; None for members
    that never had one (the uniform starting policy, exact best responses)."""
    import mlflow

    from marl_core.policies.checkpoints import SPEC_FILE, WEIGHTS_FILE, load_network

    stored = {Path(a.path).name for a in client.list_artifacts(version.run_id, _run_relative(version))}
    if not {SPEC_FILE, WEIGHTS_FILE} <= stored:
        return None
    with tempfile.TemporaryDirectory() as directory:
        for name in (SPEC_FILE, WEIGHTS_FILE):
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"{version.source}/{name}", dst_path=directory, tracking_uri=client.tracking_uri
            )
        return load_network(directory)


def _run_relative(version) -> str:
    """The version's folder inside its run's artifacts (population/player_p/member_k)."""
    return "population/" + version.source.split("/population/", 1)[1]


def _resolve_version(client, spec: MemberSpec):
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(spec.name)
    except MlflowException:
        known = sorted(m.name for m in client.search_registered_models())
        raise PopulationError(
            f"no registered model {spec.name!r} in {client.tracking_uri}; registered models: {', '.join(known) or 'none'}"
        ) from None
    if spec.alias:
        aliases = sorted(model.aliases or {})
        if spec.alias not in aliases:
            raise PopulationError(f"model {spec.name!r} has no alias {spec.alias!r}; its aliases: {', '.join(aliases) or 'none'}")
        return client.get_model_version_by_alias(spec.name, spec.alias)
    try:
        return client.get_model_version(spec.name, spec.version)
    except MlflowException:
        versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{spec.name}'"))
        span = f"{versions[0]}-{versions[-1]}" if versions else "none"
        raise PopulationError(f"model {spec.name!r} has no version {spec.version}; its versions: {span}") from None


def _read_json(client, artifact_uri: str, what: str):
    import mlflow

    try:
        with tempfile.TemporaryDirectory() as directory:
            path = mlflow.artifacts.download_artifacts(artifact_uri=artifact_uri, dst_path=directory, tracking_uri=client.tracking_uri)
            return json.loads(Path(path).read_text())
    except Exception as error:  # missing file, unreadable store, bad JSON: all one line
        raise PopulationError(f"cannot read {what}'s policy at {artifact_uri}: {str(error).splitlines()[0]}") from None


def populations_of(members: list[Member]) -> tuple[str, list[list[Member]]]:
    """Group members by player (in the order given); all must come from one game and every
    player needs at least one."""
    from marl_core.games.openspiel import load_game

    games = sorted({m.game for m in members})
    if len(games) > 1:
        by_game = ", ".join(f"{m.label} ({m.game})" for m in members)
        raise PopulationError(f"members come from different games: {by_game}; pick members of one game")
    game = games[0]
    players = load_game(game).num_players()
    groups = [[m for m in members if m.player == p] for p in range(players)]
    for player, group in enumerate(groups):
        if not group:
            raise PopulationError(f"no member for player {player} of {game}; add --member with a player{player} model")
    return game, groups


def evaluate(game: str, groups: list[list[Member]], evaluator: str, episodes: int, seed: int):
    """Every profile of the populations, by one of marl_core's evaluators; a PayoffTable."""
    from marl_core.empirical_game.evaluation import EVALUATORS
    from marl_core.games.tree import build_tree
    from marl_core.empirical_game.payoffs import PayoffTable

    tree = build_tree(game)
    populations = [np.stack([m.policy for m in group]) for group in groups]
    table = PayoffTable(tree.num_players)
    table.grow(tuple(len(group) for group in groups))
    profiles = table.missing_profiles()
    result = EVALUATORS[evaluator](tree, populations, profiles, episodes=episodes, seed=seed)
    table.record(profiles, result.mean, result.stderr, result.episodes)
    return table


def log_evaluation(client, experiment: str, game: str, groups, table, settings: dict) -> str:
    """A new MLflow run: the settings as params, `payoffs.csv` (PayoffTable's frame, members by
    position) and `members.json` (position -> registry name, version, source run)."""
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    run = client.create_run(experiment_id, run_name=f"evaluate-{game}", tags={"game": game})
    run_id = run.info.run_id
    try:
        for key, value in {"game": game, **settings}.items():
            client.log_param(run_id, key, str(value))
        client.log_text(run_id, table.to_frame().to_csv(index=False), "payoffs.csv")
        members = {
            str(player): [{"name": m.name, "version": m.version, "spec": m.spec.text, "run_id": m.run_id} for m in group]
            for player, group in enumerate(groups)
        }
        client.log_dict(run_id, members, "members.json")
    except Exception:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    return run_id


# --- finished runs -----------------------------------------------------------------------------


def export_run(client, run_id: str, directory: Path) -> dict:
    """Write a finished run's final population and meta-strategy in the export format.

    The summary carries the NashConv and exploitability the run logged at its last iteration,
    so `scripts/verify_export.py` checks the run's own claim against OpenSpiel. Returns the
    summary plus the NashConv recomputed here from the same artifacts.
    """
    from marl_core.games.exploitability import NashConvReport, nash_conv
    from marl_core.psro.export import write_export
    from marl_core.games.tree import build_tree
    from flows.tracking.resume import read_population

    run = _finished_run(client, run_id)
    game = run.data.params.get("game")
    if not game:
        raise PopulationError(f"run {run_id} has no 'game' param; it was not written by `psro run`")
    history = {name: sorted(client.get_metric_history(run_id, name), key=lambda m: m.step) for name in ("nash_conv", "exploitability")}
    if not history["nash_conv"]:
        raise PopulationError(f"run {run_id} logged no nash_conv; it was not written by `psro run`")
    iteration = history["nash_conv"][-1].step
    tree = build_tree(game)
    with tempfile.TemporaryDirectory() as scratch:
        populations, meta_strategy = read_population(client, run_id, game, iteration, scratch)
    logged = NashConvReport(history["nash_conv"][-1].value, history["exploitability"][-1].value, [], [])
    config = SimpleNamespace(game=game, meta_solver=run.data.params.get("meta_solver"), oracle=run.data.params.get("oracle"))
    wall = ((run.info.end_time or run.info.start_time) - run.info.start_time) / 1000
    write_export(directory, config, populations, meta_strategy, logged, iteration, wall)
    recomputed = nash_conv(tree, populations, meta_strategy)
    return {"game": game, "iterations": iteration, "population_sizes": [len(p) for p in populations],
            "logged": logged, "recomputed": recomputed}


def _finished_run(client, run_id: str):
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise PopulationError(f"no MLflow run {run_id!r} in {client.tracking_uri}; run ids are listed in MLflow's UI and by `mlflow runs list`") from None
    if run.info.status != "FINISHED":
        raise PopulationError(f"run {run_id} is {run.info.status}; only a FINISHED run can be exported")
    return run
