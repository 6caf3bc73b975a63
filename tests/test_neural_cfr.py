"""Neural CFR (marl_core.neural_cfr): its pieces against known answers, a short Kuhn run against
Kuhn's known equilibrium, and a checkpoint that resumes bit for bit.

Each test runs in seconds on one core; the measured curves are in docs/neural-equilibria.md.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pydantic
import pytest
import torch

from marl_core.games.openspiel import GameError
from marl_core.games.tree import best_response, build_tree, profile_values, sequence_reach
from marl_core.neural_cfr import NeuralCFR, NeuralCFRSettings, exact_exploitability
from marl_core.neural_cfr.memory import Reservoir
from marl_core.neural_cfr.networks import hedge, regret_matching
from marl_core.policies.tabularize import tabularize

# Small networks and few steps: a Kuhn iteration then takes a few hundredths of a second.
SMALL = dict(advantage_hidden=(32, 32), policy_hidden=(32, 32), batch_size=128, merge_samples=True)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_hedge_is_a_softmax_over_the_legal_actions():
    advantages = torch.tensor([[0.0, 1.0, 5.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    probs = hedge(advantages, mask, scale=2.0)
    e = np.exp(2.0)
    assert probs[0].tolist() == pytest.approx([1 / (1 + e), e / (1 + e), 0.0])
    assert probs[1].tolist() == pytest.approx([1 / 3] * 3)


def test_regret_matching_plays_positive_advantages_in_proportion():
    advantages = torch.tensor([[1.0, 3.0, -2.0], [-1.0, -0.5, 5.0], [-1.0, -0.5, -3.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, True], [True, False, True]])
    argmax = regret_matching(advantages, mask, "argmax")
    uniform = regret_matching(advantages, mask, "uniform")
    # Positive regrets: in proportion. An illegal action's advantage (row 1's 5.0) counts for nothing.
    assert argmax[0].tolist() == [0.25, 0.75, 0.0]
    assert uniform[0].tolist() == [0.25, 0.75, 0.0]
    # No positive regret: the legal action of highest advantage, or every legal action alike.
    assert argmax[1].tolist() == [0.0, 1.0, 0.0]
    assert uniform[1].tolist() == [0.5, 0.5, 0.0]
    assert argmax[2].tolist() == [0.0, 1.0, 0.0]
    assert uniform[3].tolist() == [0.5, 0.0, 0.5]


def test_reservoir_keeps_a_uniform_sample_of_everything_added():
    generator = torch.Generator().manual_seed(0)
    memory = Reservoir(capacity=1_000)
    for start in range(0, 20_000, 500):  # 20 times the capacity, in batches
        ids = torch.arange(start, start + 500, dtype=torch.float32)
        memory.add({"id": ids, "weight": torch.ones(500)}, generator)
    assert len(memory) == 1_000 and memory.seen == 20_000
    kept = memory.fields["id"][: len(memory)]
    assert len(set(kept.tolist())) == 1_000  # no sample kept twice
    # Each of the 20,000 samples is kept with probability 1/20: every quarter of them holds
    # about 250 of the 1,000 rows (binomial standard deviation 13.7; 5 sigma allowed).
    quarters = torch.bincount((kept // 5_000).long(), minlength=4)
    assert ((quarters - 250).abs() < 70).all(), quarters


def test_reservoir_draws_rows_in_proportion_to_their_weights():
    generator = torch.Generator().manual_seed(1)
    memory = Reservoir(capacity=10)
    memory.add({"id": torch.arange(4.0), "weight": torch.tensor([1.0, 2.0, 0.0, 7.0])}, generator)
    counts = torch.bincount(memory.sample(100_000, generator)["id"].long(), minlength=4)
    assert counts[2] == 0
    assert np.allclose(counts.numpy() / 100_000, [0.1, 0.2, 0.0, 0.7], atol=0.01)


def test_a_response_to_a_fixed_opponent_reaches_the_best_response_value():
    """Only player 0 learns; player 1's advantage network outputs zeros, so it plays uniformly.
    Against a fixed opponent the average regret of the best action stays ahead of the others',
    and Hedge's growing inverse temperature turns that lead into a best response: the current
    strategy's exact value must come within 0.01 of the exact best-response value (Kuhn,
    player 0 against uniform play: 0.5)."""
    settings = NeuralCFRSettings(**SMALL, traversals=200, advantage_steps=40, policy_steps=0)
    solver = NeuralCFR("kuhn_poker", settings)
    for parameter in solver.advantage[1].parameters():
        parameter.data.zero_()
    for _ in range(30):
        solver.iterate(learners=(0,))
    tree = build_tree("kuhn_poker")
    learned = tabularize(solver.current_strategy(0), tree, 0)
    uniform = tree.players[1].uniform_policy()
    reaches = [sequence_reach(tree.players[0], learned[None])[0], sequence_reach(tree.players[1], uniform[None])[0]]
    best_value, _ = best_response(tree, 0, reaches)
    assert best_value == pytest.approx(0.5)
    assert profile_values(tree, reaches)[0] == pytest.approx(best_value, abs=0.01)


# Kuhn poker's second player has one equilibrium strategy (Kuhn 1950): facing a bet, call with
# the queen 1/3 of the time, never with the jack, always with the king; after a check, bet the
# jack 1/3 of the time, never the queen, always the king. Information states: card, then history.
KUHN_SECOND_PLAYER = {"0b": 0.0, "1b": 1 / 3, "2b": 1.0, "0p": 1 / 3, "1p": 0.0, "2p": 1.0}


def test_a_short_kuhn_run_reaches_the_equilibrium():
    """40 iterations (a few seconds on an unloaded core): the average-policy networks must be
    0.03-exploitable (seeds 0-2 gave 0.015-0.027), worth Kuhn's game value -1/18 to the first
    player within 0.01, and play the second player's unique equilibrium strategy within 0.15 at
    every information state (seeds 0-2 were within 0.1)."""
    solver = NeuralCFR("kuhn_poker", NeuralCFRSettings(**SMALL, traversals=300, advantage_steps=40, policy_steps=40))
    for _ in range(40):
        solver.iterate()
    report = exact_exploitability("kuhn_poker", solver.members())
    assert report.exploitability < 0.03
    assert report.mixture_values[0] == pytest.approx(-1 / 18, abs=0.01)
    tree = build_tree("kuhn_poker")
    second = tabularize(solver.members()[1], tree, 1)
    for infostate, bet_probability in KUHN_SECOND_PLAYER.items():
        row = tree.players[1].index[infostate]
        assert second[row, 1] == pytest.approx(bet_probability, abs=0.15), infostate


def test_a_run_restored_from_a_checkpoint_continues_identically():
    settings = NeuralCFRSettings(**SMALL, traversals=100, advantage_steps=10, policy_steps=10, seed=3)
    uninterrupted = NeuralCFR("leduc_poker", settings)
    interrupted = NeuralCFR("leduc_poker", settings)
    for _ in range(3):
        uninterrupted.iterate()
        interrupted.iterate()
    saved = io.BytesIO()
    torch.save(interrupted.state_dict(), saved)
    del interrupted
    saved.seek(0)
    restored = NeuralCFR.from_state_dict(torch.load(saved, weights_only=True))
    for _ in range(2):
        uninterrupted.iterate()
        restored.iterate()
    assert restored.iteration == uninterrupted.iteration == 5
    for a, b in zip(
        uninterrupted.state_dict()["advantage"] + uninterrupted.state_dict()["policy"],
        restored.state_dict()["advantage"] + restored.state_dict()["policy"],
    ):
        for name in a:
            assert torch.equal(a[name], b[name]), name


def test_unfit_games_and_settings_are_refused():
    with pytest.raises(GameError, match="two-player"):
        NeuralCFR("kuhn_poker(players=3)")
    with pytest.raises(GameError, match="zero-sum"):
        NeuralCFR("matrix_pd")
    with pytest.raises(pydantic.ValidationError, match="batch_size"):
        NeuralCFRSettings(batch_size=512, advantage_memory=100)


@pytest.mark.end_to_end
def test_the_shipped_config_through_psro_run_on_kuhn(tmp_path):
    """`psro run --config configs/leduc_neural.yaml --game kuhn_poker` (the shipped settings,
    only the game and the length changed), through the flow, Ray and MLflow: 10 iterations end
    at most 0.06 exploitable (seed 0 gave 0.043). The export passes OpenSpiel's own check
    (`scripts/verify_export.py`: `exploitability.nash_conv` on the members' tables), and the
    registered members load as weights-only networks whose exploitability is the one reported."""
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    import mlflow
    from processes import prefect_home

    from flows.tracking.registry_members import load_member, parse_member

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_", "PSRO_"))}
    env["PREFECT_HOME"] = str(prefect_home(tmp_path / "prefect-home"))
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = [str(Path(sys.executable).with_name("psro")), "run", "--config", str(root / "configs/leduc_neural.yaml")]
    command += ["--game", "kuhn_poker", "--rounds", "2", "--iterations-per-round", "5", "--num-cpus", "2"]
    command += ["--tracking-uri", store, "--export", str(tmp_path / "export")]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reported = float(re.search(r"^done: 2 rounds \(10 iterations\), exploitability (\S+) in", done.stdout, re.M)[1])
    assert reported <= 0.06

    checked = subprocess.run(
        [sys.executable, str(root / "scripts/verify_export.py"), str(tmp_path / "export")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0 and "OK: reported NashConv matches OpenSpiel" in checked.stdout, checked.stdout
    summary = json.loads((tmp_path / "export" / "summary.json").read_text())
    assert summary["exploitability"] == pytest.approx(reported, abs=5e-5) and summary["iterations"] == 10

    client = mlflow.MlflowClient(tracking_uri=store, registry_uri=store)
    members = [load_member(client, parse_member(f"leduc-neural-kuhn_poker-player_{p}@newest")).policy for p in (0, 1)]
    assert all(m.algorithm == "average_policy" and m.table is not None for m in members)
    measured = exact_exploitability("kuhn_poker", [m.network for m in members])
    assert measured.exploitability == pytest.approx(reported, abs=5e-5)
