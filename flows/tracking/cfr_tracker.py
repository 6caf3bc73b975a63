"""MLflow tracking of a neural CFR run, and resuming one from what it committed.

Per round, on one background thread (`BackgroundTracker`): the members' exact exploitability and
the round's training figures. Per commit: the solver's whole state in one of two slots, each
player's average-policy network as a population member and a registry version, and last the
commit tag. A run killed anywhere in that sequence resumes from the last tag: the slot it names
was complete before the tag was written, and registry versions of later rounds are deleted
first, so none is registered twice. Where things go is `flows.tracking.layout`'s.

Nothing is unpickled on resume: the solver's state loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from flows.tracking import layout, plots
from flows.tracking.psro_tracker import running_seconds
from flows.tracking.resume import ResumeError
from flows.tracking.scenario_tracker import ScenarioTracker, ensure_registered_model

ROLES = ("player_0", "player_1")


def load_solver_state(client, run_id: str, committed: int, config) -> dict:
    """The solver's state round `committed` of run `run_id` committed; a ResumeError in one
    line if its slot holds another round."""
    import torch

    with tempfile.TemporaryDirectory() as directory:
        slot = client.download_artifacts(run_id, layout.checkpoint_slot(committed, config.checkpoint_every), directory)
        state = torch.load(Path(slot) / layout.CFR_SOLVER_FILE, weights_only=True)
    expected = (committed + 1) * config.iterations_per_round
    if int(state["iteration"]) != expected:
        raise ResumeError(
            f"run {run_id}: its checkpoint holds iteration {int(state['iteration'])}, "
            f"its commit tag says round {committed} (iteration {expected})"
        )
    return state


class CFRTracker(ScenarioTracker):
    """Every round's metrics; every `checkpoint_every` rounds the solver's state and both
    members, then the commit."""

    commit_tag = layout.CFR_COMMITTED_TAG
    commit_waits = True

    def __init__(self, config, resume=None, tags: dict[str, str] | None = None):
        super().__init__(config, config.tracking_uri, config.experiment, resume, tags)
        self._curves: dict[str, dict[int, float]] = {"exploitability": {}, "nash_conv": {}, "elapsed_seconds": {}}

    def _snapshot(self, index, record, state, committed):
        """`committed`: the solver's state dict and its two average-policy networks (copies)."""
        return record, committed

    def _final(self, state):
        return None

    # --- the tracking thread ------------------------------------------------------------------

    def run_name(self) -> str:
        return f"neural-cfr-{self.config.game}"

    def run_tags(self) -> dict[str, str]:
        return {"game": self.config.game}

    def _model_name(self, role: str) -> str:
        return layout.registered_model_name(self.config.experiment, self.config.game, role)

    def _created(self) -> None:
        for role in ROLES:
            ensure_registered_model(self.client, self._model_name(role), f"neural CFR members of {self.config.game}")

    def _reopened(self, committed: int) -> None:
        self._delete_versions_after(committed, [self._model_name(role) for role in ROLES], "iteration")
        for name, points in self._curves.items():
            for metric in self.client.get_metric_history(self.run_id, name):
                if metric.step <= committed:
                    points[metric.step] = metric.value

    def _log(self, index: int, snapshot) -> None:
        record, _ = snapshot
        metrics = record.metrics()
        for name, points in self._curves.items():
            if name in metrics:
                points[index] = metrics[name]
        self._log_metrics(index, metrics)

    def _store(self, index: int, snapshot) -> None:
        import torch

        from marl_core.neural_cfr.export import as_member
        from marl_core.policies.storage import save_policy

        _, (state, networks) = snapshot
        config = self.config
        with tempfile.TemporaryDirectory() as directory:
            solver = Path(directory) / "slot" / layout.CFR_SOLVER_FILE
            solver.parent.mkdir()
            torch.save(state, solver)
            self.client.log_artifacts(
                self.run_id, str(solver.parent), layout.checkpoint_slot(index, config.checkpoint_every)
            )
        artifact_uri = self.client.get_run(self.run_id).info.artifact_uri
        for player, (role, network) in enumerate(zip(ROLES, networks)):
            path = layout.member_path(role, index)
            with tempfile.TemporaryDirectory() as directory:
                save_policy(directory, as_member(network, config.game, player, config.exact), config.game, player)
                self.client.log_artifacts(self.run_id, directory, path)
            tags = layout.VersionTags(self.run_id, config.game, role, index, index, 1.0)
            version = self.client.create_model_version(
                self._model_name(role), f"{artifact_uri}/{path}", run_id=self.run_id, tags=tags.as_tags()
            )
            self.client.set_registered_model_alias(self._model_name(role), layout.NEWEST_ALIAS, version.version)

    def _finish(self, final) -> None:
        exact, elapsed = self._curves["exploitability"], self._curves["elapsed_seconds"]
        if not exact:
            return
        title = f"Neural CFR on {self.config.game}"
        rounds = sorted(exact)
        nash_conv = [self._curves["nash_conv"].get(r, float("nan")) for r in rounds]
        figure = plots.exploitability_curve(rounds, [exact[r] for r in rounds], nash_conv, title, xlabel="round")
        self.client.log_figure(self.run_id, figure, layout.EXPLOITABILITY_PLOT)
        plots.close(figure)
        timed = [r for r in rounds if r in elapsed]
        seconds = running_seconds([elapsed[r] for r in timed])
        figure = plots.exploitability_against_time(seconds, [exact[r] for r in timed], title)
        self.client.log_figure(self.run_id, figure, layout.EXPLOITABILITY_TIME_PLOT)
        plots.close(figure)
