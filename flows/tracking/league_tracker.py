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
import tempfile
from pathlib import Path

from flows.tracking import layout
from flows.tracking.resume import ResumeError
from flows.tracking.scenario_tracker import ScenarioTracker, ensure_registered_model


def load_league_state(config, client, run_id: str, generation: int):
    """The `LeagueState` that generation `generation` of run `run_id` committed."""
    import torch

    from marl_core.empirical_game.game import psro_game_of
    from marl_core.league.generation import LeagueState
    from marl_core.league.players import League
    from marl_core.league.ratings import Ratings
    from marl_core.pbt.schedule import LineageEntry
    from marl_core.policies.storage import load_policy

    game = psro_game_of(config)
    with tempfile.TemporaryDirectory() as directory:
        slot = Path(client.download_artifacts(run_id, layout.league_checkpoint_path(generation), directory))
        saved = torch.load(slot / layout.LEAGUE_CHECKPOINT_FILE, weights_only=True)
        if saved["generation"] != generation:
            raise ResumeError(
                f"run {run_id}: its checkpoint holds generation {saved['generation']}, its commit tag says {generation}"
            )
        league = League.from_state(config.league, saved["league"])
        members_root = Path(client.download_artifacts(run_id, "league/members", directory))

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
        generation,
        json.loads(saved["settings"]),
        lineage,
    )


class LeagueTracker(ScenarioTracker):
    """Every generation committed: its metrics, tables, new snapshots and checkpoint slot; a
    new run's generation 0 (the seeded league) first."""

    commit_tag = layout.LEAGUE_COMMITTED_TAG

    def __init__(self, config, resume=None, tags: dict[str, str] | None = None):
        super().__init__(config, config.tracking_uri, config.experiment, resume, tags)

    def begin(self, state) -> None:
        """A new run's generation 0: the seeded league, its snapshots registered."""
        if self.resume is None:
            self._raise_failures()
            self._submit(self._log_step, 0, ({}, state, [s.id for s in state.league.snapshots]), True)

    def _snapshot(self, index, record, state, committed):
        """`state` is the generation's own (`run_generation` never changes one it returned)."""
        return record.metrics(), state, record.snapshots

    # --- the tracking thread ------------------------------------------------------------------

    def run_name(self) -> str:
        return f"league-{self.config.game}-{self.config.algorithm}"

    def run_tags(self) -> dict[str, str]:
        return {"game": self.config.game, "algorithm": self.config.algorithm}

    def _reopened(self, committed: int) -> None:
        """Registry versions of a generation that never committed would be registered again."""
        names = [layout.registered_model_name(self.config.experiment, self.config.game, r) for r in self._roles()]
        self._delete_versions_after(committed, names, "iteration")

    def _log(self, index: int, snapshot) -> None:
        self._log_metrics(index, snapshot[0])

    def _roles(self) -> tuple[str, ...]:
        from marl_core.empirical_game.game import psro_game_of

        return psro_game_of(self.config).roles

    def _store(self, generation: int, snapshot) -> None:
        import pandas as pd
        import torch

        _, state, snapshots = snapshot
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

    def _finish(self, state) -> None:
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
