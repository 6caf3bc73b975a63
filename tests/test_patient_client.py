"""The trackers' MLflow client waits out a tracking server that does not answer, and only that.

The server here is a stand-in speaking the two MLflow REST routes the calls need (the stack's
real server going down and up is `test_stack.py`'s MLflow fault); it can be started late and
answer an error, which a real server cannot be told to do.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mlflow.exceptions import MlflowException

from flows.tracking import patient


class StandIn(BaseHTTPRequestHandler):
    requests: list[str] = []
    missing = False  # answer every experiment lookup with MLflow's "does not exist"
    failing = 0  # answer this many API requests with 503 first (a server whose database is down)

    def do_GET(self):  # noqa: N802 (http.server's name)
        StandIn.requests.append(self.path.split("?")[0])
        if self.path == "/health":
            body, status = b"OK", 200
        elif StandIn.failing > 0:
            StandIn.failing -= 1
            body, status = b"database unavailable", 503
        elif StandIn.missing:
            body, status = json.dumps({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no"}).encode(), 404
        else:
            experiment = {"experiment_id": "7", "name": "found", "lifecycle_stage": "active"}
            body, status = json.dumps({"experiment": experiment}).encode(), 200
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(autouse=True)
def quiet_retries(monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    StandIn.requests, StandIn.missing, StandIn.failing = [], False, 0


def serve(port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_call_to_a_server_that_is_down_waits_for_it_and_is_made_once_it_answers(port, caplog):
    client = patient.mlflow_client(f"http://127.0.0.1:{port}")
    started: list[float] = []

    def come_up_late():
        time.sleep(2.5)
        started.append(time.monotonic())
        servers.append(serve(port))

    servers: list[ThreadingHTTPServer] = []
    threading.Thread(target=come_up_late, daemon=True).start()
    with caplog.at_level(logging.WARNING, logger=patient.__name__):
        experiment = client.get_experiment_by_name("found")
    answered = time.monotonic()
    servers[0].shutdown()
    assert experiment.experiment_id == "7"
    assert answered - started[0] < 2 * patient.POLL_S + 1  # polled, not backed off
    assert StandIn.requests.count("/api/2.0/mlflow/experiments/get-by-name") == 1  # made once it answered
    assert [r.message.split(" (")[0].split(" after")[0] for r in caplog.records if r.name == patient.__name__] == [
        f"MLflow at http://127.0.0.1:{port} did not answer get_experiment_by_name",
        f"MLflow at http://127.0.0.1:{port} answered get_experiment_by_name",
    ]


def test_an_error_the_server_answers_with_raises_at_once(port):
    server = serve(port)
    StandIn.missing = True
    try:
        with pytest.raises(MlflowException, match="RESOURCE_DOES_NOT_EXIST"):
            patient.mlflow_client(f"http://127.0.0.1:{port}").get_experiment(experiment_id="7")
    finally:
        server.shutdown()
    assert "/health" not in StandIn.requests


def test_a_server_that_answers_but_fails_the_call_is_retried_each_second_not_in_a_busy_loop(port):
    server = serve(port)
    StandIn.failing = 4  # two attempts, each MLflow's request and its one retry
    started = time.monotonic()
    try:
        experiment = patient.mlflow_client(f"http://127.0.0.1:{port}").get_experiment_by_name("found")
    finally:
        server.shutdown()
    assert experiment.experiment_id == "7"
    assert StandIn.requests.count("/api/2.0/mlflow/experiments/get-by-name") == 5
    assert time.monotonic() - started >= 2 * patient.POLL_S


def test_a_server_silent_past_the_patience_fails_the_call(port, monkeypatch):
    monkeypatch.setattr(patient, "PATIENCE_S", 1.5)
    client = patient.mlflow_client(f"http://127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(MlflowException, match="127.0.0.1"):
        client.get_experiment_by_name("found")
    assert 1.5 <= time.monotonic() - started < 10


def test_local_stores_get_mlflows_own_client(tmp_path):
    import mlflow

    client = patient.mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert type(client) is mlflow.MlflowClient
