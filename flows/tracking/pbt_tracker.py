"""MLflow tracking of a PBT run, and resuming one from what it committed.

Per round, on one background thread (`BackgroundTracker`): every member's metrics and
hyperparameters. Per checkpoint: every member's training state and the PBT state in one of two
slots, each member's policies as registry versions, the lineage so far, and last the commit tag.
A run killed anywhere in that sequence resumes from the last tag: the slot it names was complete
before the tag was written, and registry versions of later rounds are deleted first, so none is
registered twice. Where things go is `flows.tracking.layout`'s.

Nothing is unpickled on resume: training states load with `torch.load(weights_only=True)`, the
PBT state is JSON.
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
from flows.tracking.marl_tracker import store_policy
from flows.tracking.resume import ResumeError, committed_run
from flows.tracking.run_tracker import create_run

# Fault injection for tests: SIGKILL the process once round N's checkpoint is written and its
# policies registered, before N is committed.
KILL_BEFORE_COMMIT = "PBT_KILL_BEFORE_COMMIT"


@dataclasses.dataclass(frozen=True)
class PBTCheckpoint:
    run_id: str
    config: dict  # as the run logged it
    state: PBTState  # after the last committed round
    learners: list[dict]  # per member, its training state


def load_pbt_checkpoint(tracking_uri: str, run_id: str) -> PBTCheckpoint:
    """What run `run_id` committed last; a ResumeError in one line if it is no PBT run."""
    import mlflow
    import torch

    from marl_core.pbt.marl import PBTState

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    run = committed_run(
        client,
        run_id,
        layout.PBT_COMMITTED_TAG,
        f"run {run_id} has no committed round to resume from (was it a `psro pbt run`?)",
    )
    committed = int(run.data.tags[layout.PBT_COMMITTED_TAG])
    with tempfile.TemporaryDirectory() as directory:
        config = json.loads(Path(client.download_artifacts(run_id, layout.CONFIG_ARTIFACT, directory)).read_text())
        every = config["marl"]["checkpoint_every"]
        slot = Path(client.download_artifacts(run_id, layout.pbt_checkpoint_path(committed, every), directory))
        state = PBTState.from_json(json.loads((slot / layout.PBT_STATE_FILE).read_text()))
        if state.round != committed + 1:
            raise ResumeError(
                f"run {run_id}: its checkpoint holds round {state.round - 1}, its commit tag says {committed}"
            )
        learners = [torch.load(slot / f"member_{i}.pt", weights_only=True) for i in range(len(state.settings))]
    return PBTCheckpoint(run_id, config, state, learners)


class PBTTracker(BackgroundTracker):
    def __init__(self, config, resume: PBTCheckpoint | None = None):
        super().__init__()
        self.config = config
        self.resume = resume
        self.run_id: str | None = None
        self._scores: dict[int, dict[int, float]] = {}  # member -> round -> score (tracking thread's)
        self._values: dict[int, dict[int, dict]] = {}  # member -> round -> hyperparameters
        self._lineage: list[dict] = (
            [dataclasses.asdict(e) for e in resume.state.lineage] if resume else []
        )  # as committed

    def log_round(self, record) -> None:
        self._raise_failures()
        self._submit(self._log_round, record)

    def commit(self, state, learners: list[tuple[dict, dict]]) -> None:
        """`state` as it stands after its last round; per member, (training state, policy
        weights) as the learner actors returned them."""
        self._submit(self._commit, json.loads(json.dumps(state.to_json())), learners)
        self._drain()

    def finish(self) -> None:
        self._submit(self._plot)
        self._drain()

    # --- the tracking thread ------------------------------------------------------------------

    def _start(self) -> None:
        import mlflow

        marl = self.config.marl
        self.client = mlflow.MlflowClient(tracking_uri=marl.tracking_uri, registry_uri=marl.tracking_uri)
        if self.resume is not None:
            self.run_id = self.resume.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            self._forget_uncommitted(self.resume.state.round - 1)
            self._reload_curves(self.resume.state.round - 1)
            return
        self.run_id = create_run(
            self.client,
            self.config,
            f"pbt-{marl.env}-{marl.algorithm}",
            {"env": marl.env, "algorithm": marl.algorithm, "scenario": "pbt"},
            marl.experiment,
        )

    def _forget_uncommitted(self, committed: int) -> None:
        marl = self.config.marl
        prefix = layout.registered_model_name(marl.experiment, marl.env, "")
        for model in self.client.search_registered_models(filter_string=f"name LIKE '{prefix}%'"):
            for version in self.client.search_model_versions(layout.versions_of_run(model.name, self.run_id)):
                if int(version.tags.get("round", -1)) > committed:
                    self.client.delete_model_version(model.name, version.version)

    def _reload_curves(self, committed: int) -> None:
        """The committed rounds' scores and hyperparameters, so the final plot shows the whole run."""
        run = self.client.get_run(self.run_id)
        for key in run.data.metrics:
            member, _, name = key.partition("/")
            if not member.startswith("member_") or not (name == "score" or name.startswith("hp/")):
                continue
            i = int(member.removeprefix("member_"))
            for m in self.client.get_metric_history(self.run_id, key):
                if m.step <= committed:
                    if name == "score":
                        self._scores.setdefault(i, {})[m.step] = m.value
                    else:
                        self._values.setdefault(i, {}).setdefault(m.step, {})[name.removeprefix("hp/")] = m.value

    def _log_round(self, record) -> None:
        import time

        from mlflow.entities import Metric

        if (scores := record.scores()) is not None:
            for i, score in enumerate(scores):
                self._scores.setdefault(i, {})[record.round] = score
        for i, values in enumerate(record.hyperparameters):
            self._values.setdefault(i, {})[record.round] = dict(values)
        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(k, float(v), now, record.round) for k, v in record.metrics().items()]
        )

    def _commit(self, state: dict, learners: list[tuple[dict, dict]]) -> None:
        import pandas as pd
        import torch

        round = state["round"] - 1
        marl = self.config.marl
        with tempfile.TemporaryDirectory() as directory:
            slot = Path(directory) / "slot"
            slot.mkdir()
            for i, (training_state, _) in enumerate(learners):
                torch.save(training_state, slot / f"member_{i}.pt")
            (slot / layout.PBT_STATE_FILE).write_text(json.dumps(state))
            self.client.log_artifacts(self.run_id, str(slot), layout.pbt_checkpoint_path(round, marl.checkpoint_every))
            # a member that copied another at this round holds that member's networks: its
            # version carries the score those networks earned, and says whose they are
            copied = {e["member"]: e["source"] for e in state["lineage"] if e["step"] == state["round"]}
            for i, (_, weights) in enumerate(learners):
                networks = copied.get(i, i)
                tags = {
                    "round": str(round),
                    "member": str(i),
                    "env_steps": str(state["env_steps"][i]),
                    "score": str(self._scores.get(networks, {}).get(round, float("nan"))),
                    "hyperparameters": json.dumps(state["hyperparameters"][i]),
                }
                if i in copied:
                    tags["copied_from"] = str(networks)
                for policy, policy_weights in weights.items():
                    store_policy(
                        self.client,
                        self.run_id,
                        marl,
                        policy,
                        policy_weights,
                        layout.pbt_policy_path(i, policy, round),
                        tags,
                    )
            lineage = Path(directory) / "lineage"
            lineage.mkdir()
            (lineage / "lineage.json").write_text(json.dumps(state["lineage"], indent=1))
            rows = [
                {
                    "step": e["step"],
                    "member": e["member"],
                    "source": e["source"],
                    "member_score": e["member_score"],
                    "source_score": e["source_score"],
                    **{f"before.{k}": v for k, v in e["before"].items()},
                    **{f"after.{k}": v for k, v in e["after"].items()},
                }
                for e in state["lineage"]
            ]
            pd.DataFrame(rows).to_csv(lineage / "lineage.csv", index=False)
            self.client.log_artifacts(self.run_id, str(lineage), layout.PBT_LINEAGE)
        if os.environ.get(KILL_BEFORE_COMMIT) == str(round):
            os.kill(os.getpid(), signal.SIGKILL)
        self.client.set_tag(self.run_id, layout.PBT_COMMITTED_TAG, str(round))  # last: the commit
        self._lineage = state["lineage"]

    def _plot(self) -> None:
        if not self._scores:
            return
        import matplotlib.pyplot as plt

        from flows.tracking import plots

        marl = self.config.marl
        figure = plots.pbt_curves(self._scores, self._values, self._lineage, f"PBT: {marl.algorithm} on {marl.env}")
        self.client.log_figure(self.run_id, figure, layout.PBT_PLOT)
        plt.close(figure)

    def _end(self, status: str) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status)
