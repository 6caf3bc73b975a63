"""Where each scenario's run keeps things in MLflow: every artifact path, tag and registry name,
in one place.

The tracker writes these, resume and the `psro evaluate/export` commands read them back, and the
tests look for them; each spells them through this module only, so a renamed artifact cannot
leave a reader looking in the old place.

One MLflow run per PSRO run:

- ``config.json``: the run's settings as JSON (what resume restarts from);
- ``payoffs/iteration_NNNN.csv``: the payoff entries iteration N added (the whole table is the
union of these files) and ``payoffs/final.csv``, the whole table at the end of the run;
- ``meta_strategy/iteration_NNNN.json``: role -> the meta-strategy iteration N solved;
- ``population/<role>/member_<k>``: member k of a role's population, as
`marl_core.policies.storage` writes it (weights only);
- ``plots/*.png``: figures;
- the tag ``psro.committed_iteration`` = N: iteration N is complete (see `flows.tracking.resume`).

Registry: one registered model per role, ``{experiment}-{game}-{role}``, one version per member
(its source is the member's folder), tagged as `VersionTags` says. MLflow reserves the alias
``latest`` (``models:/NAME/latest`` already means the newest version), so the newest member also
gets the alias ``newest``.

One MLflow run per MARL run: ``config.json`` (as above); per-round metrics (`RoundRecord.metrics`,
step = round); ``checkpoint/learner.pt``, the learner's whole training state (weights-only
loadable), overwritten at each checkpoint; ``policies/<policy>/round_NNNN/`` the acting network of
each policy at a checkpoint (``weights.pt`` + ``policy.json``), one registry version each under
``{experiment}-{env}-{policy}``; ``plots/episode_return.png``. The tag ``marl.committed_round`` =
N is the commit of round N's checkpoint.

One MLflow run per league run: ``config.json`` (as above); per-generation metrics
(`GenerationRecord.metrics`, step = generation: exploitability and record against uniform play of
each main agent, every player's ratings, its learners' training figures);
``league/generation_NNNN/{match_table,ratings}.csv`` (and, with PBT, ``lineage.json``: every copy
so far); ``league/members/<snapshot>/<role>/`` each snapshot's policy per role
(`marl_core.policies.storage`), one registry version each under ``{experiment}-{game}-{role}``
tagged as a PSRO member is (so `psro evaluate` and `psro ratings` take it) plus its snapshot,
parent and kind; ``checkpoint/slot_K/`` (K = generation mod 2) the league, ratings, trainer states
and learning players' members of a commit, two slots so that a commit being written never
overwrites the committed one; the tag ``league.committed_generation`` = N is the commit of
generation N. Plots: ``plots/ratings.png``, ``plots/win_rates.png`` and, where a tree exists,
``plots/exploitability.png``.

One MLflow run per PBT run: ``config.json`` (as above); per-round metrics (`PBTRound.metrics`,
step = round: each member's under ``member_<i>/``, its hyperparameters under ``member_<i>/hp/``,
``best_score``); at each checkpoint ``checkpoint/slot_K/`` (K alternates, `pbt_checkpoint_path`)
every member's training state (``member_<i>.pt``) and the PBT state (``pbt_state.json``: settings,
hyperparameters, the generator, the lineage), each member's policies under
``policies/member_<i>/<policy>/round_NNNN/``, one registry version each under
``{experiment}-{env}-{policy}`` tagged with its member, round, score and hyperparameters, then
``pbt/lineage.json`` and ``pbt/lineage.csv`` (who copied whom, when, with what values); the tag
``pbt.committed_round`` = N is the commit of round N. Plot: ``plots/pbt.png``.

One MLflow run per neural CFR run: ``config.json`` (as above); per-round metrics
(`CFRRound.metrics`, step = round: the members' exact exploitability and NashConv, the losses,
samples and seconds); at each commit ``checkpoint/slot_K/solver.pt`` (K alternates,
`checkpoint_slot`), the solver's whole state (networks, optimizers, memories, generators;
weights-only loadable), and each player's average-policy network under
``population/<role>/member_<round>`` (`marl_core.policies.storage`, with its table where the
tree fits), one registry version each under ``{experiment}-{game}-{role}`` tagged as a PSRO
member is; the tag ``cfr.committed_round`` = N is the commit of round N. Plots:
``plots/exploitability.png`` and ``plots/exploitability_wall_time.png``."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

CONFIG_ARTIFACT = "config.json"
FINAL_PAYOFFS = "payoffs/final.csv"
EXPLOITABILITY_PLOT = "plots/exploitability.png"
EXPLOITABILITY_TIME_PLOT = "plots/exploitability_wall_time.png"
# where a run measured approx_exploitability: those points with error bars, beside the exact curve if any
APPROX_EXPLOITABILITY_PLOT = "plots/approx_exploitability.png"
PAYOFF_HEATMAP = "plots/payoff_heatmap.png"
POPULATION_ROOT = "population"
# `psro evaluate` logs one run of its own: the payoff table (members by position) and who they are.
EVALUATION_PAYOFFS = "payoffs.csv"
EVALUATION_MEMBERS = "members.json"

COMMITTED_TAG = "psro.committed_iteration"
# Tags the MLflow run with the Prefect flow run that created it: a retried flow run finds it by this.
FLOW_RUN_TAG = "prefect.flow_run_id"
SCENARIO_TAG = "scenario"  # which scenario's run it is: psro, marl, league, pbt


def mlflow_run_link(ui_url: str, experiment_id: str, run_id: str) -> str:
    """A run's page in MLflow's UI, in its model-training view. MLflow 3's UI opens every
    experiment in its GenAI view (traces, evaluations) unless the link asks for the other; the
    experiment's `mlflow.experimentKind` tag, which the trackers set, only counts where the UI
    has no such switch."""
    return f"{ui_url}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


NEWEST_ALIAS = "newest"
META_WEIGHT_TAG = "meta_weight"  # the version tag the end of a run rewrites


def payoffs_path(iteration: int) -> str:
    return f"payoffs/iteration_{iteration:04d}.csv"


def meta_strategy_path(iteration: int) -> str:
    return f"meta_strategy/iteration_{iteration:04d}.json"


def member_path(role: str, member: int) -> str:
    return f"{POPULATION_ROOT}/{role}/member_{member}"


def member_path_in(source: str) -> str:
    """A registry version's folder inside its run's artifacts, from the version's source URI."""
    return f"{POPULATION_ROOT}/" + source.split(f"/{POPULATION_ROOT}/", 1)[1]


def registered_model_name(experiment: str, game: str, role: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", game).strip("_")
    return f"{experiment}-{slug}-{role}"


@dataclasses.dataclass(frozen=True)
class VersionTags:
    """What a registry version says about the member it holds."""

    run_id: str
    game: str
    role: str
    member: int
    iteration: int  # the iteration that added it
    meta_weight: float  # its weight in the run's last meta-strategy

    def as_tags(self) -> dict[str, str]:
        return {
            "run_id": self.run_id,
            "game": self.game,
            "role": self.role,
            "member": str(self.member),
            "iteration": str(self.iteration),
            META_WEIGHT_TAG: meta_weight_tag(self.meta_weight),
        }

    @classmethod
    def of(cls, tags: dict[str, str]) -> VersionTags:
        """Raises KeyError naming the first missing tag: the version was not registered by a run."""
        return cls(
            tags["run_id"],
            tags["game"],
            tags["role"],
            int(tags["member"]),
            int(tags["iteration"]),
            float(tags[META_WEIGHT_TAG]),
        )


def meta_weight_tag(weight: float) -> str:
    return f"{weight:.6g}"


def versions_of_run(name: str, run_id: str) -> str:
    """The registry search filter for the versions one run registered under `name`."""
    return f"name='{name}' and tags.run_id='{run_id}'"


# --- MARL training runs (`psro marl run`) ---------------------------------------------------

MARL_CHECKPOINT = "checkpoint/learner.pt"
MARL_COMMITTED_TAG = "marl.committed_round"
MARL_ENV_STEPS_TAG = "marl.committed_env_steps"
EPISODE_RETURN_PLOT = "plots/episode_return.png"
STALENESS_PLOT = "plots/staleness.png"  # asynchronous MARL runs: fragments taken, by staleness


def policy_checkpoint_path(policy: str, round: int) -> str:
    """Policy `policy`'s acting network at round `round`'s checkpoint: `POLICY_WEIGHTS` and
    `POLICY_DESCRIPTION` in this folder."""
    return f"policies/{policy}/round_{round:04d}"


POLICY_WEIGHTS = "weights.pt"
POLICY_DESCRIPTION = "policy.json"


# --- league runs (`psro league run`) ----------------------------------------------------------

LEAGUE_COMMITTED_TAG = "league.committed_generation"
LEAGUE_CHECKPOINT_FILE = "league.pt"
RATINGS_PLOT = "plots/ratings.png"
WIN_RATE_HEATMAP = "plots/win_rates.png"


def league_generation_path(generation: int) -> str:
    return f"league/generation_{generation:04d}"


def league_member_path(snapshot: str, role: str) -> str:
    return f"league/members/{snapshot}/{role}"


def league_checkpoint_path(generation: int) -> str:
    return f"checkpoint/slot_{generation % 2}"


# --- PBT runs (`psro pbt run`) ----------------------------------------------------------------

PBT_COMMITTED_TAG = "pbt.committed_round"
PBT_STATE_FILE = "pbt_state.json"
PBT_LINEAGE = "pbt/lineage"
PBT_PLOT = "plots/pbt.png"


def checkpoint_slot(round: int, checkpoint_every: int) -> str:
    """Consecutive commits alternate between two slots, so a commit being written never
    overwrites the committed one (a run's last round may commit off the interval, but always
    in the next slot)."""
    return f"checkpoint/slot_{(round // checkpoint_every) % 2}"


pbt_checkpoint_path = checkpoint_slot


def pbt_policy_path(member: int, policy: str, round: int) -> str:
    return f"policies/member_{member}/{policy}/round_{round:04d}"


# --- neural CFR runs (`psro cfr run`) ---------------------------------------------------------

CFR_COMMITTED_TAG = "cfr.committed_round"
CFR_SOLVER_FILE = "solver.pt"  # in `checkpoint_slot(round, checkpoint_every)`


def sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` store (None for any other store, or an in-memory one)."""
    if not uri.lower().startswith("sqlite://"):
        return None
    name = uri[len("sqlite://") :].partition("?")[0]
    return None if name in ("", "/", "/:memory:") else Path(name[1:])
