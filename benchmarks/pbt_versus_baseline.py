"""A PBT run's best member against its `--no-exploit` baseline's, each re-evaluated on fresh episodes.

A run's best score is the maximum over its members of a greedy return measured on
`eval_episodes` episodes. The maximum of noisy estimates is biased upward, and more so over more
members: a PBT run ends with every member trained, its baseline with the members that could not
learn still untrained, so comparing the two runs' best scores favours PBT even where it found
nothing. Here each run's best member (by the run's own final score) is taken from its last
committed checkpoint and evaluated again, greedily, on `--episodes` episodes whose seeds no
training or evaluation round used; the two re-evaluations are independent of the selection.

Usage: python benchmarks/pbt_versus_baseline.py --tracking-uri sqlite:///mlflow.db \
           --pbt RUN_ID --baseline RUN_ID [--episodes 1000]
For runs whose agents share one policy (a member's score is then that policy's return).
Prints, per run: the members' final scores, the best member, and its re-evaluated return with
its standard error; then the difference with its standard error.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

EVAL_SEED = 7_777_777  # no run's member seed: runs use seed + member index


def reevaluate(tracking_uri: str, run_id: str, episodes: int) -> tuple[list[float], int, float, float]:
    """(final scores per member, the best member, its re-evaluated mean return, standard error)."""
    import numpy as np
    import torch

    from flows.scenarios.pbt import PBT
    from flows.tracking.pbt_tracker import load_pbt_state
    from flows.tracking.resume import committed_step, logged_config, open_client
    from marl_core.marl.config import layout_and_spec, make_learner, pool_config
    from marl_core.marl.learner_handles import LocalLearner
    from marl_core.marl.steps import evaluate_policies, summarize
    from marl_core.pbt.marl import PBTConfig
    from marl_core.rollout.pool import WorkerPool

    client = open_client(tracking_uri)
    last = committed_step(client, run_id, PBT)
    config = PBTConfig(**logged_config(client, run_id))
    state, learners = load_pbt_state(client, run_id, last, config.marl.checkpoint_every)
    scores = []
    for i in range(config.population):
        history = client.get_metric_history(run_id, f"member_{i}/score")
        scores.append(max(history, key=lambda m: m.step).value)
    best = int(np.argmax(scores))  # a top member: exploit never overwrites it, so the checkpoint holds what it scored
    member = state.member_config(config, best).model_copy(update={"eval_episodes": episodes, "seed": EVAL_SEED})
    torch.set_num_threads(1)
    layout, spec = layout_and_spec(member)
    learner = make_learner(member, layout, spec.state_size)
    learner.load_state_dict(learners[best])
    pool = WorkerPool(pool_config(member))
    try:
        returns = evaluate_policies(member, pool, LocalLearner(learner), last).returns
    finally:
        pool.close()
    mean, stderr = summarize(returns, list(layout.agents), layout.groups)
    (policy,) = [key for key in mean if key.startswith("policy/")]  # a member's score is its policy's return
    return scores, best, mean[policy], stderr[policy]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("--pbt", required=True, help="run id of the `psro pbt run`")
    parser.add_argument("--baseline", required=True, help="run id of the same config with --no-exploit")
    parser.add_argument("--episodes", type=int, default=1000)
    args = parser.parse_args(argv)
    results = {}
    for name, run_id in (("PBT", args.pbt), ("baseline", args.baseline)):
        scores, best, mean, stderr = reevaluate(args.tracking_uri, run_id, args.episodes)
        results[name] = (mean, stderr)
        print(
            f"{name:9s} final scores {' '.join(f'{s:.2f}' for s in scores)}; best member {best} "
            f"({scores[best]:.2f}), over {args.episodes} fresh episodes {mean:.2f} ± {stderr:.2f}"
        )
    (a, sa), (b, sb) = results["PBT"], results["baseline"]
    print(f"PBT - baseline: {a - b:+.2f} ± {math.hypot(sa, sb):.2f}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
