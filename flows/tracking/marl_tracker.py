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
import json
import tempfile
from pathlib import Path

from flows.tracking import layout
from flows.tracking.scenario_tracker import ScenarioTracker, ensure_registered_model


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


class MARLTracker(ScenarioTracker):
    """Every round's metrics; every `checkpoint_every` rounds the learner's training state and
    each policy's acting weights (a registry version), then the commit."""

    commit_tag = layout.MARL_COMMITTED_TAG
    commit_waits = True

    def __init__(self, config, resume=None, tags: dict[str, str] | None = None):
        super().__init__(config, config.tracking_uri, config.experiment, resume, tags)
        self._curve: dict[str, dict[int, float]] = {}  # line (`_curve_line`) -> env steps -> evaluation return
        self._staleness: collections.Counter[int] = collections.Counter()  # since this process started the run

    def _snapshot(self, index, record, state, committed):
        if record.staleness:
            self._staleness.update(record.staleness)
        return record.env_steps, record.metrics, committed

    def _final(self, state):
        return None

    # --- the tracking thread ------------------------------------------------------------------

    def run_name(self) -> str:
        return f"marl-{self.config.env}-{self.config.algorithm}"

    def run_tags(self) -> dict[str, str]:
        return {"env": self.config.env, "algorithm": self.config.algorithm}

    def _reopened(self, committed: int) -> None:
        """Registry versions of a checkpoint that never committed are deleted; the committed
        rounds' greedy returns are read back, so the final plot shows the whole run."""
        prefix = layout.registered_model_name(self.config.experiment, self.config.env, "")
        models = self.client.search_registered_models(filter_string=f"name LIKE '{prefix}%'")
        self._delete_versions_after(committed, [m.name for m in models], "round")
        run = self.client.get_run(self.run_id)
        steps = {m.step: int(m.value) for m in self.client.get_metric_history(self.run_id, "env_steps")}
        for key in run.data.metrics:
            if (line := _curve_line(key)) is not None:
                curve = self._curve.setdefault(line, {})
                for m in self.client.get_metric_history(self.run_id, key):
                    if m.step <= committed and m.step in steps:
                        curve.setdefault(steps[m.step], m.value)

    def _log(self, index: int, snapshot) -> None:
        env_steps, metrics, _ = snapshot
        for key, value in metrics.items():
            if (line := _curve_line(key)) is not None:
                self._curve.setdefault(line, {})[env_steps] = value
        self._log_metrics(index, metrics)

    def _store(self, index: int, snapshot) -> None:
        import torch

        env_steps, _, (state, weights) = snapshot
        with tempfile.TemporaryDirectory() as directory:
            torch.save(state, Path(directory) / "learner.pt")
            folder = layout.MARL_CHECKPOINT.rsplit("/", 1)[0]
            self.client.log_artifact(self.run_id, str(Path(directory) / "learner.pt"), folder)
        tags = {"round": str(index), "env_steps": str(env_steps)}
        for policy, policy_weights in weights.items():
            path = layout.policy_checkpoint_path(policy, index)
            store_policy(self.client, self.run_id, self.config, policy, policy_weights, path, tags)
        self.client.set_tag(self.run_id, layout.MARL_ENV_STEPS_TAG, str(env_steps))

    def _finish(self, final) -> None:
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


def _curve_line(metric: str) -> str | None:
    """The line of the final return plot a metric belongs to: each policy's evaluation return,
    and each agent's against uniform play (`eval_versus_uniform`); None for other metrics."""
    if metric.startswith("eval_return/policy/"):
        return metric.removeprefix("eval_return/policy/")
    if metric.startswith("eval_return/vs_uniform/"):
        return f"{metric.removeprefix('eval_return/vs_uniform/')} vs uniform"
    return None
