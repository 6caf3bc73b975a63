"""Population-based training as a scenario: one `pbt-round` subflow per round (Ray Tune's PBT, one
MARL learner per member).

A round is every member's `marl_core.marl.rounds.run_round` at once, each on its own rollout
workers and learner actor, its steps Prefect tasks on Ray as in a MARL run. Between rounds the
driver takes PBT's step (`marl_core.pbt.marl.perturb`): at a perturbation point each bottom
member's learner actor rebuilds its learner with its new settings and loads the top member's
whole training state, passed from actor to actor inside Ray (it never comes through this
process), keeping its own optimizer hyperparameters.

Every `checkpoint_every` rounds every member's training state, the PBT state (settings, lineage,
the generator) and each member's policies are committed (`flows.tracking.pbt_tracker`); a
resumed run goes on with the settings, lineage and generator it committed.
"""

from __future__ import annotations

import contextvars
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flows.runtime.scenario import Flag, Scenario, Step
from flows.tracking import layout


@dataclasses.dataclass
class PBTProgress:
    """Where a PBT run stands between rounds, and (a resumed run's, until its learners are
    rebuilt) every member's committed training state."""

    state: Any  # marl_core.pbt.marl.PBTState
    learners: list | None = None


@dataclasses.dataclass
class PBTSession:
    pools: list
    actors: list  # one learner actor per member
    layout: Any

    def progress(self) -> list:
        return [row for pool in self.pools for row in pool.progress()]


def _at_once(function, members):
    """`map` over the members on threads, each in a copy of this context (the subflow's run
    context, so every thread's tasks belong to it).

    When one member fails or the run is interrupted, the others are not waited for (a round can
    take minutes): stopping Ray ends their work, and the run's exit waits for their threads to
    record that (`finish_before_prefect_stops`)."""
    from flows.services.run_services import finish_before_prefect_stops

    members = list(members)
    threads = ThreadPoolExecutor(max_workers=len(members), thread_name_prefix="pbt-member")
    futures = [threads.submit(contextvars.copy_context().run, function, m) for m in members]
    try:
        return [f.result() for f in futures]
    except BaseException:
        finish_before_prefect_stops(*futures)
        raise
    finally:
        threads.shutdown(wait=False)


class PBTScenario(Scenario):
    name = "pbt"
    summary = "Population-based training: exploit and explore over a population of MARL learners"
    step_noun = "round"
    steps_setting = "rounds"
    commit_tag = layout.PBT_COMMITTED_TAG
    settings_section = "marl"
    config_file_required = True
    flags = (
        Flag("rounds", int, "training rounds of every member", key="marl.rounds"),
        Flag("population", int, "members"),
        Flag("seed", int, "random seed (member i's is seed + i)", key="marl.seed"),
        Flag("exploit", bool, "--no-exploit: train the population untouched, the baseline"),
    )

    def build_config(self, values: dict):
        from flows.scenarios.marl import check_marl, validated
        from marl_core.pbt.marl import PBTConfig
        from marl_core.psro.config import ConfigError

        if not isinstance(values.get("marl"), dict):
            raise ConfigError("no marl section (the learners' settings: env, algorithm, rounds, ...)")
        config = validated(PBTConfig, values)
        check_marl(config.marl)
        return config

    def environment(self, config) -> str:
        return config.marl.env

    def describe(self, config) -> str:
        marl, pbt = config.marl, config.pbt
        return (
            f"PBT on [bold]{marl.env}[/]: {config.population} {marl.algorithm} members, {marl.rounds} rounds, "
            f"exploit/explore every {pbt.perturbation_interval} rounds over {sorted(pbt.hyperparam_mutations)}"
            f"{'' if config.exploit else ' (off: --no-exploit)'}; MLflow at {marl.tracking_uri}"
        )

    # --- the run ------------------------------------------------------------------------------

    def initial_state(self, config) -> PBTProgress:
        from marl_core.pbt.marl import PBTState

        return PBTProgress(PBTState.initial(config))

    def load(self, config, client, run_id: str, committed: int) -> PBTProgress:
        from flows.tracking.pbt_tracker import load_pbt_state

        return PBTProgress(*load_pbt_state(client, run_id, committed, config.marl.checkpoint_every))

    def steps(self, config, committed: int | None) -> range:
        return range(0 if committed is None else committed + 1, config.marl.rounds)

    def open(self, config, progress: PBTProgress, steps: range, stack) -> PBTSession:
        import ray

        from marl_core.marl.config import layout_and_spec, pool_config, training_work
        from marl_core.marl.learner_handles import LearnerActor
        from marl_core.rollout.pool import WorkerPool

        state = progress.state
        pools = []
        for i in range(config.population):
            member = state.member_config(config, i)
            pool = WorkerPool(pool_config(member), on_ray=True)
            stack.callback(pool.close)
            work = training_work(member, state.round)
            stack.enter_context(pool.tracking(dataclasses.replace(work, label=f"member {i}: {work.label}")))
            pools.append(pool)
        learners = progress.learners or [None] * config.population
        actors = [
            ray.remote(num_cpus=0)(LearnerActor).remote(state.member_config(config, i), learners[i])
            for i in range(config.population)
        ]
        layout_, _ = layout_and_spec(config.marl)
        return PBTSession(pools, actors, layout_)

    def step(self, config, session: PBTSession, progress: PBTProgress, index: int) -> Step:
        from flows.runtime.task_steps import RayTaskSteps
        from marl_core.marl.learner_handles import RayLearner
        from marl_core.pbt.marl import run_pbt_round
        from tasks.marl_tasks import TASKS

        runner = RayTaskSteps(TASKS, driving_actors=frozenset(TASKS))
        learners = [RayLearner(a) for a in session.actors]
        records = run_pbt_round(
            config, progress.state, runner, session.pools, learners, session.layout, concurrently=_at_once
        )
        return Step(records, progress)

    def between(self, config, session: PBTSession, step: Step) -> Step:
        """Exploit and explore: every member finished the round; at a perturbation point the
        bottom members' actors adopt a top member's training state under their new settings."""
        import ray

        from marl_core.pbt.marl import PBTRound, perturb

        state, records = step.state.state, step.record
        state.advance(records)
        lineage = perturb(config, state, records)
        sources = {e.source: session.actors[e.source].state.remote() for e in lineage}
        ray.get(
            [
                session.actors[e.member].adopt.remote(state.member_config(config, e.member), sources[e.source])
                for e in lineage
            ]
        )
        record = PBTRound(state.round - 1, records, [dict(h) for h in state.hyperparameters], lineage)
        return Step(record, PBTProgress(state))

    def checkpoint(self, config, session: PBTSession, index: int, step: Step):
        import ray

        from marl_core.marl.config import checkpoint_due

        if not checkpoint_due(config.marl, index):
            return None
        return step.state.state, ray.get([a.checkpoint.remote() for a in session.actors])

    def tracker(self, config, resume, tags):
        from flows.tracking.pbt_tracker import PBTTracker

        return PBTTracker(config, resume, tags)

    # --- the command's lines ------------------------------------------------------------------

    def line(self, record, state) -> str:
        lines = [f"round {record.round:4d}  {record.summary()}"]
        for entry in record.lineage:
            changed = "  ".join(
                f"{k} {entry.before[k]:.3g} -> {v:.3g}" if isinstance(v, float) else f"{k} {entry.before[k]} -> {v}"
                for k, v in entry.after.items()
            )
            lines.append(
                f"    member {entry.member} ({entry.member_score:.2f}) copies member {entry.source} "
                f"({entry.source_score:.2f}): {changed}"
            )
        return "\n".join(lines)

    def done(self, config, progress, record, seconds: float) -> str:
        return f"done: {progress.state.round} rounds, {len(progress.state.lineage)} copies in {seconds:.1f}s"


PBT = PBTScenario()
