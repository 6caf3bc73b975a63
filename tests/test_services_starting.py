"""A run starts Ray on a thread while its driver goes on importing (`flows.services.ray_session.ray_in_background`),
and joins a cluster through Ray Client even where its server refuses a first connection.

Two threads that import a package whose modules import each other can see it half-initialised:
a learned `psro run` failed once in CI with "cannot import name 'Field' from partially initialized
module 'pydantic.v1.fields'", which Ray's serializers (on the thread, when the workers' warm-up
is exported) and Prefect (imported by the driver meanwhile) both import. The driver imports it
before the thread starts.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from unittest import mock

import flows.services.ray_session as runtime

assert "pydantic.v1" not in sys.modules, "imported before the run starts Ray: this check would prove nothing"
seen = []
with mock.patch.object(runtime, "start_ray", lambda *args: seen.append("pydantic.v1.fields" in sys.modules)), \\
        mock.patch.object(runtime, "warm_up_workers", lambda environment: []), mock.patch("ray.shutdown"):
    with runtime.ray_in_background(None, 1, {}, "kuhn_poker") as wait_for_ray:
        wait_for_ray()
print(seen)
"""


def test_pydantic_v1_is_imported_whole_before_ray_starts_on_its_thread():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["[True]"]


def test_a_ray_client_refused_at_its_servers_birth_connects_again(monkeypatch):
    """`flows.services.ray_session._join`: Ray Client's "Initialization failure from server" (its
    server's process for this client died as it was forked, Ray issue #63202) is met by
    connecting again, up to `CLIENT_CONNECT_TRIES` in all; any other refusal is raised at once."""
    import pytest
    import ray

    import flows.services.ray_session as session

    refusals: list[BaseException] = []

    def init(**kwargs):
        if refusals:
            raise refusals.pop(0)

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    born_dead = ConnectionAbortedError("Initialization failure from server:\nZombieProcess")
    refusals[:] = [born_dead] * (session.CLIENT_CONNECT_TRIES - 1)
    session._join("ray://127.0.0.2:10001", None)
    assert refusals == []
    refusals[:] = [born_dead] * session.CLIENT_CONNECT_TRIES
    with pytest.raises(ConnectionAbortedError):
        session._join("ray://127.0.0.2:10001", None)
    refusals[:] = [ConnectionAbortedError("Authentication failed")]
    with pytest.raises(ConnectionAbortedError, match="Authentication"):
        session._join("ray://127.0.0.2:10001", None)
