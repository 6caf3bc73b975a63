"""League training as a scenario: one `league-generation` subflow per generation (AlphaStar's main
agents, main exploiters and league exploiters).

A generation is `marl_core.league.generation.run_generation`, the function the in-process loop
runs: every learning player's roles train at once as `train-player` tasks, each playing its
rounds on the run's rollout workers (Ray actors that live for the whole run), then the league
is updated and `measure-players` measures the main agents. Every
generation is committed (`flows.tracking.league_tracker`); because a generation is defined by the
state it starts from, a resumed run ends with the league it would have had.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from flows.runtime.scenario import SEED, Flag, Scenario, Step, environment_help, one_of
from flows.tracking import layout


def _algorithms() -> str:
    from marl_core.rl import ALGORITHMS

    return f"the learners' RL algorithm, {one_of(ALGORITHMS)}"


@dataclasses.dataclass
class LeagueSession:
    pool: Any
    started: float

    def progress(self) -> list:
        return self.pool.progress()


class LeagueScenario(Scenario):
    name = "league"
    summary = "League training: main agents, exploiters, PFSP matchmaking and ratings on a two-sided game"
    step_noun = "generation"
    steps_setting = "generations"
    commit_tag = layout.LEAGUE_COMMITTED_TAG
    exports = True
    flags = (
        Flag("game", str, environment_help("two-sided game")),
        Flag("algorithm", str, _algorithms),
        Flag("generations", int, "generations"),
        Flag("episodes", int, "training episodes per learning player and role per generation"),
        SEED,
    )

    def build_config(self, values: dict):
        from marl_core.league.config import build_league_config

        return build_league_config(values)

    def describe(self, config) -> str:
        s = config.league
        return (
            f"league on [bold]{config.game}[/]: {s.main_agents} main agent(s), {s.main_exploiters} main exploiter(s), "
            f"{s.league_exploiters} league exploiter(s); {config.algorithm}, {config.generations} generations of "
            f"{config.episodes} episodes per player and role; MLflow at {config.tracking_uri}"
        )

    # --- the run ------------------------------------------------------------------------------

    def initial_state(self, config):
        from marl_core.league import generation

        return generation.initial_state(config)

    def load(self, config, client, run_id: str, committed: int):
        from flows.tracking.league_tracker import load_league_state

        return load_league_state(config, client, run_id, committed)

    def steps(self, config, committed: int | None) -> range:
        return range((committed or 0) + 1, config.generations + 1)  # generation 0 is the seeded league

    def open(self, config, state, steps: range, stack) -> LeagueSession:
        from marl_core.psro.steps import rollout_pool_config
        from marl_core.rollout.pool import WorkerPool

        pool = WorkerPool(rollout_pool_config(config.oracle_config()), on_ray=True)
        stack.callback(pool.close)
        return LeagueSession(pool, time.perf_counter())

    def step(self, config, session: LeagueSession, state, index: int) -> Step:
        from flows.runtime.task_steps import RayTaskSteps
        from marl_core.league import generation
        from tasks.league_tasks import TASKS

        record, state = generation.run_generation(
            config, state, index, RayTaskSteps(TASKS), session.pool, session.started
        )
        return Step(record, state)

    def tracker(self, config, resume, tags):
        from flows.tracking.league_tracker import LeagueTracker

        return LeagueTracker(config, resume, tags)

    def export(self, config, state, record, seconds: float) -> None:
        from marl_core.league.generation import write_main_agent_export

        write_main_agent_export(config.export, config, state, seconds)

    # --- the command's lines ------------------------------------------------------------------

    def line(self, record, state) -> str:
        return (
            f"gen {record.generation:3d}  snapshots {len(state.league.snapshots):3d}  {record.summary()}  "
            f"{record.seconds:6.1f}s"
        )

    def done(self, config, state, record, seconds: float) -> str:
        text = f"done: {state.generation} generations, {len(state.league.snapshots)} snapshots in {seconds:.1f}s"
        if config.export:
            text += (
                f"\nexported the newest main agent to {config.export}; "
                f"check it with: python scripts/verify_export.py {config.export}"
            )
        return text


LEAGUE = LeagueScenario()
