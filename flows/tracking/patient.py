"""The MLflow client every tracker and reader here uses: one that waits out its server's outages.

MLflow's own client retries a request that gets no answer with exponential back-off (by default
7 retries, factor 2: 2, 4, ... 64 s apart), so a tracking server that is down for a minute is
noticed up to a minute after it is back, and one down for five minutes fails the run. Here a
call that cannot reach the server instead waits for it: it polls the server's `/health` every
second, for up to `PATIENCE_S`, and is made again as soon as anything answers. The outage
shows as one warning when it starts and one when it ends. An error the server answers with (a
bad request, an unknown run) raises at once: only silence is waited out.

MLflow's back-off would sit between the server's return and our retry, so a process that opens
one of these clients lowers MLflow's retries to `MLFLOW_RETRIES` (where the user has not set
`MLFLOW_HTTP_REQUEST_MAX_RETRIES`); its retries still absorb a single dropped connection.
A call is made again only after it failed to reach the server, where it stored nothing, so a
retry writes nothing twice. Local stores (`sqlite:`, paths) never wait: they have no server.
"""

from __future__ import annotations

import logging
import os
import time

PATIENCE_S = 900.0  # how long a call waits for its server before the run fails
POLL_S = 1.0
MLFLOW_RETRIES = "1"

log = logging.getLogger(__name__)


def mlflow_client(tracking_uri: str):
    """An `MlflowClient` on `tracking_uri` (its registry too); patient where it is a server."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    if not tracking_uri.startswith(("http://", "https://")):
        return client
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", MLFLOW_RETRIES)
    return PatientClient(client, tracking_uri)


def unreachable(error: BaseException) -> bool:
    """Whether `error` (or what it was raised from) is a request that got no answer."""
    import requests

    silent = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, requests.exceptions.RetryError)
    while error is not None:
        if isinstance(error, silent):
            return True
        error = error.__cause__ or error.__context__
    return False


class PatientClient:
    """`MlflowClient`'s methods, each waiting out an outage of the server before it fails."""

    def __init__(self, client, tracking_uri: str):
        self._client = client
        self._uri = tracking_uri.rstrip("/")

    def __getattr__(self, name: str):
        method = getattr(self._client, name)
        if not callable(method):
            return method

        def patiently(*args, **kwargs):
            deadline = time.monotonic() + PATIENCE_S
            failed_at = None
            while True:
                try:
                    result = method(*args, **kwargs)
                except Exception as error:
                    if not unreachable(error) or time.monotonic() > deadline:
                        raise
                    if failed_at is None:
                        failed_at = time.monotonic()
                        log.warning(
                            "MLflow at %s did not answer %s (%s); retrying for up to %.0f s",
                            self._uri,
                            name,
                            type(error).__name__,
                            PATIENCE_S,
                        )
                    if not self._waited_for_an_answer(deadline):
                        time.sleep(POLL_S)  # it answers, yet fails the call (its database may be down)
                    continue
                if failed_at is not None:
                    log.warning("MLflow at %s answered %s after %.1f s", self._uri, name, time.monotonic() - failed_at)
                return result

        return patiently

    def _waited_for_an_answer(self, deadline: float) -> bool:
        """Poll the server's health check until it answers or `deadline`: whether it was silent."""
        import requests

        silent = False
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self._uri}/health", timeout=POLL_S).status_code < 500:
                    return silent
            except requests.exceptions.RequestException:
                pass
            silent = True
            time.sleep(POLL_S)
        return silent
