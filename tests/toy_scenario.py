"""A seventh scenario, defined only here: what adding a scenario takes.

A run adds one seeded draw per round to a running total. The draw is a Prefect task on Ray
(through the one task-runner adapter), the round a subflow of the scenario's flow, the total
committed to MLflow each round and read back on resume; the command line (`run`, `resume` and
their common flags) and the deployment (`toy_scenario.toy`, importable with this folder on
PYTHONPATH) come from the runtime. Nothing outside this module knows it exists.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from flows.deployments.entrypoints import scenario_flows
from flows.runtime.scenario import Flag, Scenario, Step
from flows.tracking.scenario_tracker import ScenarioTracker

COMMIT_TAG = "toy.committed_round"


class ToyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rounds: PositiveInt = 4
    seed: int = 0
    tracking_uri: str = "sqlite:///mlflow.db"
    experiment: str = Field("toy", min_length=1)
    ray_address: str | None = None
    num_cpus: PositiveInt | None = None


def draw(seed: int, index: int) -> float:
    return float(np.random.default_rng([seed, index]).random())


@task(name="draw", cache_policy=NO_CACHE, persist_result=False)
def add_draw(total: float, seed: int, index: int) -> float:
    return total + draw(seed, index)


TASKS = {"draw": add_draw}


@dataclasses.dataclass(frozen=True)
class ToyRecord:
    round: int
    total: float


class ToyTracker(ScenarioTracker):
    commit_tag = COMMIT_TAG

    def __init__(self, config, resume=None, tags=None):
        super().__init__(config, config.tracking_uri, config.experiment, resume, tags)

    def run_name(self) -> str:
        return f"toy-{self.config.seed}"

    def _log(self, index: int, snapshot) -> None:
        record, _ = snapshot
        self._log_metrics(index, {"total": record.total})

    def _store(self, index: int, snapshot) -> None:
        record, _ = snapshot
        self.client.log_dict(self.run_id, {"round": index, "total": record.total}, f"toy/round_{index:04d}.json")


class ToyScenario(Scenario):
    name = "toy"
    summary = "A running total of seeded draws, one per round"
    step_noun = "round"
    steps_setting = "rounds"
    commit_tag = COMMIT_TAG
    flags = (Flag("rounds", int, "rounds"), Flag("seed", int, "random seed"))

    def build_config(self, values: dict):
        from marl_core.psro.config import build_config

        return build_config(values, ToyConfig)

    def environment(self, config) -> str:
        return "kuhn_poker"  # what Ray's workers warm up on: any game will do

    def describe(self, config) -> str:
        return f"toy: {config.rounds} rounds, seed {config.seed}; MLflow at {config.tracking_uri}"

    def initial_state(self, config) -> float:
        return 0.0

    def load(self, config, client, run_id: str, committed: int) -> float:
        with tempfile.TemporaryDirectory() as directory:
            path = client.download_artifacts(run_id, f"toy/round_{committed:04d}.json", directory)
            return json.loads(Path(path).read_text())["total"]

    def steps(self, config, committed: int | None) -> range:
        return range(0 if committed is None else committed + 1, config.rounds)

    def open(self, config, state, steps: range, stack):
        return None

    def step(self, config, session, state: float, index: int) -> Step:
        from flows.runtime.task_steps import RayTaskSteps

        runner = RayTaskSteps(TASKS)
        total = runner.result(runner.submit("draw", state, config.seed, index))
        return Step(ToyRecord(index, total), total)

    def tracker(self, config, resume, tags):
        return ToyTracker(config, resume, tags)

    def line(self, record, state) -> str:
        return f"round {record.round:3d}  total {record.total:.6f}"

    def done(self, config, state, record, seconds: float) -> str:
        return f"done: {config.rounds} rounds, total {state:.6f}"


TOY = ToyScenario()
toy, toy_round = scenario_flows(TOY, __name__)


def expected_total(config: ToyConfig) -> float:
    return sum(draw(config.seed, index) for index in range(config.rounds))
