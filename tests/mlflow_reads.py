"""What a run left in MLflow, read the way the resume and retry tests compare runs."""

from __future__ import annotations

import json
from pathlib import Path

from flows.tracking.run_tracker import registered_model_name


def final_tables(client, run_id: str, iteration: int) -> tuple[str, dict]:
    """The run's final payoff CSV (as text) and its meta-strategy at `iteration`."""
    payoffs = Path(client.download_artifacts(run_id, "payoffs/final.csv")).read_text()
    meta = json.loads(Path(client.download_artifacts(run_id, f"meta_strategy/iteration_{iteration:04d}.json")).read_text())
    return payoffs, meta


def registered_members(client, experiment: str, player: int, game: str = "kuhn_poker") -> list[tuple[int, int]]:
    """(member, iteration) of every registry version of the player's model."""
    name = registered_model_name(experiment, game, player)
    return sorted((int(v.tags["member"]), int(v.tags["iteration"])) for v in client.search_model_versions(f"name='{name}'"))
