"""Resuming a PSRO run from what its MLflow run already holds.

Every iteration's results are written as artifacts (payoff table, meta-strategy, new members),
then registered, and only then is the run tagged ``psro.committed_iteration = N``: the tag is
the commit. A run killed at any point therefore resumes from the last committed iteration, whose
artifacts are complete, and anything a later, unfinished iteration left behind is ignored (and
its half-registered members removed by the tracker).

Nothing is unpickled: the config is JSON, payoffs CSV, meta-strategies JSON, and members are
stored by `marl_core.policies.storage` (tables as JSON, networks as a JSON description and a
weights-only state_dict). JSON and CSV round-trip floats exactly and a state_dict holds the
tensors themselves, so a resumed run continues from the same numbers an uninterrupted run would
have.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from flows.tracking import layout
from flows.tracking.patient import mlflow_client
from marl_core.empirical_game.game import PSROGame, psro_game_of
from marl_core.empirical_game.payoffs import PayoffTable
from marl_core.policies.population import Population


class ResumeError(ValueError):
    """A run that cannot be resumed; one line naming the run and the reason."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    run_id: str
    config: dict  # the run's settings, as logged
    iteration: int  # the last committed iteration
    populations: list[Population]  # in the game's role order
    payoffs: PayoffTable
    meta_strategy: list[np.ndarray]  # per role [K]


def open_client(tracking_uri: str):
    """A client of the store at `tracking_uri` for reading what a run committed. A SQLite store
    that does not exist holds no run: it is not created (MLflow would make a new database)."""
    from flows.tracking.layout import sqlite_path

    path = sqlite_path(tracking_uri)
    if path is not None and not path.is_file():
        raise ResumeError(f"no MLflow store at {tracking_uri} (no file {str(path)!r})")
    return mlflow_client(tracking_uri)


def _read_json(client, run_id: str, path: str, scratch: str):
    return json.loads(Path(client.download_artifacts(run_id, path, scratch)).read_text())


def logged_config(client, run_id: str) -> dict:
    """The settings the run logged when it started."""
    with tempfile.TemporaryDirectory() as scratch:
        return _read_json(client, run_id, layout.CONFIG_ARTIFACT, scratch)


def find_resumable(scenario, config) -> str | None:
    """The newest unfinished run of the scenario in the config's experiment that computes the
    same thing (equal settings, but for how and how long it runs) and committed a step."""
    settings = scenario.settings(config)
    client = open_client(settings.tracking_uri)
    experiment = client.get_experiment_by_name(settings.experiment)
    if experiment is None:
        return None
    ignored = scenario.operational | {scenario.steps_setting}

    def computed(values: dict) -> dict:
        kept = {k: v for k, v in values.items() if k not in ignored}
        section = scenario.settings_section  # PBT keeps the common settings in its marl section
        if section and isinstance(kept.get(section), dict):
            kept[section] = computed(kept[section])
        return kept

    wanted = computed(config.model_dump(mode="json"))
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
    for run in runs:
        if run.info.status == "FINISHED" or scenario.commit_tag not in run.data.tags:
            continue
        if computed(logged_config(client, run.info.run_id)) == wanted:
            return run.info.run_id
    return None


def resumed_step(scenario, config, run_id: str) -> int:
    """The last step run `run_id` (found by `find_resumable`) committed."""
    return committed_step(open_client(scenario.settings(config).tracking_uri), run_id, scenario)


def find_tagged(tracking_uri: str, experiment: str, key: str, value: str, commit_tag: str) -> str | None:
    """The run of `experiment` tagged ``key=value`` that committed a step (`commit_tag`).

    A run that committed nothing has nothing to continue from; whoever looks it up starts anew.
    """
    client = open_client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs([found.experiment_id], filter_string=f"tags.`{key}` = '{value}'")
    return next((run.info.run_id for run in runs if commit_tag in run.data.tags), None)


def committed_run(client, run_id: str, tag: str, nothing_committed: str):
    """Run `run_id`, which some scenario's commit `tag` must mark; a one-line ResumeError if
    there is no such run, or `nothing_committed` if it never committed."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise ResumeError(f"no MLflow run {run_id!r} in {client.tracking_uri}") from None
    if tag not in run.data.tags:
        raise ResumeError(nothing_committed)
    return run


def committed_step(client, run_id: str, scenario) -> int:
    """The last step run `run_id` committed, which must be one of `scenario`'s runs."""
    command = "psro run" if scenario.name == "psro" else f"psro {scenario.name} run"
    nothing = f"run {run_id} has no committed {scenario.step_noun} to resume from (was it a `{command}`?)"
    return int(committed_run(client, run_id, scenario.commit_tag, nothing).data.tags[scenario.commit_tag])


def committed_iteration(run) -> int | None:
    value = run.data.tags.get(layout.COMMITTED_TAG)
    return int(value) if value is not None else None


def load_checkpoint(tracking_uri: str, run_id: str) -> Checkpoint:
    client = open_client(tracking_uri)
    nothing = f"run {run_id} committed no iteration; start it again with `psro run`"
    iteration = committed_iteration(committed_run(client, run_id, layout.COMMITTED_TAG, nothing))
    with tempfile.TemporaryDirectory() as scratch:
        config = _read_json(client, run_id, layout.CONFIG_ARTIFACT, scratch)
        populations, payoffs, meta_strategy = read_iteration(client, run_id, config, iteration, scratch)
    return Checkpoint(run_id, config, iteration, populations, payoffs, meta_strategy)


def game_of_logged(config: dict) -> PSROGame:
    """The PSROGame of a run's logged settings (its game and, where it had them, its roles)."""
    return psro_game_of(SimpleNamespace(**config))


def table_key(game: PSROGame, role: str) -> tuple[str | None, int | None]:
    """The (OpenSpiel game, player) whose information states key a `role` member's table, as
    `marl_core.policies.storage` takes them: on an OpenSpiel game the roles are its players, in
    order. Other environments have no tables: (None, None)."""
    return (game.name, game.roles.index(role)) if game.is_openspiel else (None, None)


def read_population(
    client, run_id: str, config: dict, iteration: int, scratch: str
) -> tuple[list[Population], list[np.ndarray]]:
    """The meta-strategies iteration `iteration` solved and the population members they weigh."""
    game = game_of_logged(config)
    meta = _read_json(client, run_id, layout.meta_strategy_path(iteration), scratch)
    meta_strategy = [np.asarray(meta[role], dtype=np.float64) for role in game.roles]
    populations = [
        Population.of(role, [read_member(client, run_id, game, role, k, scratch) for k in range(len(weights))])
        for role, weights in zip(game.roles, meta_strategy)
    ]
    return populations, meta_strategy


def read_member(client, run_id: str, game: PSROGame, role: str, member: int, scratch: str):
    from marl_core.policies.storage import load_policy

    # a folder of its own: a downloaded folder may land under its last path part (member_<k>), as every role's does
    folder = client.download_artifacts(run_id, layout.member_path(role, member), tempfile.mkdtemp(dir=scratch))
    return load_policy(folder, *table_key(game, role))


def read_iteration(client, run_id: str, config: dict, iteration: int, scratch: str):
    """Populations, payoff table and meta-strategies exactly as iteration `iteration` left them."""
    populations, meta_strategy = read_population(client, run_id, config, iteration, scratch)
    frames = [
        # the default parser may round the last bit; round_trip reads back exactly what was written
        pd.read_csv(client.download_artifacts(run_id, layout.payoffs_path(i), scratch), float_precision="round_trip")
        for i in range(iteration + 1)
    ]
    payoffs = PayoffTable.from_frame(pd.concat(frames, ignore_index=True))
    return populations, payoffs, meta_strategy
