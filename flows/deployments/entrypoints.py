"""Every scenario's Prefect flows, bound to names here: what a deployment's entrypoint names
(`flows.deployments.entrypoints.psro`, `flows.deployments.entrypoints.marl`, ...), whatever starts the run (the command
line, `psro serve`, a work pool's worker).

A scenario has two flows (`scenario_flows`): the top-level one, named after the scenario, whose
parameters are a plain config mapping, and its step's subflow "{scenario}-{step}" (its
parameters: the step's index and the key of the state handed to it in this process). Both are
bound at module level, so that Prefect loads a deployment's flow by module path, and so that a
Ray worker gets a subflow's context by module and name instead of the flow pickled whole
(`flows.runtime.ray_runner`).
"""

from __future__ import annotations

from typing import Any

from flows.runtime.run import Observer, run_flow, run_step
from flows.runtime.scenario import Scenario
from flows.scenarios import SCENARIOS

_flows: dict[Scenario, tuple[Any, Any]] = {}  # each scenario's flows, as first made


def scenario_flows(scenario: Scenario, module: str) -> tuple[Any, Any]:
    """The scenario's top-level flow and its step's subflow, to be bound in `module` under the
    scenario's name and "{name}_{step_noun}"."""
    from prefect import flow

    from flows.runtime.ray_runner import FastRayTaskRunner
    from flows.services.patches import fresh_every_call

    def step(index: int, handoff: str):
        return run_step(scenario, index, handoff)

    step_name = f"{scenario.name}_{scenario.step_noun}"
    step.__module__, step.__name__, step.__qualname__ = module, step_name, step_name
    step_flow = flow(
        name=f"{scenario.name}-{scenario.step_noun}",
        task_runner=FastRayTaskRunner(),
        validate_parameters=False,
        persist_result=False,
    )(step)
    step_flow = fresh_every_call(step_flow)

    def run(config: dict, resume_run_id: str | None = None, observer: Observer | None = None, progress=None):
        return run_flow(scenario, step_flow, config, resume_run_id, observer, progress)

    run.__module__, run.__name__, run.__qualname__ = module, scenario.name, scenario.name
    run.__doc__ = scenario.summary
    top = flow(name=scenario.name, description=scenario.summary, validate_parameters=False, persist_result=False)(run)
    top.scenario = scenario
    _flows.setdefault(scenario, (top, step_flow))
    return top, step_flow


psro, psro_iteration = scenario_flows(SCENARIOS["psro"], __name__)
marl, marl_round = scenario_flows(SCENARIOS["marl"], __name__)
league, league_generation = scenario_flows(SCENARIOS["league"], __name__)
pbt, pbt_round = scenario_flows(SCENARIOS["pbt"], __name__)
cfr, cfr_round = scenario_flows(SCENARIOS["cfr"], __name__)


def flow_of(scenario: Scenario):
    """The scenario's top-level flow (a scenario defined elsewhere, as a test's, binds its
    flows in its own module first: `scenario_flows(SCENARIO, __name__)`)."""
    return _flows[scenario][0]


def run_scenario(
    scenario: Scenario,
    config,
    resume_run_id: str | None = None,
    observer: Observer | None = None,
    services=None,
    progress=None,
):
    """Start what the run needs (Prefect server, Ray, MLflow store), run the scenario's flow,
    stop all. ``config`` was checked (`flows.cli.scenario_commands` did, or the caller built it).
    ``services``: the services as `flows.services.run_services.services_starting` began them, for callers
    that start them before their own slow imports, as the command line does."""
    from flows.services.run_services import run_services

    settings = scenario.settings(config)
    with run_services(settings.ray_address, settings.num_cpus, settings.environment, settings.tracking_uri, services):
        return flow_of(scenario)(config, resume_run_id, observer, progress)
