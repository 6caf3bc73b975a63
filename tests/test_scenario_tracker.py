"""What every scenario's tracker sends MLflow at a commit, read off a client that records requests."""

from __future__ import annotations

from flows.tracking.scenario_tracker import METRICS_PER_REQUEST, ScenarioTracker


class RecordingClient:
    def __init__(self):
        self.requests: list[tuple[str, list, list]] = []

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.requests.append(("log_batch", list(metrics), list(tags)))

    def set_terminated(self, run_id, status):
        self.requests.append((f"set_terminated {status}", [], []))


class Tracker(ScenarioTracker):
    commit_tag = "toy.committed_step"


def tracker() -> Tracker:
    made = Tracker(config=None, tracking_uri="http://127.0.0.1:1", experiment="toy")
    made.client, made.run_id = RecordingClient(), "run"
    return made


def test_metrics_wait_for_the_commit_that_covers_them_and_go_before_its_tag():
    made = tracker()
    for step in range(4):  # 4 steps x 250 metrics: more than one request holds
        made._log_metrics(step, {f"m{k}": float(step) for k in range(250)})
    assert made.client.requests == []  # nothing sent before the commit
    made._commit(3)
    sent = made.client.requests
    assert [len(metrics) for _, metrics, _ in sent] == [METRICS_PER_REQUEST, 1000 - METRICS_PER_REQUEST]
    assert [[(t.key, t.value) for t in tags] for _, _, tags in sent] == [[], [("toy.committed_step", "3")]]
    assert sorted({(m.step, m.key) for _, metrics, _ in sent for m in metrics}) == sorted(
        (step, f"m{k}") for step in range(4) for k in range(250)
    )  # each point once

    made.client.requests.clear()
    made._commit(4)  # a step without metrics commits alone
    assert [(len(m), [t.value for t in tags]) for _, m, tags in made.client.requests] == [(0, ["4"])]


def test_a_run_that_fails_drops_the_uncommitted_steps_metrics_and_a_finished_one_sends_them():
    failed, finished = tracker(), tracker()
    for made in (failed, finished):
        made._log_metrics(7, {"loss": 0.5})
    failed._end("FAILED")  # its resume redoes step 7 and logs it then
    finished._end("FINISHED")
    assert [name for name, _, _ in failed.client.requests] == ["set_terminated FAILED"]
    assert [(name, [m.key for m in metrics]) for name, metrics, _ in finished.client.requests] == [
        ("log_batch", ["loss"]),
        ("set_terminated FINISHED", []),
    ]
