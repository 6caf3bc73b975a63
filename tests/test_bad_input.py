"""Bad input costs one line, exit code 2, and nothing else.

Every row of `ROWS` goes through the real `psro run` command (typer's CliRunner, in this process)
with ``--tracking-uri`` at a real MLflow store that already holds a finished run. Afterwards:
stdout is empty, stderr is exactly ``error: <message>``, the store's bytes and artifact files
are unchanged, the working directory is as it was, and no process carries this test's marker
(a Prefect server or a Ray node started for the run would inherit it from the environment). A
few rows also run as a real `.venv/bin/psro` subprocess, where a C++ library could write to
file descriptor 2 behind Python's back.

The second half covers bad numbers from inside a run: a NaN or infinite reward stops a rollout
naming the environment and the step, and never reaches a payoff table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium
import mlflow
import numpy as np
import pytest
from pettingzoo import ParallelEnv
from typer.testing import CliRunner

from flows.cli.app import app

pytestmark = pytest.mark.timeout(180)  # a row that slipped through would start a whole run

MARKER = "PSRO_BAD_INPUT_TEST"
PSRO = str(Path(sys.executable).with_name("psro"))
EXPECTED_RAY = (
    "expected HOST:PORT of a running Ray head (its GCS port, 6379 by default), ray://HOST:PORT "
    "(Ray Client, port 10001 by default), 'auto' or 'local', or no address to start a local Ray"
)
EXPECTED_STORE = (
    "expected sqlite:///FILE.db in an existing writable directory, http(s)://HOST:PORT of an MLflow "
    "server, or a database URL (postgresql://, mysql://, mssql://)"
)
EXPECTED_EXPORT = "expected a new directory or an empty one (a previous export is never overwritten)"


@dataclasses.dataclass(frozen=True)
class Row:
    """One kind of bad input. `args` and `message` may hold {port} (a non-Ray TCP service)."""

    id: str
    args: tuple[str, ...]
    message: str  # the whole stderr line after "error: "
    config: str | None = None  # YAML text, passed as --config run.yaml
    files: tuple[str, ...] = ()  # files made in the working directory first (a/b makes a/)


ROWS = [
    # names that are not in a registry
    Row("unknown game", ("--game", "no_such_game"), "unknown game 'no_such_game'; run `psro games` to list games"),
    Row(
        "unknown meta-solver",
        ("--meta-solver", "best"),
        "unknown meta-solver 'best'; choose one of: alpharank, fictitious_play, last, nash, prd, "
        "regret_matching, uniform",
    ),
    Row(
        "unknown oracle",
        ("--oracle", "sarsa"),
        "unknown oracle 'sarsa'; choose one of: a2c, appo, dqn, exact, impala, ppo, tabular_q",
    ),
    Row("unknown evaluator", ("--eval", "approximate"), "eval='approximate': Input should be 'exact' or 'sampled'"),
    # wrong types
    Row(
        "flag of wrong type",
        ("--iterations", "abc"),
        "iterations='abc': Input should be a valid integer, unable to parse string as an integer",
    ),
    Row("unknown flag", ("--learning-rate", "0.1"), "No such option: --learning-rate"),
    Row(
        "YAML boolean for a count", (), "iterations=True: expected a whole number, got True", config="iterations: yes\n"
    ),
    Row(
        "YAML text for a count",
        (),
        "episodes='ten': Input should be a valid integer, unable to parse string as an integer",
        config='episodes: "ten"\n',
    ),
    Row(
        "YAML fraction for the seed",
        (),
        "seed=1.5: Input should be a valid integer, got a number with a fractional part",
        config="seed: 1.5\n",
    ),
    # counts out of range
    Row("zero iterations", ("--iterations", "0"), "iterations=0: Input should be greater than 0"),
    Row(
        "negative episodes",
        ("--eval", "sampled", "--episodes", "-3"),
        "episodes=-3: Input should be greater than or equal to 2",
    ),
    Row("zero cpus", ("--num-cpus", "0"), "num_cpus=0: Input should be greater than 0"),
    # options that do not fit the game
    Row(
        "nash on a 3-player game",
        ("--game", "kuhn_poker(players=3)", "--meta-solver", "nash"),
        "meta-solver 'nash' needs a two-player zero-sum game, but this game has 3 players and zero-sum utility; "
        "choose one of: alpharank, fictitious_play, last, prd, regret_matching, uniform",
    ),
    Row(
        "learned oracle without tensors",
        ("--oracle", "dqn", "--game", "tic_tac_toe"),
        "oracle 'dqn' needs a game with information-state tensors (network inputs); "
        "'tic_tac_toe' has none: use oracle 'exact'",
    ),
    Row(
        "exact eval on a PettingZoo env",
        ("--game", "pettingzoo:mpe2.simple_spread_v3", "--oracle", "ppo", "--eval", "exact"),
        "eval 'exact' needs an OpenSpiel game whose tree fits in memory; 'pettingzoo:mpe2.simple_spread_v3' has none: "
        "use eval 'sampled' and a learned oracle",
    ),
    Row(
        "exact oracle on a PettingZoo env",
        ("--game", "pettingzoo:mpe2.simple_spread_v3"),
        "oracle 'exact' walks a game tree; 'pettingzoo:mpe2.simple_spread_v3' has none: "
        "use a learned oracle (a2c, appo, dqn, impala, ppo)",
    ),
    Row(
        "tabular oracle on a PettingZoo env",
        ("--game", "pettingzoo:mpe2.simple_spread_v3", "--oracle", "tabular_q"),
        "oracle 'tabular_q' keeps a table row per information state; 'pettingzoo:mpe2.simple_spread_v3' has none: "
        "use a network oracle (a2c, appo, dqn, impala, ppo)",
    ),
    # config files
    Row(
        "missing config file",
        ("--config", "absent.yaml"),
        "cannot read config file 'absent.yaml': No such file or directory",
    ),
    Row(
        "malformed YAML",
        (),
        "config file 'run.yaml' is not valid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'",
        config="game: [kuhn_poker\n",
    ),
    Row(
        "YAML list",
        (),
        "config file 'run.yaml' must hold a mapping of settings, got list",
        config="- kuhn_poker\n- leduc_poker\n",
    ),
    Row(
        "unknown YAML key",
        (),
        "learning_rate=0.1: Extra inputs are not permitted",
        config="game: kuhn_poker\nlearning_rate: 0.1\n",
    ),
    # nested settings
    Row(
        "negative DQN learning rate",
        (),
        "dqn.lr=-1: Input should be greater than 0",
        config="oracle: dqn\ndqn: {lr: -1}\n",
    ),
    Row(
        "zero rollout workers",
        (),
        "rollout.workers=0: Input should be greater than 0",
        config="rollout: {workers: 0}\n",
    ),
    Row(
        "section that is not a mapping",
        (),
        "best_response=5: Input should be a valid dictionary or instance of BestResponseTraining",
        config="best_response: 5\n",
    ),
    Row(
        "DQN buffer smaller than a batch",
        (),
        "dqn: buffer_size 10 is smaller than batch_size 64",
        config="dqn: {batch_size: 64, buffer_size: 10}\n",
    ),
    Row(
        "A2C discount above 1",
        (),
        "a2c.gamma=1.5: Input should be less than or equal to 1",
        config="oracle: a2c\na2c: {gamma: 1.5}\n",
    ),
    Row(
        "misspelt A2C setting",
        ("--oracle", "a2c"),
        "a2c.learning_rate=0.1: Extra inputs are not permitted; a2c takes: hidden, shared_trunk, encoder, frame_size, "
        "lr, gamma, gae_lambda, entropy_coef, value_coef, max_grad_norm, normalize_advantages, seed",
        config="a2c: {learning_rate: 0.1}\n",
    ),
    # the outside world (flows/services/preflight.py)
    Row(
        "Ray address refused",
        ("--ray-address", "127.0.0.1:1"),
        f"ray_address='127.0.0.1:1': nothing answers at 127.0.0.1:1 (connection refused); {EXPECTED_RAY}",
    ),
    Row(
        "Ray host that does not resolve",
        ("--ray-address", "ray://no-such-host.invalid:10001"),
        f"ray_address='ray://no-such-host.invalid:10001': host 'no-such-host.invalid' does not resolve; {EXPECTED_RAY}",
    ),
    Row(
        "Ray address that is not Ray",
        ("--ray-address", "127.0.0.1:{port}"),
        "ray_address='127.0.0.1:{port}': 127.0.0.1:{port} answers, but not as Ray (no gRPC reply; "
        f"the dashboard port is not a Ray address); {EXPECTED_RAY}",
    ),
    Row(
        "store under a regular file",
        ("--tracking-uri", "sqlite:///notes.txt/mlflow.db"),
        f"tracking_uri='sqlite:///notes.txt/mlflow.db': 'notes.txt' is a file, not a directory; {EXPECTED_STORE}",
        files=("notes.txt",),
    ),
    Row(
        "store in a missing directory",
        ("--tracking-uri", "sqlite:///missing/mlflow.db"),
        f"tracking_uri='sqlite:///missing/mlflow.db': directory 'missing' does not exist; {EXPECTED_STORE}",
    ),
    Row(
        "store that is not SQLite",
        ("--tracking-uri", "sqlite:///notes.txt"),
        f"tracking_uri='sqlite:///notes.txt': 'notes.txt' is not an SQLite database; {EXPECTED_STORE}",
        files=("notes.txt",),
    ),
    Row(
        "store with an unknown scheme",
        ("--tracking-uri", "sqlit:///mlflow.db"),
        f"tracking_uri='sqlit:///mlflow.db': unknown scheme 'sqlit'; {EXPECTED_STORE}",
    ),
    Row(
        "MLflow server refused",
        ("--tracking-uri", "http://127.0.0.1:1"),
        f"tracking_uri='http://127.0.0.1:1': no MLflow server answers at 127.0.0.1:1 (connection refused); "
        f"{EXPECTED_STORE}",
    ),
    Row(
        "non-empty export directory",
        ("--export", "previous"),
        f"export='previous': directory 'previous' exists and is not empty; {EXPECTED_EXPORT}",
        files=("previous/summary.json",),
    ),
    Row(
        "export onto a file",
        ("--export", "notes.txt"),
        f"export='notes.txt': 'notes.txt' is a file, not a directory; {EXPECTED_EXPORT}",
        files=("notes.txt",),
    ),
]
SUBPROCESS_ROWS = ("Ray address refused", "store under a regular file", "exact eval on a PettingZoo env")


def _row_id(row) -> str:
    return (row.values[0] if hasattr(row, "values") else row).id


# --- fixtures: a store with history, a fresh working directory, a TCP service that is not Ray --


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A real MLflow SQLite store holding one finished run with a param, a metric and an artifact."""
    root = tmp_path_factory.mktemp("store")
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    experiment = client.create_experiment("psro", artifact_location=(root / "artifacts").as_uri())
    run = client.create_run(experiment, run_name="earlier")
    client.log_param(run.info.run_id, "game", "kuhn_poker")
    client.log_metric(run.info.run_id, "exploitability", 0.25, step=0)
    client.log_text(run.info.run_id, "uniform play", "notes/earlier.txt")
    client.set_terminated(run.info.run_id, "FINISHED")
    return root


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for name in ("PREFECT_API_URL", "RAY_ADDRESS", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.setenv(MARKER, str(tmp_path))
    return work


@pytest.fixture(scope="module")
def not_ray():
    """A TCP service on a free local port that answers like an HTTP/1 server, as Ray's dashboard would."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                connection.recv(64)
                connection.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


# --- what must hold after every bad command ---------------------------------------------------


def _snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under root, files by the hash of their bytes."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder"
        for path in sorted(root.rglob("*"))
    }


def _marked_processes(value: str) -> list[str]:
    """Processes (other than this one) whose environment carries this test's marker."""
    needle = f"{MARKER}={value}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # gone, or not ours to read
            continue
    return found


def _prepare(row: Row, work: Path, port: int) -> tuple[list[str], str]:
    for name in row.files:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("{}\n")
    args = [arg.replace("{port}", str(port)) for arg in row.args]
    if row.config is not None:
        (work / "run.yaml").write_text(row.config)
        args = ["--config", "run.yaml", *args]
    return args, "error: " + row.message.replace("{port}", str(port))


def _with_store(args: list[str], store: Path) -> list[str]:
    return args if "--tracking-uri" in args else [*args, "--tracking-uri", f"sqlite:///{store}/mlflow.db"]


@pytest.mark.parametrize("row", ROWS, ids=_row_id)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(row, store, workdir, not_ray):
    args, expected = _prepare(row, workdir, not_ray)
    before = _snapshot(store), _snapshot(workdir)

    result = CliRunner().invoke(app, ["run", *_with_store(args, store)], terminal_width=400)

    assert (result.exit_code, result.stdout, result.stderr.strip()) == (2, "", expected), result.output
    assert (_snapshot(store), _snapshot(workdir)) == before
    assert not (workdir.parent / "prefect-home").exists()
    assert _marked_processes(os.environ[MARKER]) == []
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


@pytest.mark.parametrize("row", [r for r in ROWS if _row_id(r) in SUBPROCESS_ROWS], ids=_row_id)
def test_a_real_terminal_sees_exactly_that_line(row, store, workdir, not_ray):
    """Through the installed command: nothing else reaches stdout or stderr (no C++ chatter, no
    Ray or Prefect log lines), and nothing the command started outlives it."""
    args, expected = _prepare(row, workdir, not_ray)
    before = _snapshot(store), _snapshot(workdir)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_API", "RAY_"))}

    result = subprocess.run(
        [PSRO, "run", *_with_store(args, store)], capture_output=True, text=True, env=env, timeout=120, cwd=workdir
    )

    assert (result.returncode, result.stdout, result.stderr) == (2, "", expected + "\n")
    assert (_snapshot(store), _snapshot(workdir)) == before
    assert _marked_processes(os.environ[MARKER]) == []


# --- the other scenarios' commands --------------------------------------------------------------

# (command, args, config, message): `psro league run`, `psro pbt run` and `psro ratings` refuse in the same way.
PBT_CONFIG = """\
marl: {env: "pettingzoo:mpe2.simple_spread_v3", algorithm: mappo}
pbt: {perturbation_interval: 2, hyperparam_mutations: {lr: [1.0e-4, 1.0e-3]}}
"""
ASYNC_CONFIG = """\
env: "pettingzoo:mpe2.simple_spread_v3"
algorithm: impala
settings: {{asynchronous: {}}}
"""
OTHER_COMMANDS = [
    (
        "league run",
        ("--algorithm", "sarsa"),
        None,
        "algorithm='sarsa': unknown RL algorithm; choose one of: a2c, appo, dqn, impala, ppo, tabular_q",
    ),
    (
        "league run",
        ("--game", "kuhn_poker(players=3)"),
        None,
        "game 'kuhn_poker(players=3)' has 3 roles ['player_0', 'player_1', 'player_2']; a league plays two-sided games "
        "(map agents to two roles with `roles`)",
    ),
    ("league run", ("--generations", "0"), None, "generations=0: Input should be greater than 0"),
    (
        "league run",
        (),
        "league: {main_agent: {pfsp: 0.9}}\n",
        "league.main_agent: pfsp + verification + self_play must sum to 1, got 1.4",
    ),
    (
        "league run",
        (),
        "league: {league_exploiter: {weighting: cubic}}\n",
        "league.league_exploiter.weighting='cubic': unknown PFSP weighting; "
        "choose one of: squared, variance, linear, linear_capped, uniform",
    ),
    (
        "league run",
        (),
        "league: {main_agentz: 2}\n",
        "league.main_agentz=2: Extra inputs are not permitted; league takes: main_agents, main_exploiters, "
        "league_exploiters, decay, main_agent, main_exploiter, league_exploiter, snapshot",
    ),
    (
        "league run",
        (),
        "league: {snapshot: {min_steps: 10, max_steps: 5}}\n",
        "league.snapshot: min_steps 10 is above max_steps 5",
    ),
    (
        "league run",
        ("--tracking-uri", "sqlite:///missing/mlflow.db"),
        None,
        f"tracking_uri='sqlite:///missing/mlflow.db': directory 'missing' does not exist; {EXPECTED_STORE}",
    ),
    ("league resume", ("no-such-run",), None, "no MLflow run 'no-such-run' in sqlite:///{store}/mlflow.db"),
    (
        "ratings",
        (),
        None,
        "give either --run RUN_ID (a league run) or --member (two or more registry members), not both or neither",
    ),
    (
        "ratings",
        ("--member", "x"),
        None,
        "member 'x' is not NAME@ALIAS or NAME/VERSION (as in MLflow's models:/ URIs), "
        "e.g. psro-kuhn_poker-player_0@newest",
    ),
    ("ratings", ("--run", "no-such-run"), None, "no MLflow run 'no-such-run' in sqlite:///{store}/mlflow.db"),
    ("ratings", ("--run", "r", "--episodes", "0"), None, "episodes=0: needs 1 or more"),
    (
        "ratings",
        ("--run", "r", "--episodes", "40", "--games-per-match", "50"),
        None,
        "games_per_match=50: needs 1 to episodes (40), so that a pairing plays at least one match",
    ),
    (
        "pbt run",
        (),
        "population: 2\n",
        "no marl section (the learners' settings: env, algorithm, rounds, ...)",
    ),
    ("pbt run", ("--population", "1"), PBT_CONFIG, "population=1: Input should be greater than or equal to 2"),
    (
        "pbt run",
        (),
        PBT_CONFIG.replace("lr: [", "learning_rate: ["),
        "pbt.hyperparam_mutations: ['learning_rate'] are not settings of mappo; "
        "it has ['clip', 'critic_hidden', 'critic_lr', 'entropy_coef', 'epochs', 'gae_lambda', 'gamma', 'hidden', "
        "'lr', 'max_grad_norm', 'minibatch_size', 'normalize_advantages', 'seed', 'value_coef', 'value_norm']",
    ),
    (
        "pbt run",
        (),
        PBT_CONFIG.replace("[1.0e-4, 1.0e-3]", "{loguniform: [0.1, 0.01]}"),
        "pbt.hyperparam_mutations.lr={'loguniform': [0.1, 0.01]}: loguniform: low 0.1 must be below high 0.01",
    ),
    (
        "pbt run",
        (),
        PBT_CONFIG.replace("interval: 2", "interval: 2, quantile_fraction: 0.7"),
        "pbt.quantile_fraction=0.7: Input should be less than or equal to 0.5",
    ),
    ("pbt resume", ("no-such-run",), None, "no MLflow run 'no-such-run' in sqlite:///{store}/mlflow.db"),
    (
        "pbt run",
        (),
        PBT_CONFIG.replace("algorithm: mappo", "algorithm: impala").replace("lr: [", "impala.lr: ["),
        "marl.algorithm='impala' with asynchronous rounds: PBT trains collect-then-learn rounds only "
        "(ippo, mappo, a2c, iql, vdn, qmix, maddpg without `asynchronous`)",
    ),
    (
        "marl run",
        (),
        ASYNC_CONFIG.format("{distributed: {strategy: gossip}}"),
        "settings.asynchronous.distributed.strategy='gossip': Input should be 'bsp', 'asp' or 'bap' "
        "(impala's settings)",
    ),
    (
        "marl run",
        (),
        ASYNC_CONFIG.format("{device: cuda}"),
        "device='cuda': torch sees no GPU here; use 'auto' or 'cpu'",
    ),
    (
        "marl run",
        ("--env", "vmas:navigation(continuous_actions=True)", "--algorithm", "qmix"),
        None,
        "algorithm='qmix': environment 'vmas:navigation(continuous_actions=True)' has continuous actions, which "
        "qmix cannot take; algorithms that can: ippo, mappo",
    ),
    (
        "marl run",
        ("--env", "atari:pong_v9", "--algorithm", "ippo"),
        None,
        "unknown Atari game 'pong_v9' (No module named 'pettingzoo.atari.pong_v9'); "
        "use a module of pettingzoo.atari such as 'pong_v3'",
    ),
    (
        "marl run",
        (),
        'env: "pettingzoo:mpe2.simple_spread_v3"\nalgorithm: ippo\nsettings: {ppo: {encoder: nature_cnn}}\n',
        "settings.ppo.encoder='nature_cnn' reads [channels, 84, 84] frames; "
        "policy 'agent' observes 21 numbers, not a multiple of 7056 "
        "(use an atari: environment with agent_ids: false, or encoder: mlp)",
    ),
]


@pytest.mark.parametrize(
    "command, args, config, message", OTHER_COMMANDS, ids=[f"{c[0]}: {c[3][:40]}" for c in OTHER_COMMANDS]
)
def test_the_other_commands_refuse_bad_input_the_same_way(command, args, config, message, store, workdir, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # the device row means a machine without a GPU
    if config is not None:
        (workdir / "run.yaml").write_text(config)
        args = ("--config", "run.yaml", *args)
    before = _snapshot(store), _snapshot(workdir)

    result = CliRunner().invoke(app, [*command.split(), *_with_store(list(args), store)], terminal_width=400)

    expected = "error: " + message.replace("{store}", str(store))
    assert (result.exit_code, result.stdout, result.stderr.strip()) == (2, "", expected), result.output
    assert (_snapshot(store), _snapshot(workdir)) == before
    assert not (workdir.parent / "prefect-home").exists()
    assert _marked_processes(os.environ[MARKER]) == []


# --- NaN and infinite rewards ------------------------------------------------------------------


class BrokenRewards(ParallelEnv):
    """Two agents; on its third step agent `b` is paid `bad` (NaN or infinity)."""

    metadata = {"name": "broken_rewards_v0"}

    def __init__(self, bad: float):
        self.bad = bad
        self.possible_agents = ["a", "b"]
        self.agents = []

    def observation_space(self, agent):
        return gymnasium.spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return gymnasium.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {"a": 1.0, "b": self.bad if self.t == 3 else 1.0}
        done = {a: self.t >= 5 for a in self.agents}
        observations = {a: np.zeros(2, np.float32) for a in self.agents}
        infos = {a: {} for a in self.agents}
        if self.t >= 5:
            self.agents = []
        return observations, rewards, done, {a: False for a in done}, infos


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_a_non_finite_reward_stops_the_rollout_naming_env_and_step(bad):
    from marl_core.envs import PettingZooParallelEnv, shared_population
    from marl_core.rl import ALGORITHMS
    from marl_core.rollout.worker import AlgorithmPolicy, LearnerSpec, RolloutRequest, RolloutWorker

    worker = RolloutWorker(lambda: PettingZooParallelEnv(BrokenRewards(bad)), envs_per_worker=2)
    request = RolloutRequest(
        roles=shared_population("all"),
        populations={},
        episodes=4,
        seed=(0,),
        learners={"all": LearnerSpec("learner", AlgorithmPolicy("dqn", ALGORITHMS["dqn"].config()))},
    )
    with pytest.raises(ValueError) as raised:
        worker.collect(request)
    assert str(raised.value) == f"broken_rewards_v0: non-finite reward {bad!r} for agent 'b' at step 3 of the episode"


def test_the_payoff_table_refuses_nan_and_keeps_what_it_had():
    from marl_core.empirical_game.payoffs import PayoffTable

    table = PayoffTable(2)
    table.grow((1, 1))
    table.record([[0, 0]], [[0.5, -0.5]], [[0.0, 0.0]], [0])
    table.grow((2, 1))
    kept = table.copy()
    for mean, stderr in (([[np.nan, 0.0]], [[0.0, 0.0]]), ([[0.0, 0.0]], [[np.inf, 0.0]])):
        with pytest.raises(ValueError, match="^evaluator returned non-finite payoffs; nothing was recorded$"):
            table.record([[1, 0]], mean, stderr, [10])
    for name in ("mean", "stderr", "episodes", "known"):
        np.testing.assert_array_equal(getattr(table, name), getattr(kept, name))


def test_the_meta_game_keeps_its_table_when_an_evaluation_is_not_finite():
    """Environments stop a NaN reward themselves (above); the meta-game step records into a
    copy, so even a NaN that got past an evaluator leaves the run's table as it was."""
    from marl_core.empirical_game import evaluation
    from marl_core.psro import steps as psro
    from marl_core.psro.config import build_config

    config = build_config({"game": "kuhn_poker", "eval": "sampled"})
    state = psro.initial_state(config)
    chunks = psro.plan_evaluation(state.payoffs, state.population_sizes, parts=1)
    nan = evaluation.ProfilePayoffs(mean=np.array([[np.nan, 0.0]]), stderr=np.zeros((1, 2)), episodes=np.array([10]))
    with pytest.raises(ValueError, match="non-finite payoffs"):
        psro.solve_meta_game(config, state.payoffs, chunks, [nan])
    assert not state.payoffs.known.any()
