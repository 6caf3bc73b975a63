"""`psro stack up|status|down`: the team's services on one machine, started by one command.

A plain run starts its own Prefect server on SQLite, its own Ray and writes `./mlflow.db`. A team
shares one set instead, and this is that set, on 127.0.0.1 of one machine:

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

PostgreSQL trusts connections from 127.0.0.1 (loopback only, one machine). Several machines use
a managed PostgreSQL with credentials from the environment instead (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import signal
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
# A run joining the stack's Ray needs the token `ray start` turned on (kept in ~/.ray/auth_token).
RAY_AUTH = {"RAY_AUTH_MODE": "token"}


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
    def from_environment(cls) -> Credentials:
        missing = [name for name in (PREFECT_AUTH, MLFLOW_USER, MLFLOW_PASSWORD) if not os.environ.get(name)]
        if missing:
            raise StackError(f"auth: {', '.join(missing)} unset; --auth takes the servers' credentials from them")
        if ":" not in os.environ[PREFECT_AUTH]:
            raise StackError(f"auth: {PREFECT_AUTH} must be USER:PASSWORD (it is sent as HTTP basic auth)")
        if len(os.environ[MLFLOW_PASSWORD]) < MLFLOW_MIN_PASSWORD:
            raise StackError(f"auth: {MLFLOW_PASSWORD} needs {MLFLOW_MIN_PASSWORD} characters or more (MLflow's rule)")
        return cls(os.environ[PREFECT_AUTH], os.environ[MLFLOW_USER], os.environ[MLFLOW_PASSWORD])


@dataclasses.dataclass(frozen=True)
class Ports:
    postgres: int
    prefect: int
    mlflow: int
    ray: int

    @classmethod
    def pick(cls, previous: Ports | None) -> Ports:
        """The previous `up`'s ports where they are still free (addresses a team wrote down stay
        valid), else free ones."""

        def port(old: int | None) -> int:
            return old if old and _free(old) else free_port()

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

    @property
    def marker(self) -> str:
        return f"{MARKER}={self.directory}"

    @property
    def prefect_api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.prefect}/api"

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.ports.mlflow}"

    @property
    def ray_address(self) -> str:
        return f"127.0.0.1:{self.ports.ray}"

    def database_url(self, database: str, driver: str = "postgresql") -> str:
        return f"{driver}://{DB_USER}@127.0.0.1:{self.ports.postgres}/{database}"

    @property
    def run_env(self) -> dict[str, str]:
        """What a run's environment needs to use this stack."""
        return {"PREFECT_API_URL": self.prefect_api_url, **RAY_AUTH}

    @property
    def run_flags(self) -> list[str]:
        return ["--tracking-uri", self.tracking_uri, "--ray-address", self.ray_address]

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


def check_settings(directory: Path, workers: int, auth: bool) -> Credentials | None:
    """Raise StackError for bad input, before anything starts; the credentials with `auth`."""
    if workers < 1:
        raise StackError(f"workers={workers}: needs 1 or more")
    credentials = Credentials.from_environment() if auth else None
    for tool in ("initdb", "pg_ctl", "pg_isready"):
        postgres_tool(tool)
    for command in ("mlflow", "ray", "prefect"):
        if not _venv_tool(command).exists():
            raise StackError(f"{command} is not installed beside {sys.executable}")
    if os.geteuid() == 0:
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
    return credentials


def _venv_tool(name: str) -> Path:
    return Path(sys.executable).with_name(name)


def _free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is free
        try:
            sock.bind(("127.0.0.1", port))
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
    command = [postgres_tool("pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(stack.ports.postgres)]
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
    options = f"-p {stack.ports.postgres} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
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


def _ray_start(stack: Stack, name: str, *flags: str):
    """`ray start` for one node, on loopback (`flows.services.patches.ray_start_keeps_loopback`); it returns
    once the node runs, leaving the node's processes in its process group."""
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--temp-dir", stack.ray_temp_dir]
    common += ["--object-store-memory", str(256 * 2**20), "--disable-usage-stats"]
    if "--head" in flags:  # Ray's fixed ports (Ray Client's 10001, the dashboard's 8265) are a second stack's too
        common += ["--ray-client-server-port", str(free_port()), "--dashboard-port", str(free_port())]
    env = {**RAY_AUTH, "PREFECT_API_URL": stack.prefect_api_url}
    return _start(stack, name, [sys.executable, "-m", "flows.services.stack", "ray", "start", *flags, *common], env)


def _ray_temp_dir(directory: Path) -> str:
    """Short (Ray's socket paths live under it, and a socket path has at most 107 bytes) and
    this stack's own."""
    digest = hashlib.sha1(str(directory).encode()).hexdigest()[:8]
    return str(Path(tempfile.gettempdir()) / f"psro-stack-{digest}")


# --- the Prefect worker ---------------------------------------------------------------------


def _worker_online(stack: Stack, credentials: Credentials | None) -> bool:
    """Whether a worker of the stack's pool has reported to the server."""
    auth = basic_auth(credentials.prefect_auth_string) if credentials else {}
    request = urllib.request.Request(
        f"{stack.prefect_api_url}/work_pools/{POOL}/workers/filter",
        data=b"{}",
        headers={"Content-Type": "application/json", **auth},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return any(worker.get("status") == "ONLINE" for worker in json.loads(response.read()))
    except (OSError, ValueError):
        return False


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
    command = [str(_venv_tool("mlflow")), "server", "--host", "127.0.0.1", "--port", str(stack.ports.mlflow)]
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
# each Ray worker node, numbered from 1.
SERVICES = ("ray-head", "postgres", "prefect-server", "mlflow", "ray-worker-N", "prefect-worker")


def _services(workers: int) -> list[str]:
    """Every service of a stack of `workers` Ray worker nodes, in the order they start."""
    return [name for kind in SERVICES for name in (_ray_workers(workers) if kind == "ray-worker-N" else [kind])]


def _ray_workers(workers: int) -> list[str]:
    return [f"ray-worker-{k}" for k in range(1, workers + 1)]


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
        head = _ray_start(stack, name, "--head", "--port", str(stack.ports.ray), "--include-dashboard", "false")
        return Starting("the Ray head (ray start)", log, lambda: head.poll() == 0, head)
    if name.startswith("ray-worker-"):
        node = _ray_start(stack, name, "--address", stack.ray_address)
        return Starting(f"Ray node {name} (ray start)", log, lambda: node.poll() == 0, node)
    if name == "prefect-server":
        server = LocalPrefectServer(
            stack.path("prefect"),
            port=stack.ports.prefect,
            database_url=stack.database_url("prefect", "postgresql+asyncpg"),
            detached=True,
            extra_env={MARKER: stack.directory}
            | ({"PREFECT_SERVER_API_AUTH_STRING": credentials.prefect_auth_string} if credentials else {}),
        )
        log = stack.path("prefect", "server.log")
        return Starting("the Prefect server", log, lambda: healthy(stack.prefect_api_url), server.process)
    if name == "mlflow":
        mlflow = _start(stack, name, *_mlflow_command(stack, credentials))
        return Starting("the MLflow server", log, lambda: healthy(stack.tracking_uri), mlflow)
    worker = _start(
        stack,
        name,
        [str(_venv_tool("prefect")), "worker", "start", "--pool", POOL, "--type", "process"],
        {"PREFECT_API_URL": stack.prefect_api_url, "PREFECT_HOME": str(stack.path("prefect")), **RAY_AUTH},
    )
    return Starting("the Prefect worker", log, lambda: _worker_online(stack, credentials), worker)


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


def up(directory: Path, workers: int, auth: bool = False) -> Stack:
    """Start every service and return once each answers; on a failure stop what was started and
    raise StackError naming what failed and its log. With `auth`, the Prefect and MLflow servers
    ask for the credentials in this process's environment (`Credentials`)."""
    directory = directory.expanduser().resolve()
    credentials = check_settings(directory, workers, auth)
    previous = Stack.load(directory)
    if previous and any(up for _, up in status(previous)):
        raise StackError(f"a stack already runs from {directory}; `psro stack status` shows it, `down` stops it")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "logs").mkdir(exist_ok=True)
    (directory / "artifacts").mkdir(exist_ok=True)
    ports = Ports.pick(previous and previous.ports)
    stack = Stack(str(directory), ports, workers, _ray_temp_dir(directory), groups={}, auth=auth)
    stack.save()  # from here on, `down` finds whatever was started
    try:
        return _bring_up(stack, _services(workers), credentials)
    except BaseException:
        down(directory, say=lambda line: None)
        raise


def _running_stack(directory: Path, names: list[str]) -> Stack:
    stack = Stack.load(directory.expanduser().resolve())
    if stack is None:
        raise StackError(f"no stack in {directory}; `psro stack up` starts one")
    known = _services(stack.workers)
    for name in names:
        if name not in known:
            raise StackError(f"service={name!r}: expected one of {', '.join(known)}")
    return stack


def start(directory: Path, names: list[str]) -> list[str]:
    """Start the named services of a stack that is up but for them (after a crash, or a `stop`
    for maintenance), on the ports they had; returns those started (the others already ran)."""
    stack = _running_stack(directory, names)
    credentials = Credentials.from_environment() if stack.auth else None
    running = dict(status(stack))
    down_now = [name for name in _services(stack.workers) if name in names and not running[name]]
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
    """Each service, and whether it is up (answers where it has an address to ask)."""
    alive = set(_processes(stack.marker).values())
    groups = stack.groups

    def ray_head() -> bool:
        from flows.services.preflight import check_ray_address  # answers as Ray (gRPC), not only TCP

        try:
            check_ray_address(stack.ray_address)
        except Exception:
            return False
        return groups.get("ray-head") in alive

    rows = [
        ("postgres", (stack.path("postgres", "postmaster.pid")).exists() and _postgres_ready(stack)),
        ("prefect-server", groups.get("prefect-server") in alive and healthy(stack.prefect_api_url)),
        ("mlflow", groups.get("mlflow") in alive and healthy(stack.tracking_uri)),
        ("ray-head", ray_head()),
    ]
    rows += [(f"ray-worker-{k}", groups.get(f"ray-worker-{k}") in alive) for k in range(1, stack.workers + 1)]
    rows.append(("prefect-worker", groups.get("prefect-worker") in alive))
    return rows


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


def _ray_cli(argv: list[str]) -> None:
    """Ray's own `ray` command, with nodes kept on loopback."""
    from flows.services.patches import ray_start_keeps_loopback

    ray_start_keeps_loopback()
    from ray.scripts.scripts import main

    sys.argv = ["ray", *argv]
    main()


if __name__ == "__main__":  # python -m flows.services.stack ray start ...: a stack's node
    if sys.argv[1:2] != ["ray"]:
        raise SystemExit("usage: python -m flows.services.stack ray ARGS...")
    _ray_cli(sys.argv[2:])
