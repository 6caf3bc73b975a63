"""MLflow tracking of a PSRO run: params, per-iteration metrics and artifacts, plots, registry.

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

import os
import signal
import tempfile

import numpy as np

from flows.tracking import layout, plots
from flows.tracking.background import BackgroundTracker
from flows.tracking.resume import table_key
from marl_core.pbt.settings import dotted
from marl_core.psro.game import psro_game_of

# Fault injection for tests: SIGKILL the process that tracks the run once iteration N's members
# are registered and before N is committed, the window whose leftovers resume must clean up.
KILL_BEFORE_COMMIT = "PSRO_KILL_BEFORE_COMMIT"

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


def create_run(client, config, run_name: str, tags: dict[str, str], experiment_name: str | None = None) -> str:
    """A new MLflow run in `experiment_name` (default the config's experiment; made if missing),
    with the settings as flat params and as `config.json` (what resume reads back); returns its id."""
    from mlflow.entities import Param

    experiment_name = experiment_name or config.experiment
    experiment = client.get_experiment_by_name(experiment_name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(experiment_name)
    run_id = client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
    params = [Param(key, str(value)) for key, value in dotted(config.model_dump()).items()]
    client.log_batch(run_id, params=params)
    client.log_dict(run_id, config.model_dump(mode="json"), layout.CONFIG_ARTIFACT)
    return run_id


def ensure_registered_model(client, name: str, description: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description=description)


def prepare_store(tracking_uri: str) -> None:
    """Create the store's schema ahead of the run (a new SQLite store takes seconds)."""
    import mlflow

    mlflow.MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1)


class RunTracker(BackgroundTracker):
    """Tracks a new run, or with `resume` (a `flows.tracking.resume.Checkpoint`) continues one.

    `tags` go on a new run: what its caller needs to find it again (see `flows.tracking.resume.find_tagged`).
    A member is never changed once it joined its population (`Population.added` makes a new
    population), so the tracking thread may store it while the run goes on.
    """

    def __init__(self, config, resume=None, tags: dict[str, str] | None = None):
        super().__init__()
        self.config = config
        self.game = psro_game_of(config)
        self.resume = resume
        self.tags = tags or {}
        self.run_id: str | None = None
        self._history: list = []
        self._earlier: dict[
            str, dict[int, float]
        ] = {}  # a resumed run's committed CURVES points: name -> step -> value
        self._versions: dict[tuple[str, int], str] = {}  # (role, member) -> registry version
        self._logged_sizes: tuple[int, ...] = (0,) * self.game.num_roles  # payoff rows already logged
        if resume is not None:  # committed members are registered, their payoffs logged
            self._logged_sizes = resume.payoffs.sizes
            for population in resume.populations:
                self._versions.update({(population.role, member): "" for member in range(len(population))})

    # --- driver side: cheap snapshots, work queued ---------------------------------------------

    def log_iteration(self, record, state) -> None:
        """`state.populations` is a list of `Population`, in the game's role order."""
        self._raise_failures()
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
        self._submit(self._log_iteration, record, frame, new_members)

    def finish(self, state) -> None:
        payoff_mean = state.payoffs.mean.copy()
        meta = [m.copy() for m in state.meta_strategy]
        self._submit(self._finish, payoff_mean, meta, state.payoffs.to_frame())
        self._drain()

    # --- tracking thread -----------------------------------------------------------------------

    def _start(self) -> None:
        import mlflow
        from mlflow.entities import Param

        self.client = mlflow.MlflowClient(tracking_uri=self.config.tracking_uri, registry_uri=self.config.tracking_uri)
        if self.resume is not None:
            return self._continue(self.resume)
        experiment = self.client.get_experiment_by_name(self.config.experiment)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(self.config.experiment)
        )
        run = self.client.create_run(
            experiment_id,
            run_name=f"psro-{self.config.game}-{self.config.meta_solver}",
            tags={
                "game": self.config.game,
                "oracle": self.config.oracle,
                "meta_solver": self.config.meta_solver,
                **self.tags,
            },
        )
        self.artifact_uri = run.info.artifact_uri
        params = [Param(key, str(value)) for key, value in dotted(self.config.model_dump()).items()]
        self.client.log_batch(run.info.run_id, params=params)
        self.client.log_dict(run.info.run_id, self.config.model_dump(mode="json"), layout.CONFIG_ARTIFACT)
        if self.config.register_models:
            for role in self.game.roles:
                self._ensure_registered_model(self._model_name(role))
        self.run_id = run.info.run_id

    def _model_name(self, role: str) -> str:
        return layout.registered_model_name(self.config.experiment, self.config.game, role)

    def _continue(self, checkpoint) -> None:
        """Reopen the run; forget what an unfinished iteration registered after the last commit."""
        self.run_id = checkpoint.run_id
        self.artifact_uri = self.client.get_run(self.run_id).info.artifact_uri
        self.client.update_run(self.run_id, status="RUNNING")
        if self.config.register_models:
            for population in checkpoint.populations:
                name = self._model_name(population.role)
                for version in self.client.search_model_versions(layout.versions_of_run(name, self.run_id)):
                    member = layout.VersionTags.of(version.tags).member
                    if member < len(population):
                        self._versions[(population.role, member)] = version.version
                    else:
                        self.client.delete_model_version(name, version.version)
        self._earlier = {
            name: {
                m.step: m.value
                for m in self.client.get_metric_history(self.run_id, name)
                if m.step <= checkpoint.iteration
            }
            for name in CURVES
        }

    def _ensure_registered_model(self, name: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(name, description=f"PSRO population members for {name}")

    def _log_iteration(self, record, frame, new_members) -> None:
        """Artifacts, members, metrics, then the commit tag (see `flows.tracking.resume`)."""
        import mlflow.entities

        step = record.iteration
        self.client.log_text(self.run_id, frame.to_csv(index=False), layout.payoffs_path(step))
        meta = dict(zip(self.game.roles, record.meta_strategy))
        self.client.log_dict(self.run_id, meta, layout.meta_strategy_path(step))
        for role, member, policy in new_members:
            path = layout.member_path(role, member)
            self._log_member(role, policy, path)
            if self.config.register_models:
                self._register(role, member, step, meta[role][member], path)
        metrics = [mlflow.entities.Metric(k, float(v), 0, step) for k, v in record.metrics().items()]
        self.client.log_batch(self.run_id, metrics=metrics)
        if os.environ.get(KILL_BEFORE_COMMIT) == str(step):
            os.kill(os.getpid(), signal.SIGKILL)
        self.client.set_tag(self.run_id, layout.COMMITTED_TAG, str(step))  # last: the iteration's commit

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

    def _finish(self, payoff_mean: np.ndarray, meta_strategy, frame) -> None:
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

    def _end(self, status: str) -> None:
        if self.run_id:
            self.client.set_terminated(self.run_id, status=status)
