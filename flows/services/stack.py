"""`psro stack up|join|status|down`: the team's services, started by one command per host.

A plain run starts its own Prefect server on SQLite, its own Ray and writes `./mlflow.db`. A team
shares one set instead, and this is that set, on 127.0.0.1 of one machine by default, or on the
head host's address (`up --host`) for worker hosts to join (`join`):

- PostgreSQL (Debian's `initdb`/`pg_ctl`), one cluster in DIR/postgres with two databases, one
  for Prefect and one for MLflow: SQLite serializes every writer, and a team's runs write at once.
- A Prefect server on the `prefect` database (`flows.services.prefect_server.LocalPrefectServer`, detached, with
  its scheduler on: it serves deployments).
- An MLflow tracking server on the `mlflow` database that also serves the artifacts (stored in
  DIR/artifacts, addressed as `mlflow-artifacts:`): a run needs the server's URL and nothing else,
  no path shared between machines.
- A Ray head and N worker nodes (`ray start`, loopback only, one CPU each, no dashboard).
- A Prefect work pool of type `process` and a worker on it, which runs deployments' flow runs.

Every process is started in a session of its own (so the command returns and they stay) and
carries `PSRO_STACK=DIR` in its environment: `down` stops each service's process group, then
anything still marked, and never touches another stack's or another user's processes (`ray stop`
would stop every Ray of this user). DIR/stack.json says what runs (ports, process groups; never a
password); data (the PostgreSQL cluster, the artifacts) stays in DIR across `down` and `up`.

When run as root, PostgreSQL runs as the `postgres` system user (`initdb` refuses root): its data
directory is owned by that user, so DIR must be reachable by it (`/root` is not; root's default
DIR is therefore under /var/lib).

With `--auth` the two servers a team's people talk to ask for credentials, taken from the
environment of `up` (the same variables their clients read, so a run in that shell needs nothing
more): the Prefect server compares every API request with `PREFECT_API_AUTH_STRING` ("user:password",
Prefect's own server auth), and the MLflow server runs MLflow's basic-auth app with
`MLFLOW_TRACKING_USERNAME`/`MLFLOW_TRACKING_PASSWORD` as its admin, its users kept in a third
database. No secret is written anywhere in DIR: MLflow's auth config names only its database.

PostgreSQL trusts connections from 127.0.0.1 only: on every host it is the head's own, reached by
the head's own servers and by nobody else.

Several hosts (`up --host ADDRESS`, which needs `--auth`): the Prefect server, the MLflow server
and the Ray head (its GCS and Ray Client) listen on ADDRESS at their well-known ports
(`HOST_PORTS`), and Ray asks every node and client for the token in `RAY_AUTH_TOKEN`. `join HEAD`
on a worker host starts one Ray node (`--cpus`) and one Prefect worker there, with the same
credentials from its environment; `down` there stops that host's part only. A run from a third
host (a laptop) names the head's addresses, and reaches Ray through Ray Client (`ray://HEAD:10001`):
a driver outside the cluster cannot join the GCS directly, since Ray expects the driver's own
address to be one of its nodes'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from flows.services.prefect_server import LocalPrefectServer, free_port, healthy
from flows.services.preflight import basic_auth
from flows.services.reaper import processes_with

MARKER = "PSRO_STACK"
STATE_FILE = "stack.json"
POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")  # Debian's PostgreSQL 15; else found on PATH
DB_USER = "psro"  # the cluster's superuser, whoever runs it
DATABASES = ("prefect", "mlflow", "mlflow_auth")  # mlflow_auth: the basic-auth app's users
POOL = "psro-process"
START_TIMEOUT = 180.0  # a first `up` creates the cluster and runs both servers' migrations
STOP_TIMEOUT = 30.0
# A Ray node gets less: its GCS can hang in its own shutdown after SIGTERM ("Stopping GCS server"
# and no exit), and `ray stop` itself sends SIGKILL after its grace period; a node keeps nothing
# that its stop must save.
RAY_STOP_GRACE = 5.0
# A run joining the stack's Ray needs the token `ray start` turned on: on one host Ray's own, kept
# in ~/.ray/auth_token; across hosts the one every host's environment holds in RAY_AUTH_TOKEN.
RAY_AUTH = {"RAY_AUTH_MODE": "token"}
RAY_TOKEN = "RAY_AUTH_TOKEN"
RAY_MIN_TOKEN = 32  # the length of a token `ray get-auth-token --generate` makes
LOOPBACK = "127.0.0.1"
# The ports a head beyond loopback listens on: each server's own default, so that a firewall rule
# and every other host can name them without asking (docs/operations.md, "Several hosts").
HOST_PORTS = {"prefect": 4200, "mlflow": 5000, "ray": 6379, "ray_client": 10001}
WORKER_PREFIX = "psro-worker@"  # a Prefect worker's name: the prefix, then its host's address


class StackError(Exception):
    """One line naming what failed (and its log), printed as `error: ...`."""


# The variables `--auth` reads, each the one its client reads too.
PREFECT_AUTH = "PREFECT_API_AUTH_STRING"
MLFLOW_USER, MLFLOW_PASSWORD = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
MLFLOW_MIN_PASSWORD = 12  # the basic-auth app refuses a shorter admin password, and would exit
# The basic-auth app checks the password's scrypt hash on every request unless a check is cached:
# tens of milliseconds of the server's CPU per request, its largest cost under a team's runs. A
# cached check lasts this long; with the stack's one server worker, a password changed through
# MLflow's API takes effect at once, one changed in its database directly within this time.
MLFLOW_AUTH_CACHE_S = 60


@dataclasses.dataclass(frozen=True)
class Credentials:
    """The servers' credentials, read from the environment and never stored."""

    prefect_auth_string: str
    mlflow_username: str
    mlflow_password: str

    @classmethod
    def from_environment(cls, ray_token: bool = False) -> Credentials:
        """The servers' credentials; with `ray_token` (several hosts) Ray's shared token too,
        which stays in the environment: Ray reads it from there in every process it starts."""
        names = (PREFECT_AUTH, MLFLOW_USER, MLFLOW_PASSWORD, *((RAY_TOKEN,) if ray_token else ()))
        missing = [name for name in names if not os.environ.get(name)]
        if missing:
            raise StackError(f"auth: {', '.join(missing)} unset; --auth takes the servers' credentials from them")
        if ":" not in os.environ[PREFECT_AUTH]:
            raise StackError(f"auth: {PREFECT_AUTH} must be USER:PASSWORD (it is sent as HTTP basic auth)")
        if len(os.environ[MLFLOW_PASSWORD]) < MLFLOW_MIN_PASSWORD:
            raise StackError(f"auth: {MLFLOW_PASSWORD} needs {MLFLOW_MIN_PASSWORD} characters or more (MLflow's rule)")
        if ray_token and len(os.environ[RAY_TOKEN]) < RAY_MIN_TOKEN:
            raise StackError(
                f"auth: {RAY_TOKEN} needs {RAY_MIN_TOKEN} characters or more "
                "(`ray get-auth-token --generate` makes one)"
            )
        return cls(os.environ[PREFECT_AUTH], os.environ[MLFLOW_USER], os.environ[MLFLOW_PASSWORD])


@dataclasses.dataclass(frozen=True)
class Ports:
    postgres: int
    prefect: int
    mlflow: int
    ray: int
    ray_client: int = 0  # Ray Client's server on the head (0 in a state file written before it was kept)

    @classmethod
    def pick(cls, previous: Ports | None, host: str = LOOPBACK) -> Ports:
        """On loopback, the previous `up`'s ports where they are still free (addresses a team
        wrote down stay valid), else free ones; beyond it the well-known `HOST_PORTS`, and
        PostgreSQL's as on loopback (it listens there alone)."""

        def port(old: int | None) -> int:
            return old if old and port_free(old) else free_port()

        if host != LOOPBACK:
            return cls(postgres=port(previous and previous.postgres), **HOST_PORTS)
        return cls(*(port(getattr(previous, field.name, None)) for field in dataclasses.fields(cls)))


@dataclasses.dataclass(frozen=True)
class Stack:
    """What DIR/stack.json holds: the ports, and each running service's process group (the
    session its first process started; none for PostgreSQL, which `pg_ctl` stops)."""

    directory: str
    ports: Ports
    workers: int
    ray_temp_dir: str
    groups: dict[str, int]  # service name -> process group id; empty once down
    auth: bool = False  # whether the servers ask for credentials (`up --auth`)
    host: str = LOOPBACK  # this host's address, which its servers and its Ray node use
    head: str | None = None  # on a worker host (`join`): the head's address, where the servers are
    cpus: int = 1  # on a worker host: the CPUs its Ray node offers

    @property
    def marker(self) -> str:
        return f"{MARKER}={self.directory}"

    @property
    def servers(self) -> str:
        """The address of the stack's servers: the head's."""
        return self.head or self.host

    @property
    def prefect_api_url(self) -> str:
        return f"http://{self.servers}:{self.ports.prefect}/api"

    @property
    def tracking_uri(self) -> str:
        return f"http://{self.servers}:{self.ports.mlflow}"

    @property
    def ray_address(self) -> str:
        return f"{self.servers}:{self.ports.ray}"

    @property
    def ray_client_address(self) -> str:
        return f"ray://{self.servers}:{self.ports.ray_client}"

    def database_url(self, database: str, driver: str = "postgresql") -> str:
        return f"{driver}://{DB_USER}@{LOOPBACK}:{self.ports.postgres}/{database}"

    @property
    def run_env(self) -> dict[str, str]:
        """What a run's environment needs to use this stack (beyond loopback, RAY_AUTH_TOKEN too)."""
        return {"PREFECT_API_URL": self.prefect_api_url, **RAY_AUTH}

    @property
    def run_flags(self) -> list[str]:
        """A run on one host joins the Ray head; from another host it goes through Ray Client."""
        ray = self.ray_address if self.servers == LOOPBACK else self.ray_client_address
        return ["--tracking-uri", self.tracking_uri, "--ray-address", ray]

    def path(self, *parts: str) -> Path:
        return Path(self.directory, *parts)

    def save(self) -> None:
        temporary = self.path(STATE_FILE + ".tmp")
        temporary.write_text(json.dumps(dataclasses.asdict(self), indent=2))
        temporary.replace(self.path(STATE_FILE))

    @classmethod
    def load(cls, directory: Path) -> Stack | None:
        try:
            state = json.loads((directory / STATE_FILE).read_text())
            return cls(**{**state, "ports": Ports(**state["ports"])})
        except (OSError, ValueError, TypeError, KeyError):
            return None


# --- checks made before anything starts ---------------------------------------------------------


def default_directory() -> Path:
    """~/.psro/stack; as root /var/lib/psro/stack, which the `postgres` user can reach."""
    return Path("/var/lib/psro/stack") if os.geteuid() == 0 else Path.home() / ".psro" / "stack"


def postgres_tool(name: str) -> str:
    """Debian keeps PostgreSQL's programs in /usr/lib/postgresql/VERSION/bin, off PATH: 15's, else
    the newest there, else what PATH has."""
    versions = sorted(
        POSTGRES_BIN.parent.glob(f"*/bin/{name}"),
        key=lambda p: int("0" + "".join(filter(str.isdigit, p.parts[-3]))),
        reverse=True,
    )
    path = POSTGRES_BIN / name
    found = str(path) if path.exists() else str(versions[0]) if versions else shutil.which(name)
    if not found:
        raise StackError(f"PostgreSQL's {name} is not installed (Debian: apt-get install postgresql)")
    return found


def _as_postgres() -> list[str]:
    """The prefix that runs a PostgreSQL tool: as root, as the `postgres` user (environment
    kept, so the stack's marker goes with it); otherwise as this user."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


def check_settings(directory: Path, workers: int, auth: bool, host: str = LOOPBACK) -> Credentials | None:
    """Raise StackError for bad input, before anything starts; the credentials with `auth`."""
    if workers < (0 if host != LOOPBACK else 1):
        raise StackError(f"workers={workers}: needs 1 or more (0 with --host, where worker hosts join)")
    check_host(host, auth)
    credentials = Credentials.from_environment(ray_token=host != LOOPBACK) if auth else None
    _check_tools(directory)
    return credentials


def check_host(host: str, auth: bool, ports: dict[str, int] | None = None) -> None:
    """`host` is an IPv4 address of this machine; beyond loopback only with `auth` (its servers
    would take requests from anyone who reaches it), and with each of `ports` free there."""
    if host == LOOPBACK:
        return
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise StackError(f"host={host!r}: expected an IPv4 address of this machine, such as 10.0.0.5") from None
    if address.is_unspecified or address.is_multicast:
        raise StackError(f"host={host!r}: expected one address of this machine (not every address, not multicast)")
    if not auth:
        raise StackError(f"host={host}: serving beyond 127.0.0.1 needs --auth (else anyone who reaches it may use it)")
    if not port_free(0, host):
        raise StackError(f"host={host}: not an address of this machine (nothing can listen there)")
    for name, port in (ports if ports is not None else HOST_PORTS).items():
        if not port_free(port, host):
            raise StackError(f"host={host}: port {port} ({name}) is taken there; free it first")


def check_address(what: str, address: str) -> None:
    """The IPv4 address another host names (the head's, for `join`), checked for its form."""
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        raise StackError(f"{what}={address!r}: expected an IPv4 address, such as 10.0.0.5") from None


def _check_tools(directory: Path, postgres: bool = True) -> None:
    """What a host's services run: PostgreSQL's programs (the head's), MLflow, Ray and Prefect."""
    for tool in ("initdb", "pg_ctl", "pg_isready") if postgres else ():
        postgres_tool(tool)
    for command in ("mlflow", "ray", "prefect"):
        if not _venv_tool(command).exists():
            raise StackError(f"{command} is not installed beside {sys.executable}")
    if postgres and os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            raise StackError("running as root needs the `postgres` system user, which PostgreSQL runs as") from None
        for folder in [*reversed(directory.parents), directory]:
            if folder.exists() and not os.stat(folder).st_mode & 0o001:
                raise StackError(
                    f"dir={directory}: {folder} is closed to the postgres user, which runs PostgreSQL here; "
                    "choose a --dir it can reach (the default as root: /var/lib/psro/stack)"
                )


def _venv_tool(name: str) -> Path:
    return Path(sys.executable).with_name(name)


def port_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server could listen on `host`:`port` now (port 0: whether `host` is this machine's)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is free
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


# --- processes ------------------------------------------------------------------------------


def _processes(marker: str) -> dict[int, int]:
    """Live processes carrying the stack's marker: pid -> process group."""
    found = {}
    for pid in processes_with(marker):
        with contextlib.suppress(ProcessLookupError):
            found[pid] = os.getpgid(pid)
    return found


def _group_alive(marker: str, group: int) -> bool:
    return group in _processes(marker).values()


def _raylet_groups(processes: dict[int, int]) -> set[int]:
    """The process groups among `processes` (pid -> group) that hold a Ray node's raylet: a node
    is up while its raylet is, and its other processes (its log monitor) can outlive it by
    minutes once its head is gone."""
    groups = set()
    for pid, group in processes.items():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                groups.add(group)
    return groups


def _stop_group(marker: str, group: int, grace: float = STOP_TIMEOUT) -> None:
    """SIGTERM to the group, SIGKILL to what is left of it after `grace` seconds."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)
        deadline = time.monotonic() + (grace if signum == signal.SIGTERM else STOP_TIMEOUT)
        while _group_alive(marker, group) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not _group_alive(marker, group):
            return


def _start(stack: Stack, name: str, command: list[str], env: dict[str, str], cwd: Path | None = None):
    """A service's first process, in a session of its own, logging to DIR/logs/NAME.log."""
    log = stack.path("logs", f"{name}.log")
    with open(log, "ab") as out:
        return subprocess.Popen(
            command,
            env={**os.environ, **env, MARKER: stack.directory},
            cwd=cwd or stack.directory,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait(what: str, log: Path, ready: Callable[[], bool], process=None, timeout: float = START_TIMEOUT) -> None:
    """Poll `ready` until it holds; fail naming `what` and its log when its process exits first
    or the deadline passes."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process is not None and process.poll() not in (None, 0):
            raise StackError(f"{what} exited with code {process.returncode}; see {log}")
        if time.monotonic() > deadline:
            raise StackError(f"{what} did not answer within {timeout:.0f} s; see {log}")
        time.sleep(0.2)


def _run(stack: Stack, what: str, command: list[str], log: Path) -> None:
    """A command that must succeed (initdb, pg_ctl, ray start), its output appended to `log`."""
    with open(log, "ab") as out:
        done = subprocess.run(
            command,
            env={**os.environ, MARKER: stack.directory},
            cwd=stack.directory,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            timeout=START_TIMEOUT,
        )
    if done.returncode != 0:
        raise StackError(f"{what} failed with code {done.returncode}; see {log}")


# --- PostgreSQL -------------------------------------------------------------------------------


def _postgres_ready(stack: Stack) -> bool:
    command = [postgres_tool("pg_isready"), "-q", "-h", LOOPBACK, "-p", str(stack.ports.postgres)]
    return subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=10).returncode == 0


def _start_postgres(stack: Stack) -> None:
    """Create the cluster on the first `up`, start it, and create its databases where missing."""
    data, log = stack.path("postgres"), stack.path("logs", "postgres.log")
    log.touch()
    if os.geteuid() == 0:  # the server writes its own log and owns its data, as `postgres`
        shutil.chown(log, "postgres", "postgres")
    if not (data / "PG_VERSION").exists():
        data.mkdir(mode=0o700, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(data, "postgres", "postgres")
        initdb = [postgres_tool("initdb"), "-D", str(data), "-U", DB_USER, "--auth=trust", "-E", "UTF8"]
        _run(stack, "initdb", [*_as_postgres(), *initdb], log)
    options = f"-p {stack.ports.postgres} -c listen_addresses={LOOPBACK} -c unix_socket_directories=''"
    pg_ctl = [postgres_tool("pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "120", "start"]
    _run(stack, "PostgreSQL (pg_ctl start)", [*_as_postgres(), *pg_ctl], log)
    _wait("PostgreSQL", log, lambda: _postgres_ready(stack))
    import psycopg2

    with contextlib.closing(psycopg2.connect(stack.database_url("postgres"))) as connection:
        connection.autocommit = True  # CREATE DATABASE runs outside a transaction
        with connection.cursor() as cursor:
            for database in DATABASES:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
                if cursor.fetchone() is None:
                    cursor.execute(f'CREATE DATABASE "{database}"')


def _stop_postgres(directory: Path) -> bool:
    """`pg_ctl stop -m fast`; whether it was running."""
    data = directory / "postgres"
    if not (data / "postmaster.pid").exists():
        return False
    pg_ctl = [postgres_tool("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", str(int(STOP_TIMEOUT)), "stop"]
    subprocess.run([*_as_postgres(), *pg_ctl], stdin=subprocess.DEVNULL, capture_output=True, timeout=STOP_TIMEOUT + 10)
    return True


# --- Ray ------------------------------------------------------------------------------------


def _ray_start(stack: Stack, name: str, cpus: int, *flags: str):
    """`ray start` for one node on this host's address (on loopback it stays there:
    `flows.services.patches.ray_start_keeps_loopback`); it returns once the node runs, leaving the
    node's processes in its process group. Across hosts Ray reads its token from RAY_AUTH_TOKEN,
    which the node's processes inherit from this one's environment."""
    common = ["--node-ip-address", stack.host, "--num-cpus", str(cpus), "--temp-dir", stack.ray_temp_dir]
    common += ["--object-store-memory", str(256 * 2**20), "--disable-usage-stats"]
    if "--head" in flags:  # Ray's fixed ports (Ray Client's 10001, the dashboard's 8265) are a second stack's too
        client_port = stack.ports.ray_client or free_port()
        common += ["--ray-client-server-port", str(client_port), "--dashboard-port", str(free_port(stack.host))]
    env = {**RAY_AUTH, "PREFECT_API_URL": stack.prefect_api_url}
    return _start(stack, name, [sys.executable, "-m", "flows.services.stack", "ray", "start", *flags, *common], env)


def _ray_temp_dir(directory: Path) -> str:
    """Short (Ray's socket paths live under it, and a socket path has at most 107 bytes) and
    this stack's own."""
    digest = hashlib.sha1(str(directory).encode()).hexdigest()[:8]
    return str(Path(tempfile.gettempdir()) / f"psro-stack-{digest}")


# --- the Prefect worker ---------------------------------------------------------------------


def worker_name(host: str) -> str:
    """Each host's Prefect worker is named for the host, which tells whose it is in the UI and in
    `status`, and lets a worker that joins again take its old row."""
    return f"{WORKER_PREFIX}{host}"


def _workers(stack: Stack, credentials: Credentials | None) -> list[dict] | None:
    """The pool's workers as the server lists them (None where it does not answer)."""
    auth = basic_auth(credentials.prefect_auth_string) if credentials else {}
    request = urllib.request.Request(
        f"{stack.prefect_api_url}/work_pools/{POOL}/workers/filter",
        data=b"{}",
        headers={"Content-Type": "application/json", **auth},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def _heartbeat(stack: Stack, credentials: Credentials | None) -> str | None:
    """This host's worker's last heartbeat as the server recorded it (by the server's clock)."""
    mine = [w for w in _workers(stack, credentials) or [] if w.get("name") == worker_name(stack.host)]
    return mine[0].get("last_heartbeat_time") if mine else None


def _worker_online(stack: Stack, credentials: Credentials | None, before: str | None) -> bool:
    """Whether this host's worker has reported since it started: a heartbeat newer than `before`,
    the one recorded when it started (a worker killed a moment ago still shows ONLINE)."""
    now = _heartbeat(stack, credentials)
    return now is not None and now != before


# --- MLflow -------------------------------------------------------------------------------------


def _mlflow_command(stack: Stack, credentials: Credentials | None) -> tuple[list[str], dict[str, str]]:
    """`mlflow server` on the `mlflow` database, serving the artifacts; with credentials, MLflow's
    basic-auth app, configured by a file that names only its database (the admin's name and
    password reach it through MLflow's MLFLOW_AUTH_ADMIN_* variables). The app's CSRF key is the
    environment's MLFLOW_FLASK_SERVER_SECRET_KEY, else a new one per start: one server, so
    nothing else must share it, and a restart only asks the UI's open forms to load again.

    The server runs none of MLflow's job executors (`MLFLOW_SERVER_ENABLE_JOB_EXECUTION`): they
    serve its GenAI features (judges, evaluations, trace roll-ups), which model-training runs
    never ask for, and their consumers poll all the while the server is up."""
    command = [str(_venv_tool("mlflow")), "server", "--host", stack.host, "--port", str(stack.ports.mlflow)]
    if stack.host != LOOPBACK:  # MLflow's default answers only Host headers of loopback and private networks
        command += ["--allowed-hosts", f"{stack.host},{stack.host}:{stack.ports.mlflow}"]
    command += ["--backend-store-uri", stack.database_url("mlflow", "postgresql+psycopg2"), "--workers", "1"]
    command += ["--artifacts-destination", str(stack.path("artifacts"))]
    no_jobs = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    if credentials is None:
        return command, no_jobs
    config = stack.path("mlflow-auth.ini")
    config.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = {stack.database_url('mlflow_auth', 'postgresql+psycopg2')}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        f"auth_cache_ttl_seconds = {MLFLOW_AUTH_CACHE_S}\n"
    )
    env = {
        **no_jobs,
        "MLFLOW_AUTH_CONFIG_PATH": str(config),
        "MLFLOW_AUTH_ADMIN_USERNAME": credentials.mlflow_username,
        "MLFLOW_AUTH_ADMIN_PASSWORD": credentials.mlflow_password,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": os.environ.get("MLFLOW_FLASK_SERVER_SECRET_KEY") or secrets.token_hex(32),
    }
    return [*command, "--app-name", "basic-auth"], env


# --- up, status, down -----------------------------------------------------------------------


@dataclasses.dataclass
class Starting:
    """A service whose start was asked for: its first process (none for PostgreSQL, which
    `pg_ctl` starts and waits for) and how to tell it is ready."""

    what: str
    log: Path
    ready: Callable[[], bool]
    process: subprocess.Popen | None = None
    waited: bool = False

    def wait(self) -> None:
        if not self.waited:
            _wait(self.what, self.log, self.ready, self.process)
            self.waited = True


# Every service of a stack, in the order they start, each after what it needs; "ray-worker-N" is
# each Ray worker node, numbered from 1. A worker host (`join`) runs `JOINED`.
SERVICES = ("ray-head", "postgres", "prefect-server", "mlflow", "ray-worker-N", "prefect-worker")
JOINED = ("ray-worker-1", "prefect-worker")


def _services(stack: Stack) -> list[str]:
    """Every service this host runs for the stack, in the order they start."""
    if stack.head:
        return list(JOINED)
    ray_workers = [f"ray-worker-{k}" for k in range(1, stack.workers + 1)]
    return [name for kind in SERVICES for name in (ray_workers if kind == "ray-worker-N" else [kind])]


def _needs(name: str) -> tuple[str, ...]:
    """What must answer before `name` starts (PostgreSQL answers once it has started)."""
    if name.startswith("ray-worker-"):
        return ("ray-head",)
    return {"prefect-worker": ("prefect-server",)}.get(name, ())


def _start_service(stack: Stack, name: str, credentials: Credentials | None) -> Starting:
    log = stack.path("logs", f"{name}.log")
    if name == "postgres":
        _start_postgres(stack)
        return Starting("PostgreSQL", log, lambda: True, waited=True)
    if name == "ray-head":
        cpus = 1 if stack.workers else 0  # `--workers 0`: the head offers no CPU; worker hosts do
        head = _ray_start(stack, name, cpus, "--head", "--port", str(stack.ports.ray), "--include-dashboard", "false")
        return Starting("the Ray head (ray start)", log, lambda: head.poll() == 0, head)
    if name.startswith("ray-worker-"):
        node = _ray_start(stack, name, stack.cpus if stack.head else 1, "--address", stack.ray_address)
        return Starting(f"Ray node {name} (ray start)", log, lambda: node.poll() == 0, node)
    if name == "prefect-server":
        server = LocalPrefectServer(
            stack.path("prefect"),
            port=stack.ports.prefect,
            database_url=stack.database_url("prefect", "postgresql+asyncpg"),
            detached=True,
            extra_env={MARKER: stack.directory}
            | ({"PREFECT_SERVER_API_AUTH_STRING": credentials.prefect_auth_string} if credentials else {}),
            host=stack.host,
        )
        log = stack.path("prefect", "server.log")
        return Starting("the Prefect server", log, lambda: healthy(stack.prefect_api_url), server.process)
    if name == "mlflow":
        mlflow = _start(stack, name, *_mlflow_command(stack, credentials))
        return Starting("the MLflow server", log, lambda: healthy(stack.tracking_uri), mlflow)
    before = _heartbeat(stack, credentials)
    command = [str(_venv_tool("prefect")), "worker", "start", "--pool", POOL, "--type", "process"]
    worker = _start(
        stack,
        name,
        [*command, "--name", worker_name(stack.host)],
        {"PREFECT_API_URL": stack.prefect_api_url, "PREFECT_HOME": str(stack.path("prefect")), **RAY_AUTH},
    )
    return Starting("the Prefect worker", log, lambda: _worker_online(stack, credentials, before), worker)


def _bring_up(stack: Stack, names: list[str], credentials: Credentials | None) -> Stack:
    """Start `names` in order (each once what it needs answers), recording each process group in
    DIR/stack.json as it starts, and return once all answer."""
    starting: dict[str, Starting] = {}
    for name in names:
        for needed in _needs(name):
            if needed in starting:
                starting[needed].wait()
        starting[name] = _start_service(stack, name, credentials)
        if starting[name].process is not None:  # its own session: the process group has its id
            stack = dataclasses.replace(stack, groups={**stack.groups, name: starting[name].process.pid})
            stack.save()
    for service in starting.values():
        service.wait()
    return stack


def up(directory: Path, workers: int, auth: bool = False, host: str = LOOPBACK) -> Stack:
    """Start every service and return once each answers; on a failure stop what was started and
    raise StackError naming what failed and its log. With `auth`, the Prefect and MLflow servers
    ask for the credentials in this process's environment (`Credentials`). `host`: the address
    the servers and the Ray head listen on, for other hosts to reach."""
    directory = directory.expanduser().resolve()
    credentials = check_settings(directory, workers, auth, host)
    previous = _not_running(directory)
    (directory / "artifacts").mkdir(parents=True, exist_ok=True)
    ports = Ports.pick(previous and previous.ports, host)
    stack = Stack(str(directory), ports, workers, _ray_temp_dir(directory), groups={}, auth=auth, host=host)
    return _start_all(stack, credentials)


def join(directory: Path, head: str, host: str | None = None, cpus: int | None = None) -> Stack:
    """On a worker host: start a Ray node joined to the head at `head` and a Prefect worker on the
    head's pool, and return once both answer. `host`: this host's address as the head reaches it
    (default: the one this machine sends from towards the head). The credentials are the head's,
    from this host's environment (RAY_AUTH_TOKEN among them)."""
    directory = directory.expanduser().resolve()
    check_address("head", head)
    if cpus is not None and cpus < 1:
        raise StackError(f"cpus={cpus}: needs 1 or more")
    credentials = Credentials.from_environment(ray_token=True)
    host = host or _address_towards(head)
    check_host(host, auth=True, ports={})
    _check_tools(directory, postgres=False)
    stack = Stack(
        str(directory),
        Ports(postgres=0, **HOST_PORTS),  # the head's: a worker host runs no PostgreSQL
        workers=0,
        ray_temp_dir=_ray_temp_dir(directory),
        groups={},
        auth=True,
        host=host,
        head=head,
        cpus=cpus or os.cpu_count() or 1,
    )
    if not _answers(stack):
        answering = f"Prefect at {stack.prefect_api_url}, Ray at {stack.ray_address}"
        raise StackError(f"head={head}: no stack answers there (asked {answering})")
    _not_running(directory)
    return _start_all(stack, credentials)


def _not_running(directory: Path) -> Stack | None:
    """The stack saved in `directory`, after checking that none of it runs."""
    previous = Stack.load(directory)
    if previous and any(up for _, up in status(previous)):
        raise StackError(f"a stack already runs from {directory}; `psro stack status` shows it, `down` stops it")
    return previous


def _start_all(stack: Stack, credentials: Credentials | None) -> Stack:
    stack.path("logs").mkdir(parents=True, exist_ok=True)
    stack.save()  # from here on, `down` finds whatever was started
    try:
        return _bring_up(stack, _services(stack), credentials)
    except BaseException:
        down(stack.path(), say=lambda line: None)
        raise


def _address_towards(head: str) -> str:
    """The address this machine sends from towards `head` (no packet leaves: a UDP socket only
    picks its route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((head, HOST_PORTS["ray"]))
        return sock.getsockname()[0]


def _answers(stack: Stack) -> bool:
    """Whether the head's Prefect server and Ray head answer."""
    return _ray_answers(stack.ray_address) and healthy(stack.prefect_api_url)


def _running_stack(directory: Path, names: list[str]) -> Stack:
    stack = Stack.load(directory.expanduser().resolve())
    if stack is None:
        raise StackError(f"no stack in {directory}; `psro stack up` starts one")
    known = _services(stack)
    for name in names:
        if name not in known:
            raise StackError(f"service={name!r}: expected one of {', '.join(known)}")
    return stack


def start(directory: Path, names: list[str]) -> list[str]:
    """Start the named services of a stack that is up but for them (after a crash, or a `stop`
    for maintenance), on the ports they had; returns those started (the others already ran)."""
    stack = _running_stack(directory, names)
    credentials = Credentials.from_environment(ray_token=stack.servers != LOOPBACK) if stack.auth else None
    running = dict(status(stack))
    down_now = [name for name in _services(stack) if name in names and not running[name]]
    # what outlived a service that is down (a Ray node's log monitor) goes first; PostgreSQL keeps its own
    stop(directory, [name for name in down_now if name != "postgres"])
    _bring_up(stack, down_now, credentials)
    return down_now


def stop(directory: Path, names: list[str]) -> list[str]:
    """Stop the named services, leaving the others up; returns those stopped."""
    stack = _running_stack(directory, names)
    stopped = []
    for name in names:
        if name == "postgres":
            if _stop_postgres(stack.path()):
                stopped.append(name)
            continue
        group = stack.groups.get(name)
        if group is not None and _group_alive(stack.marker, group):
            _stop_group(stack.marker, group, RAY_STOP_GRACE if name.startswith("ray-") else STOP_TIMEOUT)
            stopped.append(name)
    return stopped


def status(stack: Stack) -> list[tuple[str, bool]]:
    """Each service, and whether it is up: its process group lives, a Ray node's raylet among
    it, and it answers where it has an address to ask."""
    processes = _processes(stack.marker)
    alive, raylets = set(processes.values()), _raylet_groups(processes)
    answers = {
        "postgres": lambda: stack.path("postgres", "postmaster.pid").exists() and _postgres_ready(stack),
        "prefect-server": lambda: healthy(stack.prefect_api_url),
        "mlflow": lambda: healthy(stack.tracking_uri),
        "ray-head": lambda: _ray_answers(stack.ray_address),
    }

    def up(name: str) -> bool:
        if name == "postgres":
            return answers[name]()
        group = stack.groups.get(name)
        if group not in alive or (name.startswith("ray-") and group not in raylets):
            return False
        return answers.get(name, lambda: True)()

    return [(name, up(name)) for name in _services(stack)]


@dataclasses.dataclass(frozen=True)
class Host:
    """One host of a stack as the head sees it: its Ray nodes' CPUs and its Prefect workers."""

    address: str
    ray_cpus: list[float]  # one entry per live Ray node there
    prefect_workers: list[str]  # ONLINE workers named for it


def hosts(stack: Stack, credentials: Credentials | None) -> list[Host]:
    """Every host with a live Ray node or an online Prefect worker of the stack, the head first;
    the Ray nodes as the GCS lists them (the caller's environment carries Ray's token mode)."""
    from ray._raylet import GcsClient
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    nodes = GcsClient(address=stack.ray_address).get_all_node_info(timeout=10).values()
    cpus: dict[str, list[float]] = {}
    for node in nodes:
        if node.state == GcsNodeInfo.GcsNodeState.ALIVE:
            cpus.setdefault(node.node_manager_address, []).append(node.resources_total.get("CPU", 0.0))
    workers: dict[str, list[str]] = {}
    for worker in _workers(stack, credentials) or []:
        name = worker.get("name", "")
        if worker.get("status") == "ONLINE" and name.startswith(WORKER_PREFIX):
            workers.setdefault(name.removeprefix(WORKER_PREFIX), []).append(name)
    addresses = sorted(set(cpus) | set(workers), key=lambda address: (address != stack.host, address))
    return [Host(address, cpus.get(address, []), workers.get(address, [])) for address in addresses]


def _ray_answers(address: str) -> bool:
    """Whether Ray's GCS answers at `address` (as gRPC, not only as an open port)."""
    from flows.services.preflight import check_ray_address

    try:
        check_ray_address(address)
    except Exception:
        return False
    return True


# The order `down` stops them in: whatever uses a service before the service.
STOP_ORDER = ("prefect-worker", "mlflow", "prefect-server", "ray-worker", "ray-head")


def down(directory: Path, say: Callable[[str], None]) -> list[str]:
    """Stop every service of the stack in `directory` (what is not running is skipped, so a
    second call does nothing); returns the names of those stopped."""
    directory = directory.expanduser().resolve()
    stack = Stack.load(directory)
    if stack is None:
        return []
    stopped = []
    ordered = sorted(stack.groups, key=lambda name: next(i for i, p in enumerate(STOP_ORDER) if name.startswith(p)))
    for name in ordered:
        if _group_alive(stack.marker, stack.groups[name]):
            grace = RAY_STOP_GRACE if name.startswith("ray-") else STOP_TIMEOUT
            _stop_group(stack.marker, stack.groups[name], grace)
            stopped.append(name)
            say(f"stopped {name}")
    if _stop_postgres(directory):
        stopped.append("postgres")
        say("stopped postgres")
    # Anything still marked left its service's process group after its service stopped: kill it.
    deadline = time.monotonic() + STOP_TIMEOUT
    while (left := _processes(stack.marker)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    dataclasses.replace(stack, groups={}).save()
    return stopped


CLIENT_PROXY_ENTRY = ("-m", "flows.services.stack", "ray-client-proxy")


def _ray_cli(argv: list[str]) -> None:
    """Ray's own `ray` command, with nodes kept on loopback and a head's Ray Client proxy run
    from `_ray_client_proxy`."""
    from flows.services.patches import ray_start_keeps_loopback, ray_start_runs_this_client_proxy

    ray_start_keeps_loopback()
    ray_start_runs_this_client_proxy(CLIENT_PROXY_ENTRY)
    from ray.scripts.scripts import main

    sys.argv = ["ray", *argv]
    main()


def _ray_client_proxy(argv: list[str]) -> None:
    """Ray's own Ray Client server, which starts each client's process without a fork."""
    from flows.services.patches import ray_client_proxy_spawns_without_fork

    ray_client_proxy_spawns_without_fork()
    from ray.util.client.server.server import main

    sys.argv = ["ray.util.client.server", *argv]
    main()


if __name__ == "__main__":  # python -m flows.services.stack ray start ...: a stack's node
    commands = {"ray": _ray_cli, "ray-client-proxy": _ray_client_proxy}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        raise SystemExit("usage: python -m flows.services.stack ray|ray-client-proxy ARGS...")
    commands[sys.argv[1]](sys.argv[2:])
