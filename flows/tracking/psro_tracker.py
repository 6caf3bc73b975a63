"""MLflow tracking of a PSRO run (a `ScenarioTracker`): params, per-iteration metrics and artifacts, plots, registry.

One MLflow run per PSRO run. Every MLflow call happens on a single background thread: the
driver only snapshots what an iteration produced and moves on, so tracking costs the run almost
no wall time. `finish` (or leaving the context) waits for the queue to drain and re-raises any
tracking error.

Registry: one registered model per role, one version per population member: the member's folder
as `marl_core.policies.storage` writes it (a table as JSON, a network as its JSON description
and weights-only state_dict), which loads without unpickling anything. Where things go and what
they are called is `flows.tracking.layout`'s.
"""

from __future__ import annotations

import tempfile

from flows.tracking import layout, plots
from flows.tracking.resume import table_key
from flows.tracking.scenario_tracker import ScenarioTracker
from marl_core.empirical_game.game import psro_game_of

# The per-iteration metrics (`IterationRecord.metrics`) the end of a run plots against the iteration.
CURVES = ("exploitability", "nash_conv", "approx_exploitability", "approx_exploitability_stderr", "elapsed_seconds")


def running_seconds(elapsed: list[float]) -> list[float]:
    """Each iteration's `elapsed_seconds` (counted from its process's start) on one clock: a
    resumed process's count starts again, so it goes on from where the last one stopped."""
    clock, offset, previous = [], 0.0, None
    for seconds in elapsed:
        if previous is not None and seconds < previous:
            offset = clock[-1]
        clock.append(offset + seconds)
        previous = seconds
    return clock


class PSROTracker(ScenarioTracker):
    """Tracks a new PSRO run, or with `resume` (a `flows.runtime.run.Resumed`) continues one.

    Every iteration is committed. A member is never changed once it joined its population
    (`Population.added` makes a new population), so the tracking thread may store it while the
    run goes on.
    """

    commit_tag = layout.COMMITTED_TAG

    def __init__(self, config, resume=None, tags: dict[str, str] | None = None):
        super().__init__(config, config.tracking_uri, config.experiment, resume, tags)
        self.game = psro_game_of(config)
        self._history: list = []
        # a resumed run's committed CURVES points: name -> step -> value
        self._earlier: dict[str, dict[int, float]] = {}
        self._versions: dict[tuple[str, int], str] = {}  # (role, member) -> registry version
        self._logged_sizes: tuple[int, ...] = (0,) * self.game.num_roles  # payoff rows already logged
        if resume is not None:  # committed members are registered, their payoffs logged
            self._logged_sizes = resume.state.payoffs.sizes
            for population in resume.state.populations:
                self._versions.update({(population.role, member): "" for member in range(len(population))})

    def log_iteration(self, record, state) -> None:
        """An iteration, committed (what a PSRO run does with every one)."""
        self.log_step(record.iteration, record, state, state)

    # --- driver side: cheap snapshots, work queued ---------------------------------------------

    def _snapshot(self, index, record, state, committed):
        """`state.populations` is a list of `Population`, in the game's role order."""
        self._history.append(record)
        new_members = [
            (population.role, member, population.members[member])
            for population in state.populations
            for member in range(len(population))
            if (population.role, member) not in self._versions
        ]
        for role, member, _ in new_members:
            self._versions[(role, member)] = ""  # reserved; filled by the tracking thread
        frame = state.payoffs.to_frame(beyond=self._logged_sizes)  # only this iteration's entries
        self._logged_sizes = state.payoffs.sizes
        return record, frame, new_members

    def _final(self, state):
        return state.payoffs.mean.copy(), [m.copy() for m in state.meta_strategy], state.payoffs.to_frame()

    # --- tracking thread -----------------------------------------------------------------------

    def run_name(self) -> str:
        return f"psro-{self.config.game}-{self.config.meta_solver}"

    def run_tags(self) -> dict[str, str]:
        return {"game": self.config.game, "oracle": self.config.oracle, "meta_solver": self.config.meta_solver}

    def _created(self) -> None:
        from flows.tracking.scenario_tracker import ensure_registered_model

        self.artifact_uri = self.client.get_run(self.run_id).info.artifact_uri
        if self.config.register_models:
            for role in self.game.roles:
                name = self._model_name(role)
                ensure_registered_model(self.client, name, f"PSRO population members for {name}")

    def _model_name(self, role: str) -> str:
        return layout.registered_model_name(self.config.experiment, self.config.game, role)

    def _reopened(self, committed: int) -> None:
        """Forget what an unfinished iteration registered after the last commit."""
        self.artifact_uri = self.client.get_run(self.run_id).info.artifact_uri
        if self.config.register_models:
            for population in self.resume.state.populations:
                name = self._model_name(population.role)
                for version in self.client.search_model_versions(layout.versions_of_run(name, self.run_id)):
                    member = layout.VersionTags.of(version.tags).member
                    if member < len(population):
                        self._versions[(population.role, member)] = version.version
                    else:
                        self.client.delete_model_version(name, version.version)
        self._earlier = {
            name: {m.step: m.value for m in self.client.get_metric_history(self.run_id, name) if m.step <= committed}
            for name in CURVES
        }

    def _log(self, index: int, snapshot) -> None:
        record, _, _ = snapshot
        self._log_metrics(index, record.metrics())

    def _store(self, index: int, snapshot) -> None:
        """The iteration's payoff entries, meta-strategy and new members (registered)."""
        record, frame, new_members = snapshot
        self.client.log_text(self.run_id, frame.to_csv(index=False), layout.payoffs_path(index))
        meta = dict(zip(self.game.roles, record.meta_strategy))
        self.client.log_dict(self.run_id, meta, layout.meta_strategy_path(index))
        for role, member, policy in new_members:
            path = layout.member_path(role, member)
            self._log_member(role, policy, path)
            if self.config.register_models:
                self._register(role, member, index, meta[role][member], path)

    def _log_member(self, role: str, policy, path: str) -> None:
        """The member's folder as `storage.save_policy` writes it: weights only, no pickles."""
        from marl_core.policies.storage import save_policy

        with tempfile.TemporaryDirectory() as directory:
            save_policy(directory, policy, *table_key(self.game, role))
            self.client.log_artifacts(self.run_id, directory, path)

    def _register(self, role: str, member: int, iteration: int, weight: float, path: str) -> None:
        name = self._model_name(role)
        tags = layout.VersionTags(self.run_id, self.config.game, role, member, iteration, weight)
        version = self.client.create_model_version(
            name, f"{self.artifact_uri}/{path}", run_id=self.run_id, tags=tags.as_tags()
        )
        self.client.set_registered_model_alias(name, layout.NEWEST_ALIAS, version.version)
        self._versions[(role, member)] = version.version

    def _finish(self, final) -> None:
        payoff_mean, meta_strategy, frame = final
        self.client.log_text(self.run_id, frame.to_csv(index=False), layout.FINAL_PAYOFFS)
        curves = self._curves()
        exact, approx = curves["exploitability"], curves["approx_exploitability"]
        title = f"PSRO on {self.config.game} ({self.config.meta_solver})"
        if exact:  # exploitability needs a game tree; an environment without one has no curve
            steps = sorted(exact)
            figure = plots.exploitability_curve(
                steps, [exact[s] for s in steps], [curves["nash_conv"].get(s, float("nan")) for s in steps], title=title
            )
            self.client.log_figure(self.run_id, figure, layout.EXPLOITABILITY_PLOT)
            plots.close(figure)
            timed = [s for s in steps if s in curves["elapsed_seconds"]]
            figure = plots.exploitability_against_time(
                running_seconds([curves["elapsed_seconds"][s] for s in timed]), [exact[s] for s in timed], title=title
            )
            self.client.log_figure(self.run_id, figure, layout.EXPLOITABILITY_TIME_PLOT)
            plots.close(figure)
        if approx:  # measured every few iterations where the run learns responses to estimate it
            steps = sorted(approx)
            figure = plots.approx_exploitability_curve(
                steps,
                [approx[s] for s in steps],
                [curves["approx_exploitability_stderr"][s] for s in steps],
                title=title,
                exact=(sorted(exact), [exact[s] for s in sorted(exact)]) if exact else None,
            )
            self.client.log_figure(self.run_id, figure, layout.APPROX_EXPLOITABILITY_PLOT)
            plots.close(figure)
        figure = plots.payoff_heatmap(payoff_mean, meta_strategy, title=f"Payoffs, {self.config.game}")
        self.client.log_figure(self.run_id, figure, layout.PAYOFF_HEATMAP)
        plots.close(figure)
        if self.config.register_models:  # final meta-weights replace the ones at registration
            weights = dict(zip(self.game.roles, meta_strategy))
            for (role, member), version in self._versions.items():
                weight = layout.meta_weight_tag(weights[role][member])
                self.client.set_model_version_tag(self._model_name(role), version, layout.META_WEIGHT_TAG, weight)

    def _curves(self) -> dict[str, dict[int, float]]:
        """Name -> iteration -> value of each of CURVES the run logged: a resumed run's committed
        points, then this process's iterations."""
        curves = {name: dict(self._earlier.get(name, {})) for name in CURVES}
        for record in self._history:
            metrics = record.metrics()
            for name in CURVES:
                if name in metrics:
                    curves[name][record.iteration] = metrics[name]
        return curves
