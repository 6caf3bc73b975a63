"""The tasks the BenchMARL comparison plays, by name: BenchMARL's task, the episode length both
sides use, and this project's environment name. Read by `marl_vs_benchmarl.py` and by
`benchmarl_differential.py`, which checks each MPE task steps the same on both sides."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Task:
    benchmarl: str  # BenchMARL's <environment>/<task>
    max_steps: int  # episode length on both sides
    ours: str | None  # this project's environment name; None: written from BenchMARL's task yaml (VMAS)

    @property
    def family(self) -> str:
        return self.benchmarl.split("/")[0]


TASKS = {
    "simple_spread": Task("pettingzoo/simple_spread", 25, "pettingzoo:mpe2.simple_spread_v3"),
    "simple_speaker_listener": Task(
        "pettingzoo/simple_speaker_listener", 25, "pettingzoo:mpe2.simple_speaker_listener_v4"
    ),
    "navigation": Task("vmas/navigation", 100, None),
    "balance": Task("vmas/balance", 100, None),
}
