"""MLflow tracking of a league run, and resuming one from what it committed.

Per generation, on one background thread (`BackgroundTracker`): the generation's metrics, its
match table and ratings as CSV, each new snapshot's policies (weights only) registered as
versions that `psro evaluate` and `psro ratings` read like PSRO members, then the checkpoint
(league, ratings, trainer states, the learning players' current members) in one of two slots,
and last the commit tag. A run killed anywhere in that sequence resumes from the last tag: the
slot it names was complete before the tag was written, and registry versions of generations
after it are deleted first, so none is registered twice. Where things go is
`flows.tracking.layout`'s.

Nothing is unpickled on resume: the checkpoint holds only tensors and plain containers and is
loaded with `torch.load(weights_only=True)`; members load through `marl_core.policies.storage`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import tempfile
from pathlib import Path

from flows.tracking import layout
from flows.tracking.background import BackgroundTracker
from flows.tracking.resume import ResumeError, committed_run
from flows.tracking.run_tracker import create_run, ensure_registered_model

# Fault injection for tests: SIGKILL the process once generation N's snapshots are registered
# and its checkpoint written, before N is committed.
KILL_BEFORE_COMMIT = "LEAGUE_KILL_BEFORE_COMMIT"


@dataclasses.dataclass(frozen=True)
class LeagueCheckpoint:
    run_id: str
    config: dict  # as the run logged it
    generation: int  # the last committed generation


def committed_league(tracking_uri: str, run_id: str) -> LeagueCheckpoint:
    """Which league run `run_id` is and how far it got; a ResumeError in one line if it is none."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    what = f"run {run_id} has no committed generation to resume from (was it a `psro league run`?)"
    run = committed_run(client, run_id, layout.LEAGUE_COMMITTED_TAG, what)
    with tempfile.TemporaryDirectory() as directory:
        config = json.loads(Path(client.download_artifacts(run_id, layout.CONFIG_ARTIFACT, directory)).read_text())
    return LeagueCheckpoint(run_id, config, int(run.data.tags[layout.LEAGUE_COMMITTED_TAG]))


def load_league_state(config, checkpoint: LeagueCheckpoint):
    """The `LeagueState` that generation `checkpoint.generation` committed."""
    import mlflow
    import torch

    from marl_core.league.generation import LeagueState
    from marl_core.league.players import League
    from marl_core.league.ratings import Ratings
    from marl_core.pbt.schedule import LineageEntry
    from marl_core.policies.storage import load_policy
    from marl_core.psro.game import psro_game_of

    game = psro_game_of(config)
    client = mlflow.MlflowClient(tracking_uri=config.tracking_uri)
    with tempfile.TemporaryDirectory() as directory:
        slot = Path(
            client.download_artifacts(
                checkpoint.run_id, layout.league_checkpoint_path(checkpoint.generation), directory
            )
        )
        saved = torch.load(slot / layout.LEAGUE_CHECKPOINT_FILE, weights_only=True)
        if saved["generation"] != checkpoint.generation:
            raise ResumeError(
                f"run {checkpoint.run_id}: its checkpoint holds generation {saved['generation']}, its commit tag says {checkpoint.generation}"
            )
        league = League.from_state(config.league, saved["league"])
        members_root = Path(client.download_artifacts(checkpoint.run_id, "league/members", directory))

        def load(root: Path, id: str) -> tuple:
            return tuple(load_policy(root / id / role, config.game, r) for r, role in enumerate(game.roles))

        members = {s.id: load(members_root, s.id) for s in league.snapshots}
        members.update({p.id: load(slot / "members", p.id) for p in league.players})
    trainers = {player: tuple(states) for player, states in saved["trainers"].items()}
    lineage = [LineageEntry(**e) for e in json.loads(saved["lineage"])]
    return LeagueState(
        league,
        Ratings.from_state(saved["ratings"]),
        members,
        trainers,
        checkpoint.generation,
        json.loads(saved["settings"]),
        lineage,
    )


class LeagueTracker(BackgroundTracker):
    def __init__(self, config, resume: LeagueCheckpoint | None = None):
        super().__init__()
        self.config = config
        self.resume = resume
        self.run_id: str | None = None

    def commit_seed(self, state) -> None:
        """A new run's generation 0: the seeded league, its snapshots registered."""
        self._raise_failures()
        self._submit(self._commit, 0, state, [s.id for s in state.league.snapshots], {})

    def log_generation(self, record, state) -> None:
        """`state` is the generation's own (`run_generation` never changes one it returned)."""
        self._raise_failures()
        self._submit(self._commit, record.generation, state, record.snapshots, record.metrics())

    def finish(self, state) -> None:
        self._submit(self._plot, state)
        self._drain()

    # --- the tracking thread ------------------------------------------------------------------

    def _start(self) -> None:
        import mlflow

        config = self.config
        self.client = mlflow.MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)
        if self.resume is not None:
            self.run_id = self.resume.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            self._forget_uncommitted(self.resume.generation)
            return
        self.run_id = create_run(
            self.client,
            config,
            f"league-{config.game}-{config.algorithm}",
            {"game": config.game, "algorithm": config.algorithm, "scenario": "league"},
        )

    def _forget_uncommitted(self, committed: int) -> None:
        """Registry versions of a generation that never committed would be registered again."""
        for role in self._roles():
            name = layout.registered_model_name(self.config.experiment, self.config.game, role)
            for version in self.client.search_model_versions(layout.versions_of_run(name, self.run_id)):
                if int(version.tags.get("iteration", -1)) > committed:
                    self.client.delete_model_version(name, version.version)

    def _roles(self) -> tuple[str, ...]:
        from marl_core.psro.game import psro_game_of

        return psro_game_of(self.config).roles

    def _commit(self, generation: int, state, snapshots: list[str], metrics: dict) -> None:
        import time

        import pandas as pd
        import torch
        from mlflow.entities import Metric

        if metrics:
            now = int(time.time() * 1000)
            self.client.log_batch(
                self.run_id, metrics=[Metric(k, float(v), now, generation) for k, v in metrics.items()]
            )
        with tempfile.TemporaryDirectory() as directory:
            root = Path(directory)
            tables = root / "tables"
            tables.mkdir()
            pd.DataFrame(state.league.table.rows()).to_csv(tables / "match_table.csv", index=False)
            pd.DataFrame(state.ratings.table()).to_csv(tables / "ratings.csv", index=False)
            if self.config.pbt is not None:  # who copied whom, when, with what values: the whole lineage so far
                lineage = [dataclasses.asdict(e) for e in state.lineage]
                (tables / "lineage.json").write_text(json.dumps(lineage, indent=1))
            self.client.log_artifacts(self.run_id, str(tables), layout.league_generation_path(generation))
            for snapshot in snapshots:
                self._store_snapshot(root, state, snapshot)
            slot = root / "slot"
            saved = {
                "generation": generation,
                "league": state.league.state(),
                "ratings": state.ratings.state(),
                "trainers": {player: list(states) for player, states in state.trainers.items()},
                "settings": json.dumps(state.settings),
                "lineage": json.dumps([dataclasses.asdict(e) for e in state.lineage]),
            }
            self._save_members(slot / "members", state, [p.id for p in state.league.players])
            torch.save(saved, slot / layout.LEAGUE_CHECKPOINT_FILE)
            self.client.log_artifacts(self.run_id, str(slot), layout.league_checkpoint_path(generation))
        if os.environ.get(KILL_BEFORE_COMMIT) == str(generation):
            os.kill(os.getpid(), signal.SIGKILL)
        self.client.set_tag(self.run_id, layout.LEAGUE_COMMITTED_TAG, str(generation))  # last: the commit

    def _save_members(self, root: Path, state, ids: list[str]) -> None:
        from marl_core.policies.storage import save_policy

        for id in ids:
            for r, role in enumerate(self._roles()):
                save_policy(root / id / role, state.members[id][r], self.config.game, r)

    def _store_snapshot(self, root: Path, state, snapshot_id: str) -> None:
        folder = root / "members"
        self._save_members(folder, state, [snapshot_id])
        snapshot = next(s for s in state.league.snapshots if s.id == snapshot_id)
        index = state.league.snapshots.index(snapshot)
        artifact_uri = self.client.get_run(self.run_id).info.artifact_uri
        for role in self._roles():
            path = layout.league_member_path(snapshot_id, role)
            self.client.log_artifacts(self.run_id, str(folder / snapshot_id / role), path)
            if not self.config.register_models:
                continue
            name = layout.registered_model_name(self.config.experiment, self.config.game, role)
            ensure_registered_model(self.client, name, f"league snapshots of {self.config.game}, role {role}")
            tags = layout.VersionTags(
                self.run_id, self.config.game, role, index, snapshot.generation, float("nan")
            ).as_tags()
            tags.update(snapshot=snapshot.id, parent=snapshot.parent, kind=snapshot.kind)
            version = self.client.create_model_version(name, f"{artifact_uri}/{path}", run_id=self.run_id, tags=tags)
            self.client.set_registered_model_alias(name, layout.NEWEST_ALIAS, version.version)

    def _plot(self, state) -> None:
        import matplotlib.pyplot as plt

        from flows.tracking import plots

        players = [p.id for p in state.league.players]
        curves = {}
        for player in players:
            mu = self.client.get_metric_history(self.run_id, f"rating/{player}/mu")
            sigma = {m.step: m.value for m in self.client.get_metric_history(self.run_id, f"rating/{player}/sigma")}
            points = sorted((m.step, m.value, sigma.get(m.step, 0.0)) for m in mu)
            if points:
                curves[player] = tuple(map(list, zip(*points)))
        figures = {}
        if curves:
            figures[layout.RATINGS_PLOT] = plots.ratings_curve(curves, f"league ratings on {self.config.game}")
        everyone = state.league.table.players
        figures[layout.WIN_RATE_HEATMAP] = plots.win_rate_heatmap(
            state.league.table.win_rate_matrix(everyone), everyone, f"win rates on {self.config.game}"
        )
        for main in (p.id for p in state.league.of_kind("main_agent")):
            history = sorted(
                (m.step, m.value) for m in self.client.get_metric_history(self.run_id, f"{main}/exploitability")
            )
            if history:
                generations, values = zip(*history)
                figures[layout.EXPLOITABILITY_PLOT] = plots.exploitability_curve(
                    generations,
                    values,
                    [2 * v for v in values],
                    f"{main}'s exploitability on {self.config.game}",
                    xlabel="generation",
                )
                break
        for path, figure in figures.items():
            self.client.log_figure(self.run_id, figure, path)
            plt.close(figure)

    def _end(self, status: str) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status)
