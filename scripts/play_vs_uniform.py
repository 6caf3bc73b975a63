"""Play a PSRO run's final meta-strategy mixture against uniform random play.

A quick check that a run learned something: per role, the role's population, mixed by the
meta-strategy of the run's last committed iteration (one member drawn per game, as PSRO mixes),
plays N games against `UniformPolicy` on every other role, each member acting as it does in
evaluation (explore=False: a DQN member with its `epsilon_eval`), on a local
rollout worker. Populations and meta-strategies are read back exactly as `psro resume` reads
them (`flows.tracking.resume.load_checkpoint`), so no server is needed, only the MLflow store.

Usage::

    .venv/bin/python scripts/play_vs_uniform.py --tracking-uri sqlite:///mlflow.db --run-id ID --games 1000
    .venv/bin/python scripts/play_vs_uniform.py --experiment psro      # the experiment's newest finished run

Prints per role (on a board game, per seat) the wins, draws and losses, the win rate with its
standard error, and the mean return. A game counts as won when the role's return is > 0, lost
when < 0, drawn at 0: that is winning on a zero-sum game decided by its final reward (connect
four, poker); on other games read the mean return. Where several agents share a role, the
role's return is their mean, as the payoff tables count it.

Exit status 2 with one `error:` line for a store, experiment or run that does not exist, or a
bad --games.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np

from flows.tracking.registry_members import PopulationError, open_store
from flows.tracking.resume import Checkpoint, ResumeError, committed_iteration, game_of_logged, load_checkpoint
from marl_core.policies.base import UniformPolicy
from marl_core.psro.learned_oracle import mixtures, role_returns
from marl_core.rollout.pool import PoolConfig, WorkerPool
from marl_core.rollout.worker import PolicyMixture, RolloutRequest

ENVS_PER_WORKER = 32  # environment copies stepped together: batched acting, the same results for any number


class PlayError(ValueError):
    """A bad argument or a run that cannot be found: one line for the user."""


@dataclasses.dataclass(frozen=True)
class RoleResult:
    role: str
    agents: tuple[str, ...]  # who plays the mixture; every other agent plays uniformly
    wins: int
    draws: int
    losses: int
    mean_return: float
    mean_return_stderr: float

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    @property
    def win_rate(self) -> float:
        return self.wins / self.games

    @property
    def win_rate_stderr(self) -> float:
        return float(np.sqrt(self.win_rate * (1 - self.win_rate) / self.games))


def play_vs_uniform(checkpoint: Checkpoint, games: int, seed: int = 0) -> list[RoleResult]:
    """Per role, in the game's role order: its final mixture against uniform play elsewhere."""
    game = game_of_logged(checkpoint.config)
    final = mixtures(checkpoint.populations, checkpoint.meta_strategy, game)
    uniform = PolicyMixture((UniformPolicy(),), np.ones(1))
    requests = [
        RolloutRequest(
            roles=game.mapping,
            populations={other: final[other] if other == role else uniform for other in game.roles},
            episodes=games,
            seed=(seed, r),
            explore=False,
        )
        for r, role in enumerate(game.roles)
    ]
    pool = WorkerPool(PoolConfig(game.make_env, workers=1, envs_per_worker=ENVS_PER_WORKER))
    try:
        played = pool.collect(requests)
    finally:
        pool.close()
    results = []
    for role, result in zip(game.roles, played):
        returns = role_returns(result.episode_returns, game, role)
        results.append(
            RoleResult(
                role,
                game.agents_of(role),
                wins=int((returns > 0).sum()),
                draws=int((returns == 0).sum()),
                losses=int((returns < 0).sum()),
                mean_return=float(returns.mean()),
                mean_return_stderr=float(returns.std(ddof=1) / np.sqrt(len(returns))),
            )
        )
    return results


def newest_finished_run(client, experiment: str) -> str:
    """The newest FINISHED run of `experiment` that committed an iteration (a `psro run` run)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        known = sorted(e.name for e in client.search_experiments())
        raise PlayError(
            f"no experiment {experiment!r} in {client.tracking_uri}; experiments: {', '.join(known) or 'none'}"
        )
    runs = client.search_runs(
        [found.experiment_id], filter_string="attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"]
    )
    run = next((run for run in runs if committed_iteration(run) is not None), None)
    if run is None:
        raise PlayError(f"experiment {experiment!r} has no finished `psro run` run; pass --run-id")
    return run.info.run_id


def report(checkpoint: Checkpoint, results: list[RoleResult]) -> str:
    game = checkpoint.config["game"]
    sizes = "x".join(str(len(p)) for p in checkpoint.populations)
    lines = [
        f"run {checkpoint.run_id}: {game}, iteration {checkpoint.iteration}, populations {sizes}; "
        f"each role's final meta-strategy mixture against uniform play on every other role, "
        f"{results[0].games} games per role",
        f"{'role':<12} {'agents':<24} {'wins':>6} {'draws':>6} {'losses':>6}  {'win rate':>15}  {'mean return':>18}",
    ]
    for r in results:
        lines.append(
            f"{r.role:<12} {','.join(r.agents):<24} {r.wins:>6} {r.draws:>6} {r.losses:>6}  "
            f"{r.win_rate:>7.3f} ± {r.win_rate_stderr:.3f}  {r.mean_return:>+9.4f} ± {r.mean_return_stderr:.4f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db", help="MLflow store the run was tracked in")
    parser.add_argument("--run-id", help="the `psro run` MLflow run (default: the newest finished run of --experiment)")
    parser.add_argument("--experiment", default="psro", help="MLflow experiment to take the newest finished run from")
    parser.add_argument("--games", type=int, default=1000, help="games per role (2 or more)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the games")
    args = parser.parse_args(argv)
    from mlflow.exceptions import MlflowException

    doing = f"--tracking-uri {args.tracking_uri}"  # what an MlflowException is about: the store, then the run
    try:
        if args.games < 2:
            raise PlayError(f"--games {args.games}: play 2 or more (one game has no standard error)")
        client = open_store(args.tracking_uri)
        run_id = args.run_id or newest_finished_run(client, args.experiment)
        doing = f"run {run_id} in {args.tracking_uri}"
        checkpoint = load_checkpoint(args.tracking_uri, run_id)
    except (PlayError, PopulationError, ResumeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (
        MlflowException
    ) as error:  # a URI MLflow cannot open (unknown scheme, a bare folder), a run without its artifacts
        print(f"error: {doing}: {str(error).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    print(report(checkpoint, play_vs_uniform(checkpoint, args.games, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
