"""Progress of long work: counted where the rollout pool collects, kept in the weight store,
shown as live rows on a terminal or as plain lines anywhere else. The real commands' progress
lines are checked on their end-to-end runs (`test_learned_end_to_end.py`, `test_marl_flow.py`)."""

from __future__ import annotations

import pytest

from flows.runtime.progress import PlainLines, describe, watching
from marl_core.rollout.progress import Progress, ProgressBoard, Work
from marl_core.rollout.weight_store import WeightStore


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_store_keeps_done_total_rate_and_time_left_and_drops_work_that_ended():
    clock = FakeClock()
    store = WeightStore(clock=clock)
    store.begin(Work("a", "best response player_0 (iteration 1)", 3000, "episodes"))
    clock.now += 2
    store.begin(Work("b", "mappo training", 1000, "steps"))
    (a, b) = store.progress()
    assert a == Progress("best response player_0 (iteration 1)", 0, 3000, "episodes", 2.0)
    assert a.rate is None and a.seconds_left is None  # nothing done yet: no rate to guess from
    store.advance("a", 1000)
    store.advance("a", 200)
    clock.now += 1
    (a, b) = store.progress()
    assert (a.done, a.elapsed, a.rate, a.seconds_left) == (1200, 3.0, 400.0, 4.5)
    assert (b.done, b.elapsed) == (0, 1.0)
    store.end_work("a")
    store.advance("a", 500)  # a collector's last count after its learner ended: not an error, not counted
    assert [p.label for p in store.progress()] == ["mappo training"]
    store.advance("b", 300)
    clock.now += 1
    store.begin(Work("b", "mappo training", 1000, "steps"))  # opened again (a retried attempt): from 0 done, same start
    assert store.progress() == [Progress("mappo training", 0, 1000, "steps", 2.0)]


def test_work_that_ends_before_any_read_is_shown_once_as_it_ended():
    """A response shorter than the reader's poll still gets its line: it stays until read once."""
    clock = FakeClock()
    board = ProgressBoard(clock=clock)
    board.begin(Work("a", "best response player_1 (iteration 2)", 2000, "episodes"))
    board.advance("a", 2000)
    clock.now += 1.5
    board.end("a")
    board.advance("a", 100)  # after its end: not counted
    clock.now += 3
    assert board.read() == [Progress("best response player_1 (iteration 2)", 2000, 2000, "episodes", 1.5)]
    assert board.read() == []  # shown once, then gone
    # a board nobody reads keeps only the newest KEPT_UNREAD of the work that ended
    for i in range(ProgressBoard.KEPT_UNREAD + 5):
        board.begin(Work(str(i), f"work {i}", 1, "steps"))
        board.end(str(i))
    labels = [p.label for p in board.read()]
    assert labels == [f"work {i}" for i in range(5, ProgressBoard.KEPT_UNREAD + 5)]


def test_plain_lines_come_when_work_starts_then_at_most_every_interval():
    clock, lines = FakeClock(0.0), []
    view = PlainLines(lines.append, every=10, clock=clock)

    def response(done, elapsed):
        return Progress("best response player_0 (iteration 3)", done, 3000, "episodes", elapsed)

    def training(done, elapsed):
        return Progress("mappo training", done, 64_000, "steps", elapsed)

    for second, shown in enumerate(
        [
            [response(0, 0.5)],
            [response(400, 1.5)],
            [response(1200, 2.0), training(0, 0.2)],
        ]
    ):
        clock.now = second
        view.show(shown)
    clock.now = 10.0
    view.show([response(3000, 7.5), training(5_000, 8.0)])  # the response's 10 s are up, the training's not
    clock.now = 11.0
    view.show([training(5_200, 8.5)])
    clock.now = 12.0
    view.show([training(5_500, 9.0)])
    clock.now = 13.0
    view.show([response(0, 0.1)])  # it dropped out (ended) and came back: a new piece of work
    assert lines == [
        "best response player_0 (iteration 3): 0/3000 episodes",
        "mappo training: 0/64000 steps",
        "best response player_0 (iteration 3): 3000/3000 episodes, 400/s, ~0 s left",
        "mappo training: 5500/64000 steps, 611/s, ~1 min 36 s left",
        "best response player_0 (iteration 3): 0/3000 episodes",
    ]


def test_a_long_wait_reads_in_hours_and_minutes():
    assert describe(Progress("x", 1, 10_000, "steps", 1.0)) == "x: 1/10000 steps, 1/s, ~2 h 46 min left"


def test_the_watcher_shows_progress_in_its_callers_context():
    """Prefect's run logger sends a line to the API of the settings in context: a watcher thread
    without the caller's context (where the run's server is set) sent it to the server of
    Prefect's import-time settings, or had Prefect start a temporary one."""
    import contextvars
    import threading

    server = contextvars.ContextVar("server", default="the settings at import")
    server.set("the run's server")
    shown, done = [], threading.Event()

    class Recording:
        def show(self, progress):
            shown.append(server.get())
            done.set()

    with watching(lambda: [], Recording(), poll=0.01):
        assert done.wait(10)
    assert set(shown) == {"the run's server"}


def _recording_ends(monkeypatch) -> list[Progress]:
    """Every piece of work as it stood when it ended (it then drops out of the store)."""
    ended, original = [], ProgressBoard.end

    def end(board, work_id):
        before = board.read()
        original(board, work_id)
        left = {p.label for p in board.read()}
        ended.extend(p for p in before if p.label not in left)

    monkeypatch.setattr(ProgressBoard, "end", end)
    return ended


def test_a_learned_psro_run_reports_every_response_up_to_its_budget(monkeypatch):
    from marl_core.psro.config import build_config
    from marl_core.psro.steps import iterate_psro_local

    ended = _recording_ends(monkeypatch)
    config = build_config(
        dict(
            game="kuhn_poker",
            oracle="ppo",
            iterations=1,
            rollout={"workers": 2, "envs_per_worker": 4},
            best_response={"episodes": 300, "episodes_per_round": 100},
            approx_exploitability={"every": 1, "episodes": 200, "eval_episodes": 50},
        )
    )
    list(iterate_psro_local(config))
    assert sorted((p.label, p.done, p.total, p.unit) for p in ended) == [
        (f"approximate-exploitability response player_{role} (iteration {iteration})", 200, 200, "episodes")
        for role in (0, 1)
        for iteration in (0, 1)
    ] + [
        ("best response player_0 (iteration 1)", 300, 300, "episodes"),
        ("best response player_1 (iteration 1)", 300, 300, "episodes"),
    ]


def test_a_sampled_psro_run_reports_each_iterations_payoff_evaluation(monkeypatch):
    from marl_core.psro.config import build_config
    from marl_core.psro.steps import iterate_psro_local

    ended = _recording_ends(monkeypatch)
    config = build_config(
        dict(game="kuhn_poker", eval="sampled", episodes=20, iterations=1, rollout={"workers": 2, "envs_per_worker": 4})
    )
    list(iterate_psro_local(config))
    assert [(p.label, p.done, p.total, p.unit) for p in ended] == [
        ("payoff evaluation (iteration 0)", 20, 20, "episodes"),  # the 1x1 table
        ("payoff evaluation (iteration 1)", 60, 60, "episodes"),  # the 2x2 table's three new profiles
    ]


def test_a_marl_run_reports_its_training_steps_round_by_round(monkeypatch):
    from marl_core.marl.config import MARLConfig
    from marl_core.marl.rounds import iterate_marl_local

    ended = _recording_ends(monkeypatch)
    config = MARLConfig(
        env="pettingzoo:mpe2.simple_spread_v3",
        algorithm="ippo",
        rounds=3,
        steps_per_round=10,
        workers=2,
        envs_per_worker=2,
        eval_every=3,
        eval_episodes=2,
    )
    list(iterate_marl_local(config))
    assert [(p.label, p.done, p.total, p.unit) for p in ended] == [("ippo training", 120, 120, "steps")]


@pytest.mark.parametrize(
    "command", [["run", "--game", "kuhn_poker"], ["marl", "run", "--env", "pettingzoo:mpe2.simple_spread_v3"]]
)
def test_a_bad_progress_interval_is_one_line_before_anything_starts(command, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flows.cli.app import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PSRO_PROGRESS_EVERY", "0")
    result = CliRunner().invoke(app, command, terminal_width=400)
    assert result.exit_code == 2
    assert result.output.strip() == "error: PSRO_PROGRESS_EVERY='0': seconds between progress lines, a number above 0"
    assert list(tmp_path.iterdir()) == []
