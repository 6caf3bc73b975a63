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
import tempfile
from pathlib import Path

from flows.tracking import layout
from flows.tracking.marl_tracker import store_policy
from flows.tracking.resume import ResumeError
from flows.tracking.scenario_tracker import ScenarioTracker


def load_pbt_state(client, run_id: str, committed: int, checkpoint_every: int):
    """The `PBTState` round `committed` of run `run_id` committed, and every member's training
    state; a ResumeError in one line if its slot holds another round."""
    import torch

    from marl_core.pbt.marl import PBTState

    with tempfile.TemporaryDirectory() as directory:
        slot = Path(
            client.download_artifacts(run_id, layout.pbt_checkpoint_path(committed, checkpoint_every), directory)
        )
        state = PBTState.from_json(json.loads((slot / layout.PBT_STATE_FILE).read_text()))
        if state.round != committed + 1:
            raise ResumeError(
                f"run {run_id}: its checkpoint holds round {state.round - 1}, its commit tag says {committed}"
            )
        learners = [torch.load(slot / f"member_{i}.pt", weights_only=True) for i in range(len(state.settings))]
    return state, learners


class PBTTracker(ScenarioTracker):
    """Every round's metrics and hyperparameters; every `checkpoint_every` rounds every member's
    training state, the PBT state and each member's policies, then the commit."""

    commit_tag = layout.PBT_COMMITTED_TAG
    commit_waits = True

    def __init__(self, config, resume=None, tags: dict[str, str] | None = None):
        marl = config.marl
        super().__init__(config, marl.tracking_uri, marl.experiment, resume, tags)
        self._scores: dict[int, dict[int, float]] = {}  # member -> round -> score (tracking thread's)
        self._values: dict[int, dict[int, dict]] = {}  # member -> round -> hyperparameters
        self._lineage: list[dict] = (
            [dataclasses.asdict(e) for e in resume.state.state.lineage] if resume else []
        )  # as committed

    def _snapshot(self, index, record, state, committed):
        """`committed`: the state after the round and, per member, (training state, policy
        weights) as the learner actors returned them."""
        if committed is None:
            return record, None
        pbt_state, learners = committed
        return record, (json.loads(json.dumps(pbt_state.to_json())), learners)

    def _final(self, state):
        return None

    # --- the tracking thread ------------------------------------------------------------------

    def run_name(self) -> str:
        return f"pbt-{self.config.marl.env}-{self.config.marl.algorithm}"

    def run_tags(self) -> dict[str, str]:
        return {"env": self.config.marl.env, "algorithm": self.config.marl.algorithm}

    def _reopened(self, committed: int) -> None:
        marl = self.config.marl
        prefix = layout.registered_model_name(marl.experiment, marl.env, "")
        models = self.client.search_registered_models(filter_string=f"name LIKE '{prefix}%'")
        self._delete_versions_after(committed, [m.name for m in models], "round")
        self._reload_curves(committed)

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

    def _log(self, index: int, snapshot) -> None:
        record, _ = snapshot
        if (scores := record.scores()) is not None:
            for i, score in enumerate(scores):
                self._scores.setdefault(i, {})[record.round] = score
        for i, values in enumerate(record.hyperparameters):
            self._values.setdefault(i, {})[record.round] = dict(values)
        self._log_metrics(index, record.metrics())

    def _store(self, index: int, snapshot) -> None:
        import pandas as pd
        import torch

        state, learners = snapshot[1]
        round = index
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
        self._lineage = state["lineage"]

    def _finish(self, final) -> None:
        if not self._scores:
            return
        import matplotlib.pyplot as plt

        from flows.tracking import plots

        marl = self.config.marl
        figure = plots.pbt_curves(self._scores, self._values, self._lineage, f"PBT: {marl.algorithm} on {marl.env}")
        self.client.log_figure(self.run_id, figure, layout.PBT_PLOT)
        plt.close(figure)
