"""The one MLflow run of a scenario's run: created or reopened, logged step by step, committed.

Every scenario's tracker is a `ScenarioTracker`: this class does, once for all of them, what
each used to repeat:

- a new run gets its name and tags, its settings as flat params and as `config.json` (what
  resume reads back), in an experiment that MLflow's UI opens in its model-training view;
- a resumed run is reopened, and whatever a step after its last commit left in the registry is
  deleted first (the subclass's `_reopened`), so nothing is registered twice;
- each step's metrics carry the wall clock's time and reach MLflow with the next commit: a step
  that commits stores what the subclass writes (`_store`) and then, last, the metrics of every
  step since the commit before and the scenario's commit tag, in one request (`_commit`). A run
  killed anywhere before that request resumes from the commit before, and redoes the steps
  since; their metrics were never sent, so no step's metrics are in MLflow twice (MLflow keeps
  every point logged and deletes none);
- the run ends FINISHED, or FAILED when its block raised.

All MLflow calls run on one background thread (`BackgroundTracker`); the driver only snapshots
what a step produced (`_snapshot`) and goes on. Where the scenario says so (`commit_waits`), a
commit is waited for before the driver goes on to the next step's record, so that it never runs
more than one step ahead of what is stored: the next step may be working meanwhile, from the
state the commit holds, and a run killed then redoes it on resume.
"""

from __future__ import annotations

import time
from typing import Any

from flows.tracking import layout
from flows.tracking.background import BackgroundTracker
from flows.tracking.patient import mlflow_client

# The experiment tag MLflow's UI reads to choose its view; without it MLflow 3 files every run
# under its GenAI view ("Evaluations", "Traces"). These are model-training runs.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
METRICS_PER_REQUEST = 900  # MLflow's log_batch takes 1,000 entities at most, the commit tag one of them


def open_experiment(client, name: str) -> str:
    """The id of experiment `name`, made if missing, marked as model training."""
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
    if experiment is None or experiment.tags.get(EXPERIMENT_KIND_TAG) != MODEL_TRAINING:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    return experiment_id


def create_run(client, config, run_name: str, tags: dict[str, str], experiment_name: str) -> str:
    """A new MLflow run in `experiment_name` with the settings as flat params and as
    `config.json`; returns its id."""
    from mlflow.entities import Param

    from marl_core.pbt.settings import dotted

    run_id = client.create_run(open_experiment(client, experiment_name), run_name=run_name, tags=tags).info.run_id
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


class ScenarioTracker(BackgroundTracker):
    """Subclasses name the run (`run_name`, `run_tags`) and write what is their own:
    `_snapshot` (driver side, cheap), `_log` (every step), `_store` (a committed step's
    artifacts and registry versions), `_reopened` and `_finish`."""

    commit_tag: str  # the scenario's commit tag (`flows.tracking.layout`)
    commit_waits = False  # whether `log_step` waits until a committed step is stored

    def __init__(self, config, tracking_uri: str, experiment: str, resume=None, tags: dict[str, str] | None = None):
        super().__init__()
        self.config = config
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.resume = resume  # a `flows.runtime.run.Resumed`, or None for a new run
        self.tags = tags or {}
        self.run_id: str | None = None
        # the last step whose commit tag is written (a stopped command says it)
        self.committed: int | None = resume.step if resume is not None else None
        self._held: list = []  # metrics of the steps since the last commit (`_log_metrics`)

    # --- driver side ----------------------------------------------------------------------------

    def begin(self, state) -> None:
        """Called once the run is open, before its first step."""

    def log_step(self, index: int, record, state, committed: Any | None) -> None:
        """Step `index`'s record; `committed` is what the step commits (None: no commit due)."""
        self._raise_failures()
        snapshot = self._snapshot(index, record, state, committed)
        self._submit(self._log_step, index, snapshot, committed is not None)
        if committed is not None and self.commit_waits:
            self._drain()

    def finish(self, state) -> None:
        self._submit(self._finish, self._final(state))
        self._drain()

    def _snapshot(self, index: int, record, state, committed) -> Any:
        return (record, committed)

    def _final(self, state) -> Any:
        return state

    # --- tracking thread ------------------------------------------------------------------------

    def run_name(self) -> str:
        raise NotImplementedError

    def run_tags(self) -> dict[str, str]:
        return {}

    def _start(self) -> None:
        self.client = mlflow_client(self.tracking_uri)
        if self.resume is not None:
            self.run_id = self.resume.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            self._reopened(self.resume.step)
            return
        tags = {**self.run_tags(), **self.tags}
        self.run_id = create_run(self.client, self.config, self.run_name(), tags, self.experiment)
        self._created()

    def _created(self) -> None:
        """A new run exists (registered models may be made here)."""

    def _reopened(self, committed: int) -> None:
        """A resumed run is open again after step `committed`: forget what later steps left."""

    def _log_step(self, index: int, snapshot, commit: bool) -> None:
        self._log(index, snapshot)
        if commit:
            self._store(index, snapshot)
            self._commit(index)

    def _log(self, index: int, snapshot) -> None:
        raise NotImplementedError

    def _store(self, index: int, snapshot) -> None:
        raise NotImplementedError

    def _commit(self, index: int) -> None:
        """The commit, after everything the step stores: the held metrics, then the scenario's tag
        naming the step, in the same request as the last of them."""
        from mlflow.entities import RunTag

        held, self._held = self._held, []
        self._send(held, [RunTag(self.commit_tag, str(index))])
        self.committed = index

    def _finish(self, final) -> None:
        """Plots and end-of-run tags."""

    def _end(self, status: str) -> None:
        if self.run_id is None:
            return
        if status == "FINISHED" and self._held:  # steps after the last commit of a run that ended
            self._send(self._held)
        self.client.set_terminated(self.run_id, status)

    def _send(self, metrics: list, tags: list | None = None) -> None:
        """`metrics` in as few requests as MLflow takes, `tags` in the last of them."""
        step = METRICS_PER_REQUEST
        *earlier, last = [metrics[i : i + step] for i in range(0, len(metrics), step)] or [[]]
        for chunk in earlier:
            self.client.log_batch(self.run_id, metrics=chunk)
        self.client.log_batch(self.run_id, metrics=last, tags=tags or [])

    # --- helpers for subclasses -----------------------------------------------------------------

    def _log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Step `step`'s metrics, held until the next commit sends them (`_commit`)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._held.extend(Metric(key, float(value), now, step) for key, value in metrics.items())

    def _delete_versions_after(self, committed: int, model_names, step_tag: str) -> None:
        """Registry versions this run made for steps after `committed` (it died between
        registering and committing them): deleted, so that no step is registered twice."""
        for name in model_names:
            for version in self.client.search_model_versions(layout.versions_of_run(name, self.run_id)):
                if int(version.tags.get(step_tag, -1)) > committed:
                    self.client.delete_model_version(name, version.version)
