"""MLflow tracking of a MARL training run, and resuming one from what it committed.

Per round: the round's metrics (returns per agent and policy, learner losses, environment steps
per second, stage times). Per checkpoint: the learner's whole training state, each policy's
acting weights as a registry version, then the commit tag (see `flows.tracking.layout`). All
MLflow calls run on one background thread, so tracking never holds up the next round; `commit`
and `finish` wait for it, so a committed round is really stored.

Nothing is unpickled on resume: the training state is loaded with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import tempfile
from pathlib import Path

from flows.tracking import layout
from flows.tracking.background import BackgroundTracker
from flows.tracking.resume import committed_run
from flows.tracking.run_tracker import create_run, ensure_registered_model

# Fault injection for tests: SIGKILL the process once round N's policies are registered and
# before N is committed, the window whose leftovers resume must clean up.
KILL_BEFORE_COMMIT = "MARL_KILL_BEFORE_COMMIT"


@dataclasses.dataclass(frozen=True)
class MARLCheckpoint:
    run_id: str
    config: dict
    round: int  # the last committed round
    env_steps: int
    state: dict  # the learner's training state


def load_marl_checkpoint(tracking_uri: str, run_id: str) -> MARLCheckpoint:
    import mlflow
    import torch

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    run = committed_run(
        client,
        run_id,
        layout.MARL_COMMITTED_TAG,
        f"run {run_id} has no committed round to resume from (was it a `psro marl run`?)",
    )
    with tempfile.TemporaryDirectory() as directory:
        config = json.loads(Path(client.download_artifacts(run_id, layout.CONFIG_ARTIFACT, directory)).read_text())
        # map_location: a state a GPU learner saved resumes on a machine without one
        state = torch.load(
            client.download_artifacts(run_id, layout.MARL_CHECKPOINT, directory), weights_only=True, map_location="cpu"
        )
    return MARLCheckpoint(
        run_id,
        config,
        int(run.data.tags[layout.MARL_COMMITTED_TAG]),
        int(run.data.tags[layout.MARL_ENV_STEPS_TAG]),
        state,
    )


def store_policy(client, run_id: str, config, policy: str, weights: dict, path: str, tags: dict[str, str]) -> None:
    """A policy's acting network in the run at `path` (weights-only, with its description), and
    as the newest version of `{experiment}-{env}-{policy}`, tagged with `tags` (which must hold
    its "round": resume deletes the versions of rounds it did not commit)."""
    import torch

    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        torch.save(weights, folder / layout.POLICY_WEIGHTS)
        description = {"algorithm": config.algorithm, "env": config.env, "policy": policy, **tags}
        (folder / layout.POLICY_DESCRIPTION).write_text(json.dumps(description))
        client.log_artifacts(run_id, str(folder), path)
    name = layout.registered_model_name(config.experiment, config.env, policy)
    ensure_registered_model(client, name, f"MARL policy {policy} of {config.env}")
    source = f"{client.get_run(run_id).info.artifact_uri}/{path}"
    version = client.create_model_version(
        name, source, run_id=run_id, tags={"run_id": run_id, "policy": policy, **tags}
    )
    client.set_registered_model_alias(name, layout.NEWEST_ALIAS, version.version)


class MARLTracker(BackgroundTracker):
    def __init__(self, config, resume: MARLCheckpoint | None = None):
        super().__init__()
        self.config = config
        self.resume = resume
        self.run_id: str | None = None
        self._curve: dict[
            str, dict[int, float]
        ] = {}  # line (`_curve_line`) -> env steps -> evaluation return (tracking thread's)
        self._staleness: collections.Counter[int] = collections.Counter()  # since this process started the run

    def log_round(self, record) -> None:
        self._raise_failures()
        self._submit(self._log_round, record.round, record.env_steps, record.metrics)
        if record.staleness:
            self._staleness.update(record.staleness)

    def commit(self, round: int, env_steps: int, state: dict, weights: dict) -> None:
        self._submit(self._commit, round, env_steps, state, weights)
        self._drain()

    def finish(self) -> None:
        self._submit(self._plot)
        self._drain()

    # --- the tracking thread ------------------------------------------------------------------

    def _start(self) -> None:
        import mlflow

        config = self.config
        self.client = mlflow.MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.tracking_uri)
        if self.resume is not None:
            self.run_id = self.resume.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            self._forget_uncommitted(self.resume.round)
            self._reload_curve(self.resume.round)
            return
        self.run_id = create_run(
            self.client,
            config,
            f"marl-{config.env}-{config.algorithm}",
            {"env": config.env, "algorithm": config.algorithm, "scenario": "marl"},
        )

    def _forget_uncommitted(self, committed: int) -> None:
        """Registry versions of a checkpoint that never committed (the run died between
        registering and tagging) would be registered again: delete them first."""
        for model in self.client.search_registered_models(filter_string=f"name LIKE '{self._model_prefix()}%'"):
            for version in self.client.search_model_versions(layout.versions_of_run(model.name, self.run_id)):
                if int(version.tags.get("round", -1)) > committed:
                    self.client.delete_model_version(model.name, version.version)

    def _reload_curve(self, committed: int) -> None:
        """The committed rounds' greedy returns, so the final plot shows the whole run."""
        run = self.client.get_run(self.run_id)
        steps = {m.step: int(m.value) for m in self.client.get_metric_history(self.run_id, "env_steps")}
        for key in run.data.metrics:
            if (line := _curve_line(key)) is not None:
                curve = self._curve.setdefault(line, {})
                for m in self.client.get_metric_history(self.run_id, key):
                    if m.step <= committed and m.step in steps:
                        curve.setdefault(steps[m.step], m.value)

    def _model_prefix(self) -> str:
        return layout.registered_model_name(self.config.experiment, self.config.env, "")

    def _log_round(self, round: int, env_steps: int, metrics: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        for key, value in metrics.items():
            if (line := _curve_line(key)) is not None:
                self._curve.setdefault(line, {})[env_steps] = value

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, round) for k, v in metrics.items()])

    def _commit(self, round: int, env_steps: int, state: dict, weights: dict) -> None:
        import torch

        with tempfile.TemporaryDirectory() as directory:
            torch.save(state, Path(directory) / "learner.pt")
            self.client.log_artifact(
                self.run_id, str(Path(directory) / "learner.pt"), layout.MARL_CHECKPOINT.rsplit("/", 1)[0]
            )
        tags = {"round": str(round), "env_steps": str(env_steps)}
        for policy, policy_weights in weights.items():
            store_policy(
                self.client,
                self.run_id,
                self.config,
                policy,
                policy_weights,
                layout.policy_checkpoint_path(policy, round),
                tags,
            )
        if os.environ.get(KILL_BEFORE_COMMIT) == str(round):
            os.kill(os.getpid(), signal.SIGKILL)
        self.client.set_tag(self.run_id, layout.MARL_ENV_STEPS_TAG, str(env_steps))
        self.client.set_tag(self.run_id, layout.MARL_COMMITTED_TAG, str(round))  # last: the commit

    def _plot(self) -> None:
        import matplotlib.pyplot as plt

        from flows.tracking import plots

        title = f"{self.config.algorithm} on {self.config.env}"
        if self._curve:
            figure = plots.episode_return_curve(self._curve, title)
            self.client.log_figure(self.run_id, figure, layout.EPISODE_RETURN_PLOT)
            plt.close(figure)
        if self._staleness:
            figure = plots.staleness_histogram(dict(self._staleness), title)
            self.client.log_figure(self.run_id, figure, layout.STALENESS_PLOT)
            plt.close(figure)

    def _end(self, status: str) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status)


def _curve_line(metric: str) -> str | None:
    """The line of the final return plot a metric belongs to: each policy's evaluation return,
    and each agent's against uniform play (`eval_versus_uniform`); None for other metrics."""
    if metric.startswith("eval_return/policy/"):
        return metric.removeprefix("eval_return/policy/")
    if metric.startswith("eval_return/vs_uniform/"):
        return f"{metric.removeprefix('eval_return/vs_uniform/')} vs uniform"
    return None
