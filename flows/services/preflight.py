"""Checks of the outside world made before any work: by `psro run`, `psro resume` and every flow run.

The config model (`marl_core.psro.config`) checks what a value *is*; these check what it *points at*:
a Ray cluster, an MLflow store, an export directory. Each would otherwise fail late and at a
cost: `ray.init` retries an address nobody answers at for about ten minutes, MLflow creates its
database and `./mlruns` before it finds it cannot write, and an export would mix its files with a
previous one's. Nothing here starts a process or creates a file (an SQLite store is only read,
with SQLite's `immutable` flag, which takes no lock and writes no journal). A failure is a
`ConfigError`: one line naming the value and what is allowed, printed by the CLI as `error: ...`
with exit code 2, as for every other bad setting.

Decisions:

- Ray: ``auto`` and ``local`` pass (Ray resolves them itself, quickly). ``HOST:PORT`` (the head's
  GCS) and ``ray://HOST:PORT`` (Ray Client) must accept a TCP connection within a few seconds and
  answer the HTTP/2 preface that every gRPC server answers, so that the dashboard's port (8265,
  a common mix-up) or any other non-Ray service is refused too. With ``RAY_USE_TLS`` set only
  the TCP connection is checked.
- MLflow: the store itself (the SQLite file) may be new, but the directory that holds it must
  already exist and be writable. MLflow would create missing directories; a store in a directory
  that does not exist is nearly always a typo, and a typo should not silently start a new
  history. A new experiment's artifacts go to ``./mlruns``, so that must be creatable too. A
  server (``http(s)://``) must answer HTTP and take the credentials in the environment
  (``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` or ``MLFLOW_TRACKING_TOKEN``, which MLflow's client
  sends) where it asks for them; a database URL's host and port must accept a TCP connection.
- Prefect: a server named by ``PREFECT_API_URL`` must answer and take ``PREFECT_API_AUTH_STRING``
  where it asks for credentials; unset, the run starts its own server and there is nothing to check.
- Export: a directory that does not exist yet (it is created, with its parents) or one that is
  empty. An existing non-empty directory is refused, never overwritten or merged into.
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from marl_core.psro.config import ConfigError

TIMEOUT = 3.0  # seconds to connect and to answer; a reachable local service needs milliseconds

RAY_ALLOWED = (
    "expected HOST:PORT of a running Ray head (its GCS port, 6379 by default), ray://HOST:PORT "
    "(Ray Client, port 10001 by default), 'auto' or 'local', or no address to start a local Ray"
)
STORE_ALLOWED = (
    "expected sqlite:///FILE.db in an existing writable directory, http(s)://HOST:PORT of an MLflow "
    "server, or a database URL (postgresql://, mysql://, mssql://)"
)
EXPORT_ALLOWED = "expected a new directory or an empty one (a previous export is never overwritten)"
RAY_CLIENT_PORT = 10001  # what `ray://HOST` means without a port, as in ray.init
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
HTTP2_SETTINGS = 0x04
SQLITE_HEADER = b"SQLite format 3\x00"


def preflight(settings) -> None:
    """Raise ConfigError for the first setting that points at something unusable; `settings`
    is a `flows.runtime.scenario.RunSettings` (or anything with its fields)."""
    check_ray_address(settings.ray_address)
    check_tracking_store(settings.tracking_uri, settings.experiment)
    check_export_dir(settings.export)
    check_prefect_api(os.environ.get("PREFECT_API_URL"))


def _authorized(url: str, headers: dict[str, str]) -> int | None:
    """The HTTP status of a GET that needs credentials where a server asks for them (None when it
    went through); raises OSError when nothing answers."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT):
            return None
    except urllib.error.HTTPError as error:
        return error.code


def basic_auth(credentials: str) -> dict[str, str]:
    """The HTTP basic-auth header of `user:password` (what Prefect's and MLflow's clients send)."""
    return {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}


# --- Ray --------------------------------------------------------------------------------------


def check_ray_address(address: str | None) -> None:
    if address is None or address in ("auto", "local"):
        return

    def fail(reason: str):
        raise ConfigError(f"ray_address={address!r}: {reason}; {RAY_ALLOWED}")

    client = address.startswith("ray://")
    host, port = _host_port(address.removeprefix("ray://"))
    port = port or (RAY_CLIENT_PORT if client and host else None)
    if host is None or port is None:
        fail("not an address")
    problem = _connect_problem(host, port)
    if problem:
        fail(problem)
    if not _truthy(os.environ.get("RAY_USE_TLS")) and not _speaks_grpc(host, port):
        fail(f"{host}:{port} answers, but not as Ray (no gRPC reply; the dashboard port is not a Ray address)")


def _speaks_grpc(host: str, port: int) -> bool:
    """Every gRPC server (Ray's GCS, Ray Client) answers the HTTP/2 preface with a SETTINGS frame."""
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT) as sock:
            sock.sendall(HTTP2_PREFACE)
            header = sock.recv(9)
    except OSError:
        return False
    return len(header) >= 4 and header[3] == HTTP2_SETTINGS


# --- MLflow -----------------------------------------------------------------------------------


def check_tracking_store(uri: str, experiment: str) -> None:
    def fail(reason: str):
        raise ConfigError(f"tracking_uri={uri!r}: {reason}; {STORE_ALLOWED}")

    scheme = uri.partition(":")[0].lower() if "://" in uri else ""
    if scheme == "sqlite":
        problem = _sqlite_problem(uri, experiment)
    elif scheme in ("http", "https"):
        problem = _http_problem(uri)
        refused = None if problem else _mlflow_credentials_problem(uri)
        if refused:
            raise ConfigError(f"tracking_uri={uri!r}: {refused}")
    elif scheme.split("+")[0] in DATABASE_PORTS:
        parts = urlsplit(uri)
        problem = _connect_problem(parts.hostname or "localhost", parts.port or DATABASE_PORTS[scheme.split("+")[0]])
    elif scheme.startswith("databricks"):
        problem = None  # credentials and workspaces are Databricks' own business
    elif scheme in ("", "file"):
        problem = _file_store_problem(uri)
    else:
        problem = f"unknown scheme {scheme!r}"
    if problem:
        fail(problem)


def _sqlite_problem(uri: str, experiment: str) -> str | None:
    """SQLAlchemy's form: sqlite:///relative/path.db or sqlite:////absolute/path.db."""
    name = uri[len("sqlite://") :].partition("?")[0]
    if name in ("", "/", "/:memory:"):
        return "an in-memory store keeps nothing after the run"
    path = Path(name[1:])
    problem = _directory_problem(path.parent, create=False)
    if problem:
        return problem
    if path.is_dir():
        return f"'{path}' is a directory, not an SQLite file"
    if path.exists():
        if not os.access(path, os.R_OK | os.W_OK):
            return f"'{path}' is not writable"
        with path.open("rb") as database:
            header = database.read(len(SQLITE_HEADER))
        if header and header != SQLITE_HEADER:
            return f"'{path}' is not an SQLite database"
    artifacts = _artifact_root(path, experiment)
    if artifacts is not None:
        problem = _directory_problem(artifacts, create=True)
        if problem:
            return f"artifacts of experiment {experiment!r} go to '{artifacts}': {problem}"
    return None


def _artifact_root(database: Path, experiment: str) -> Path | None:
    """Where MLflow will write this run's artifacts, when that is a local directory.

    An existing experiment keeps its own location; a new one (and a new store) uses ./mlruns.
    """
    location = "./mlruns"
    if database.exists() and database.stat().st_size:
        query = "SELECT artifact_location FROM experiments WHERE name = ?"
        try:
            with contextlib.closing(sqlite3.connect(f"{database.resolve().as_uri()}?immutable=1", uri=True)) as db:
                row = db.execute(query, (experiment,)).fetchone()
        except sqlite3.Error:
            return None  # not MLflow's schema (yet); MLflow itself will say what is wrong
        if row:
            location = row[0]
    scheme = urlsplit(location).scheme
    if scheme == "file":
        return Path(urlsplit(location).path)
    if scheme:
        return None  # s3://, mlflow-artifacts:/ ...: a remote store, checked by MLflow when used
    return Path(location)


def _file_store_problem(uri: str) -> str | None:
    if not _truthy(os.environ.get("MLFLOW_ALLOW_FILE_STORE")):
        return "MLflow 3 refuses a directory (file) store unless MLFLOW_ALLOW_FILE_STORE=true"
    path = Path(urlsplit(uri).path if uri.startswith("file:") else uri)
    if path.exists() and not path.is_dir():
        return f"'{path}' is a file, not a directory"
    return _directory_problem(path if path.exists() else path.parent, create=False)


def _http_problem(uri: str) -> str | None:
    """Any HTTP answer to /health (even 404) shows a server is there; MLflow's own errors say the
    rest."""
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=TIMEOUT):
            pass
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        parts = urlsplit(uri)
        if isinstance(reason, socket.gaierror):
            return f"host {parts.hostname!r} does not resolve"
        return f"no MLflow server answers at {parts.netloc} ({_describe(reason)})"
    return None


def _mlflow_credentials_problem(uri: str) -> str | None:
    """A server that refuses this environment's credentials (or their absence) would otherwise
    fail the run at its first call, after the services started."""
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    headers = basic_auth(f"{user}:{password}") if user and password else {}
    if not headers and token:
        headers = {"Authorization": f"Bearer {token}"}
    try:
        code = _authorized(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1", headers)
    except OSError:
        return None  # it answered /health a moment ago; MLflow's client will say what broke
    if code not in (401, 403):
        return None
    if not headers:
        return f"the server asks for credentials ({code}): set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
    used = "MLFLOW_TRACKING_USERNAME/PASSWORD" if user and password else "MLFLOW_TRACKING_TOKEN"
    return f"the server refused the credentials in {used} ({code})"


# --- Prefect ----------------------------------------------------------------------------------


def check_prefect_api(api_url: str | None) -> None:
    """Raise ConfigError unless the Prefect server at `api_url` answers and takes this
    environment's PREFECT_API_AUTH_STRING (a server started with an auth string refuses every
    request without it, and the run would fail at its first state change)."""
    if not api_url:
        return
    auth = os.environ.get("PREFECT_API_AUTH_STRING")
    try:
        code = _authorized(api_url.rstrip("/") + "/admin/version", basic_auth(auth) if auth else {})
    except (urllib.error.URLError, OSError) as error:
        reason = _describe(getattr(error, "reason", error))
        raise ConfigError(f"PREFECT_API_URL={api_url!r}: no Prefect server answers ({reason})") from None
    if code in (401, 403):
        what = "refused PREFECT_API_AUTH_STRING" if auth else "asks for credentials: set PREFECT_API_AUTH_STRING"
        raise ConfigError(f"PREFECT_API_URL={api_url!r}: the server {what} ({code})")


# --- export -----------------------------------------------------------------------------------


def check_export_dir(directory: Path | None) -> None:
    if directory is None:
        return
    directory = Path(directory)
    if directory.is_dir():
        if any(directory.iterdir()):
            problem = f"directory '{directory}' exists and is not empty"
        elif not os.access(directory, os.W_OK | os.X_OK):
            problem = f"directory '{directory}' is not writable"
        else:
            problem = None
    elif directory.exists():
        problem = f"'{directory}' is a file, not a directory"
    else:
        problem = _directory_problem(directory, create=True)
    if problem:
        raise ConfigError(f"export={str(directory)!r}: {problem}; {EXPORT_ALLOWED}")


# --- shared -----------------------------------------------------------------------------------


def _directory_problem(directory: Path, create: bool) -> str | None:
    """Why files cannot be written in `directory`; with create=True it may be made (with parents).

    Permissions are read with os.access, which grants root everything; a path through a regular
    file or a missing directory is refused for every user.
    """
    existing = directory
    while not existing.exists():
        if not create:
            return f"directory '{existing}' does not exist"
        existing = existing.parent
    if not existing.is_dir():
        return f"'{existing}' is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"directory '{existing}' is not writable"
    return None


def _host_port(address: str) -> tuple[str | None, int | None]:
    try:
        parts = urlsplit(f"//{address}")
        return parts.hostname, parts.port
    except ValueError:  # a port that is not a number, or out of range
        return None, None


def _connect_problem(host: str, port: int) -> str | None:
    try:
        socket.create_connection((host, port), timeout=TIMEOUT).close()
        return None
    except socket.gaierror:
        return f"host {host!r} does not resolve"
    except OSError as error:
        return f"nothing answers at {host}:{port} ({_describe(error)})"


def _describe(error) -> str:
    if isinstance(error, (socket.timeout, TimeoutError)):
        return f"no answer within {TIMEOUT:g} s"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return str(error)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")
