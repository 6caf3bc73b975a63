"""What a run left in MLflow, read the way the resume and retry tests compare runs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from flows.tracking import layout


def final_tables(client, run_id: str, iteration: int) -> tuple[str, dict]:
    """The run's final payoff CSV (as text) and its meta-strategy at `iteration`."""
    payoffs = Path(client.download_artifacts(run_id, layout.FINAL_PAYOFFS)).read_text()
    meta = json.loads(Path(client.download_artifacts(run_id, layout.meta_strategy_path(iteration))).read_text())
    return payoffs, meta


def uninterrupted_tables(config) -> tuple[str, dict]:
    """What `final_tables` reads from a run of `config` that nothing interrupted, computed by
    playing it through in this process and rendered as the run tracker renders it: the flow
    computes what the local loop does (`tests/test_flow_matches_local.py`)."""
    from marl_core.empirical_game.game import psro_game_of
    from marl_core.psro.steps import iterate_psro_local

    *_, (record, state) = iterate_psro_local(config)
    return state.payoffs.to_frame().to_csv(index=False), dict(zip(psro_game_of(config).roles, record.meta_strategy))


def registered_members(client, experiment: str, role: str, game: str = "kuhn_poker") -> list[tuple[int, int]]:
    """(member, iteration) of every registry version of the role's model."""
    name = layout.registered_model_name(experiment, game, role)
    tags = [layout.VersionTags.of(v.tags) for v in client.search_model_versions(f"name='{name}'")]
    return sorted((t.member, t.iteration) for t in tags)


def assert_each_version_once(client, run_id: str) -> None:
    """No registry version of the run twice: none of a step the killed attempt registered and
    the retry redid (deleted on resume, registered again)."""
    keys = Counter()
    for model in client.search_registered_models():
        for version in client.search_model_versions(layout.versions_of_run(model.name, run_id)):
            tags = version.tags
            step = tags.get("round", tags.get("iteration"))
            keys[(model.name, step, tags.get("member"), tags.get("snapshot"), tags.get("policy"))] += 1
    twice = [key for key, count in keys.items() if count > 1]
    assert not twice, twice


def assert_each_metric_once(client, run) -> None:
    """No step of any metric logged twice: none of the steps a killed attempt did after its last
    commit and the resumed one did again."""
    for metric in run.data.metrics:
        steps = [point.step for point in client.get_metric_history(run.info.run_id, metric)]
        assert len(steps) == len(set(steps)), (metric, sorted(steps))
