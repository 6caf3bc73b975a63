"""The registry of scenarios: every command (`psro run`, `psro marl run`, ...), deployment and
test that iterates over scenarios reads it. An entry is the scenario's declaration
(`flows.runtime.scenario.Scenario`), imported on first use."""

from __future__ import annotations

from marl_core.registry import Registry

SCENARIOS: Registry = Registry("scenario")
SCENARIOS.add("psro", "flows.scenarios.psro:PSRO", "PSRO and Pipeline PSRO on games and environments")
SCENARIOS.add("marl", "flows.scenarios.marl:MARL", "MARL training, synchronous and asynchronous, on one environment")
SCENARIOS.add("league", "flows.scenarios.league:LEAGUE", "League training: main agents, exploiters, PFSP, ratings")
SCENARIOS.add("pbt", "flows.scenarios.pbt:PBT", "Population-based training of MARL learners")
SCENARIOS.add("cfr", "flows.scenarios.cfr:CFR", "Neural CFR: networks near an equilibrium of two-player zero-sum games")
