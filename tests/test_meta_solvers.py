"""Meta-solvers against games with known answers and against OpenSpiel's own implementations."""

from __future__ import annotations

import itertools

import mpmath
import numpy as np
import pytest
from open_spiel.python.algorithms import projected_replicator_dynamics as openspiel_prd
from open_spiel.python.egt import alpharank as openspiel_alpharank

from marl_core.empirical_game import meta_solvers
from marl_core.empirical_game.meta_solvers import (
    META_SOLVERS,
    MetaSolverError,
    alpharank,
    check_meta_solver,
    get_meta_solver,
    nash_zero_sum,
    projected_replicator_dynamics,
)

ALL = sorted(META_SOLVERS)
GENERAL = [name for name in ALL if not META_SOLVERS[name].two_player_zero_sum_only]
LEARNING = ["prd", "fictitious_play", "regret_matching"]  # iterative, approximate solvers
SELECTIVE = [name for name in ALL if name not in ("uniform", "last")]  # react to payoffs

ROCK_PAPER_SCISSORS = np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]])
# Antisymmetric, so symmetric zero-sum; the row mix making all columns equal is (1, 2, 1) / 4.
BIASED_RPS = np.array([[0.0, -1.0, 2.0], [1.0, 0.0, -1.0], [-2.0, 1.0, 0.0]])
BIASED_RPS_NASH = np.array([0.25, 0.5, 0.25])
# No saddle point. Row mix p: 3p - 2(1-p) = -p + (1-p)  ->  p = 3/7, value 1/7;
# column mix q: 3q - (1-q) = -2q + (1-q)  ->  q = 2/7.
BIASED_2X2 = np.array([[3.0, -1.0], [-2.0, 1.0]])


def zero_sum(matrix: np.ndarray) -> np.ndarray:
    return np.stack([matrix, -matrix])


def symmetric_sum_game(matrix: np.ndarray, players: int = 3) -> np.ndarray:
    """Each player gets the sum of ``matrix[own, other]`` over the other players."""
    k = len(matrix)
    payoffs = np.zeros((players,) + (k,) * players)
    for profile in itertools.product(range(k), repeat=players):
        for p in range(players):
            others = (q for q in range(players) if q != p)
            payoffs[(p,) + profile] = sum(matrix[profile[p], profile[q]] for q in others)
    return payoffs


def assert_valid(strategies: list[np.ndarray], shape: tuple[int, ...]) -> None:
    assert len(strategies) == len(shape)
    for strategy, k in zip(strategies, shape):
        assert isinstance(strategy, np.ndarray) and strategy.dtype == np.float64
        assert strategy.shape == (k,)
        assert np.all(strategy >= 0.0)
        assert abs(strategy.sum() - 1.0) <= 1e-12


def marginals(joint: np.ndarray) -> list[np.ndarray]:
    n = joint.ndim
    return [joint.sum(axis=tuple(q for q in range(n) if q != p)) for p in range(n)]


# --- registry and errors -----------------------------------------------------------------------


def test_registry_holds_the_seven_solvers_with_one_line_summaries():
    assert ALL == ["alpharank", "fictitious_play", "last", "nash", "prd", "regret_matching", "uniform"]
    for name, solver in META_SOLVERS.items():
        assert solver.name == name
        assert solver.summary and "\n" not in solver.summary
        assert callable(solver.solve)
        assert solver.two_player_zero_sum_only == (name == "nash")
    assert get_meta_solver("prd") is META_SOLVERS["prd"]


def test_unknown_name_gives_one_line_error():
    with pytest.raises(MetaSolverError) as info:
        get_meta_solver("nashh")
    assert str(info.value) == (
        "unknown meta-solver 'nashh'; choose one of: alpharank, fictitious_play, last, nash, prd, "
        "regret_matching, uniform"
    )
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "players, zero_sum, wording",
    [(3, True, "3 players and zero-sum utility"), (2, False, "2 players and general-sum utility")],
)
def test_nash_is_refused_outside_two_player_zero_sum(players, zero_sum, wording):
    with pytest.raises(MetaSolverError) as info:
        check_meta_solver("nash", players, zero_sum)
    message = str(info.value)
    assert "\n" not in message
    assert "'nash'" in message and wording in message
    assert message.endswith("choose one of: alpharank, fictitious_play, last, prd, regret_matching, uniform")


def test_check_accepts_fitting_solvers():
    assert check_meta_solver("nash", 2, True) is META_SOLVERS["nash"]
    for name in GENERAL:
        assert check_meta_solver(name, 3, False) is META_SOLVERS[name]
    with pytest.raises(MetaSolverError, match="unknown meta-solver"):
        check_meta_solver("exp3", 2, True)


def test_nash_solve_on_three_players_and_malformed_tables_raise():
    with pytest.raises(MetaSolverError, match="two-player"):
        nash_zero_sum(np.zeros((3, 2, 2, 2)))
    with pytest.raises(MetaSolverError, match="not \\[n_players"):
        META_SOLVERS["uniform"].solve(np.zeros((3, 2, 2)))
    with pytest.raises(MetaSolverError, match="NaN"):
        META_SOLVERS["prd"].solve(np.full((2, 2, 2), np.nan))


# --- output format -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_rectangular_two_player_tables_give_valid_distributions(name):
    payoffs = np.random.default_rng(0).uniform(-1, 1, (2, 3, 5))
    assert_valid(META_SOLVERS[name].solve(payoffs), (3, 5))


@pytest.mark.parametrize("name", GENERAL)
def test_rectangular_three_player_tables_give_valid_distributions(name):
    payoffs = np.random.default_rng(1).uniform(-1, 1, (3, 2, 3, 4))
    assert_valid(META_SOLVERS[name].solve(payoffs), (2, 3, 4))


@pytest.mark.parametrize("name", ALL)
def test_single_member_populations_and_constant_tables(name):
    assert_valid(META_SOLVERS[name].solve(np.ones((2, 1, 1))), (1, 1))
    strategies = META_SOLVERS[name].solve(np.zeros((2, 2, 4)))
    assert_valid(strategies, (2, 4))


def test_uniform_and_last_are_exact():
    payoffs = np.random.default_rng(2).normal(size=(3, 2, 3, 5))
    for strategy, k in zip(META_SOLVERS["uniform"].solve(payoffs), (2, 3, 5)):
        np.testing.assert_array_equal(strategy, np.full(k, 1.0 / k))
    for strategy, k in zip(META_SOLVERS["last"].solve(payoffs), (2, 3, 5)):
        np.testing.assert_array_equal(strategy, np.eye(k)[-1])


# --- zero-sum games with known equilibria ------------------------------------------------------


def test_nash_rock_paper_scissors_is_exactly_uniform():
    for strategy in nash_zero_sum(zero_sum(ROCK_PAPER_SCISSORS)):
        np.testing.assert_allclose(strategy, np.full(3, 1 / 3), atol=1e-8)


def test_nash_matching_pennies_and_biased_2x2():
    pennies = np.array([[1.0, -1.0], [-1.0, 1.0]])
    for strategy in nash_zero_sum(zero_sum(pennies)):
        np.testing.assert_allclose(strategy, [0.5, 0.5], atol=1e-8)

    row, column = nash_zero_sum(zero_sum(BIASED_2X2))
    np.testing.assert_allclose(row, [3 / 7, 4 / 7], atol=1e-8)
    np.testing.assert_allclose(column, [2 / 7, 5 / 7], atol=1e-8)
    assert row @ BIASED_2X2 @ column == pytest.approx(1 / 7, abs=1e-8)


def test_nash_uses_the_zero_sum_part_of_a_sampled_table():
    """A common shift and symmetric noise (as from sampled returns) leave (p0 - p1) / 2 alone."""
    noise = np.random.default_rng(3).normal(scale=0.3, size=BIASED_2X2.shape)
    payoffs = np.stack([BIASED_2X2 + 5.0 + noise, -BIASED_2X2 + 5.0 + noise])
    row, column = nash_zero_sum(payoffs)
    np.testing.assert_allclose(row, [3 / 7, 4 / 7], atol=1e-8)
    np.testing.assert_allclose(column, [2 / 7, 5 / 7], atol=1e-8)


@pytest.mark.parametrize("seed, shape", [(0, (20, 20)), (1, (20, 20)), (2, (20, 20)), (3, (20, 30))])
def test_nash_admits_no_profitable_pure_deviation(seed, shape):
    matrix = np.random.default_rng(seed).uniform(-1, 1, shape)
    row, column = nash_zero_sum(zero_sum(matrix))
    value = row @ matrix @ column
    assert (matrix @ column).max() <= value + 1e-8  # no row does better against the column mix
    assert (row @ matrix).min() >= value - 1e-8  # no column concedes less against the row mix


def test_nash_solves_a_150_member_meta_game_exactly():
    """The size of a long Leduc run; the interior-point solve must still be an equilibrium."""
    matrix = np.random.default_rng(4).uniform(-1, 1, (150, 150))
    row, column = nash_zero_sum(zero_sum(matrix))
    value = row @ matrix @ column
    assert (matrix @ column).max() <= value + 1e-7
    assert (row @ matrix).min() >= value - 1e-7


@pytest.mark.parametrize("name", LEARNING)
def test_learning_solvers_find_uniform_rock_paper_scissors(name):
    for strategy in META_SOLVERS[name].solve(zero_sum(ROCK_PAPER_SCISSORS)):
        np.testing.assert_allclose(strategy, np.full(3, 1 / 3), atol=0.02)


@pytest.mark.parametrize("name", LEARNING + ["nash"])
def test_biased_rock_paper_scissors_equilibrium(name):
    tolerance = 1e-8 if name == "nash" else 0.025
    for strategy in META_SOLVERS[name].solve(zero_sum(BIASED_RPS)):
        np.testing.assert_allclose(strategy, BIASED_RPS_NASH, atol=tolerance)


def test_alpharank_rock_paper_scissors_is_uniform():
    for strategy in alpharank(zero_sum(ROCK_PAPER_SCISSORS)):
        np.testing.assert_allclose(strategy, np.full(3, 1 / 3), atol=1e-10)


# --- dominated strategies ----------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in SELECTIVE if n != "nash"])
def test_prisoners_dilemma_defects(name):
    # Member 0 cooperates, member 1 defects; defecting strictly dominates for both players.
    reward = np.array([[3.0, 0.0], [5.0, 1.0]])
    payoffs = np.stack([reward, reward.T])
    for strategy in META_SOLVERS[name].solve(payoffs):
        assert strategy[1] >= 0.99


@pytest.mark.parametrize("name", SELECTIVE)
def test_strictly_dominated_members_get_no_weight(name):
    # Row 2 is worse than both other rows in every column; column 2 concedes more than both
    # other columns against every row. Without them the game is BIASED_2X2. (Worse than *every*
    # alternative matters for alpha-Rank: it follows better-response moves, so a member beaten
    # by only some others can still be reached from a member that is worse still.)
    matrix = np.array([[3.0, -1.0, 4.0], [-2.0, 1.0, 2.0], [-3.0, -2.0, 0.0]])
    row, column = META_SOLVERS[name].solve(zero_sum(matrix))
    assert row[2] <= 0.01 and column[2] <= 0.01
    if name == "nash":
        np.testing.assert_allclose(row, [3 / 7, 4 / 7, 0.0], atol=1e-8)
        np.testing.assert_allclose(column, [2 / 7, 5 / 7, 0.0], atol=1e-8)


# --- three players -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in SELECTIVE if n != "nash"])
def test_three_player_strictly_dominant_profile(name):
    # Member 1 earns every player at least 2 more than any other member, whatever the others do.
    rng = np.random.default_rng(5)
    payoffs = rng.uniform(0, 1, (3, 3, 3, 3))
    for p in range(3):
        index = [slice(None)] * 3
        index[p] = 1
        payoffs[p][tuple(index)] += 2.0
    for strategy in META_SOLVERS[name].solve(payoffs):
        assert strategy[1] >= 0.99


@pytest.mark.parametrize("name", LEARNING + ["alpharank"])
def test_symmetric_three_player_rock_paper_scissors_is_uniform(name):
    # Uniform is the only symmetric equilibrium: (x, x, x) leaves every member indifferent only
    # if RPS x is constant, i.e. x uniform; alpha-Rank is uniform by the game's cyclic symmetry.
    tolerance = 1e-10 if name == "alpharank" else 0.02
    for strategy in META_SOLVERS[name].solve(symmetric_sum_game(ROCK_PAPER_SCISSORS)):
        np.testing.assert_allclose(strategy, np.full(3, 1 / 3), atol=tolerance)


@pytest.mark.parametrize("name", LEARNING)
def test_symmetric_three_player_biased_rps_equilibrium(name):
    # Pairwise zero-sum, and (x, x, x) is an equilibrium only if BIASED_RPS x = 0.
    for strategy in META_SOLVERS[name].solve(symmetric_sum_game(BIASED_RPS)):
        np.testing.assert_allclose(strategy, BIASED_RPS_NASH, atol=0.025)


# --- alpha-Rank specifics ----------------------------------------------------------------------


def test_alpharank_equal_fitness_limit_is_uniform():
    for strategy in alpharank(np.zeros((3, 2, 3, 4))):
        np.testing.assert_allclose(strategy, np.full(len(strategy), 1 / len(strategy)), atol=1e-12)


def test_alpharank_picks_the_risk_dominant_equilibrium_where_rates_underflow():
    # Stag hunt: (stag, stag) pays more, (hare, hare) is the harder one to leave. With alpha=100
    # the escape rates (e^-4900 and worse) underflow; OpenSpiel reports two stationary vectors.
    stag_hunt = np.array([[4.0, 0.0], [3.0, 3.0]])
    with np.errstate(over="raise", invalid="raise"):  # underflow to 0 is expected and fine
        row, column = alpharank(np.stack([stag_hunt, stag_hunt.T]))
    np.testing.assert_allclose(row, [0.0, 1.0], atol=1e-12)
    np.testing.assert_allclose(column, [0.0, 1.0], atol=1e-12)


def test_alpharank_coordination_game_prefers_the_hardest_to_leave_equilibrium():
    gains = np.array([0.5, 0.9, 0.7, 0.6])
    for strategy in alpharank(np.stack([np.diag(gains), np.diag(gains)])):
        assert strategy.argmax() == 1 and strategy[1] > 0.99
    symmetric = alpharank(np.stack([np.eye(4), np.eye(4)]))
    for strategy in symmetric:
        np.testing.assert_allclose(strategy, np.full(4, 0.25), atol=1e-9)


def high_precision_alpharank(payoffs: np.ndarray, alpha: float, m: int) -> list[np.ndarray]:
    """alpha-Rank marginals from a 400-digit linear solve of pi Q = 0 (small games only)."""
    mpmath.mp.dps = 400
    shape = payoffs.shape[1:]
    profiles = list(itertools.product(*map(range, shape)))
    index = {profile: i for i, profile in enumerate(profiles)}
    n = len(profiles)
    generator = mpmath.zeros(n, n)
    for s in profiles:
        for p, k in enumerate(shape):
            for member in range(k):
                if member == s[p]:
                    continue
                t = s[:p] + (member,) + s[p + 1 :]
                u = mpmath.mpf(alpha) * (mpmath.mpf(payoffs[p][t]) - mpmath.mpf(payoffs[p][s]))
                if u == 0:
                    rho = 1 / mpmath.mpf(m)
                else:
                    rho = (1 - mpmath.exp(-u)) / (1 - mpmath.exp(-m * u))
                generator[index[s], index[t]] += rho
                generator[index[s], index[s]] -= rho
    system = generator.T
    for j in range(n):
        system[n - 1, j] = 1  # replace one balance equation by sum(pi) = 1
    rhs = mpmath.zeros(n, 1)
    rhs[n - 1] = 1
    joint = np.array([float(x) for x in mpmath.lu_solve(system, rhs)]).reshape(shape)
    return marginals(joint)


@pytest.mark.parametrize("seed", [6, 213, 281])
def test_alpharank_is_exact_on_nearly_separate_basins(seed):
    # Two pure equilibria joined only by ~e^-100 transitions: OpenSpiel's eigen-solver reports
    # two stationary vectors for these, yet the true split between them is far from 0/1.
    payoffs = np.random.default_rng(seed).uniform(0, 1, (2, 3, 3))
    expected = high_precision_alpharank(payoffs, alpha=3.0, m=50)
    assert all(np.sort(strategy)[-2] > 0.1 for strategy in expected)
    for mine, theirs in zip(alpharank(payoffs, alpha=3.0), expected):
        np.testing.assert_allclose(mine, theirs, atol=1e-12)


def test_alpharank_large_table_path_matches_exact_path(monkeypatch):
    # 900 profiles: above the exact limit, so split at _FAST_RATE and solved with GMRES.
    payoffs = zero_sum(np.random.default_rng(6).uniform(-1, 1, (30, 30)))
    large = alpharank(payoffs, alpha=10.0)
    monkeypatch.setattr(meta_solvers, "_EXACT_LIMIT", 10**6)
    exact = alpharank(payoffs, alpha=10.0)
    for a, b in zip(large, exact):
        np.testing.assert_allclose(a, b, atol=1e-9)


@pytest.mark.parametrize(
    "shape, alpha",
    [((2, 4, 5), 1.0), ((2, 4, 5), 5.0), ((3, 3, 3, 4), 1.0), ((3, 3, 3, 4), 5.0)],
)
def test_alpharank_matches_openspiel(shape, alpha):
    rng = np.random.default_rng(int(alpha) + len(shape))
    for _ in range(2):
        payoffs = rng.uniform(0, 1, shape)
        _, _, joint, _, _ = openspiel_alpharank.compute(list(payoffs), m=50, alpha=alpha)
        expected = marginals(joint.reshape(shape[1:]))
        for mine, theirs in zip(alpharank(payoffs, alpha=alpha, population_size=50), expected):
            np.testing.assert_allclose(mine, theirs, atol=1e-9)


# --- projected replicator dynamics specifics ---------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 5, 5), (3, 4, 4, 4)])
def test_prd_matches_openspiel(shape):
    payoffs = np.random.default_rng(7).uniform(0, 1, shape)
    payoffs = (payoffs - payoffs.min()) / np.ptp(payoffs)  # range 1: our dt equals theirs
    k, gamma = shape[1], 1e-3
    expected = openspiel_prd.projected_replicator_dynamics(
        list(payoffs),
        prd_iterations=1000,
        prd_dt=0.1,
        prd_gamma=gamma / k,  # OpenSpiel's floor is gamma itself, ours gamma / k
        average_over_last_n_strategies=600,
    )
    mine = projected_replicator_dynamics(payoffs, iterations=1000, dt=0.1, gamma=gamma, average_over_last=600)
    for a, b in zip(mine, expected):
        np.testing.assert_allclose(a, b, atol=1e-9)


def test_prd_is_invariant_to_payoff_scale_and_shift():
    payoffs = np.random.default_rng(8).uniform(-1, 1, (2, 6, 6))
    base = projected_replicator_dynamics(payoffs, iterations=500)
    moved = projected_replicator_dynamics(payoffs * 40.0 + 7.0, iterations=500)
    for a, b in zip(base, moved):
        np.testing.assert_allclose(a, b, atol=1e-9)


def test_prd_keeps_the_exploration_floor():
    reward = np.array([[3.0, 0.0], [5.0, 1.0]])
    cooperate = projected_replicator_dynamics(np.stack([reward, reward.T]), gamma=1e-3)[0][0]
    assert cooperate == pytest.approx(1e-3 / 2, rel=0.05)


def test_nash_returns_the_central_equilibrium_when_members_are_duplicated():
    """PSRO often re-adds a member equal to an old one; the central solution splits the weight
    between copies instead of picking one copy (a vertex of the optimal face)."""
    rps = np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]])
    with_copy = rps[[0, 0, 1, 2]][:, [0, 1, 1, 2]]  # row 0 and column 1 duplicated
    rows, columns = get_meta_solver("nash").solve(np.stack([with_copy, -with_copy]))
    np.testing.assert_allclose(rows, [1 / 6, 1 / 6, 1 / 3, 1 / 3], atol=1e-6)
    np.testing.assert_allclose(columns, [1 / 3, 1 / 6, 1 / 6, 1 / 3], atol=1e-6)


def test_prd_stays_a_distribution_when_a_player_only_loses():
    """Payoffs all negative for one player (as in MPE's simple_adversary): the replicator step's
    rounding drift in the strategy's sum must not compound into NaN over thousands of steps."""
    payoffs = np.array(
        [
            [[-27.96501073, -26.65512414], [-24.59889871, -25.87606549]],
            [[6.29311662, 9.47493478], [3.94763056, 7.93680652]],
        ]
    )
    for strategy in META_SOLVERS["prd"].solve(payoffs):
        assert np.all(np.isfinite(strategy)) and np.all(strategy >= 0)
        assert strategy.sum() == pytest.approx(1.0, abs=1e-12)
