"""Meta-solvers: turn a PSRO meta-game (the payoff table between population members) into a
meta-strategy, one probability vector per player over that player's population.

Every solver takes ``payoffs`` of shape ``[n_players, k_0, ..., k_{n-1}]`` where
``payoffs[p][i_0, ..., i_{n-1}]`` is player p's expected return when each player q plays its
population member ``i_q``, and returns n float64 vectors (vector p has length ``k_p``, entries
>= 0, summing to 1). Solvers are looked up by name in ``META_SOLVERS``; ``check_meta_solver``
rejects a solver that cannot handle the game before any training starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import highspy
import numpy as np
import scipy.sparse
import scipy.sparse.linalg
from scipy.sparse import csgraph

from marl_core.registry import Registry

SolveFn = Callable[[np.ndarray], list[np.ndarray]]


@dataclasses.dataclass(frozen=True)
class MetaSolver:
    name: str
    summary: str  # one line, shown by the `psro solvers` CLI command
    solve: SolveFn
    two_player_zero_sum_only: bool = False


class MetaSolverError(ValueError):
    """An unknown meta-solver, one that does not fit the game, or a malformed payoff table."""


META_SOLVERS: Registry[MetaSolver] = Registry("meta-solver", MetaSolverError)  # filled at the end of this module


def get_meta_solver(name: str) -> MetaSolver:
    return META_SOLVERS[name]


def check_meta_solver(name: str, num_players: int, zero_sum: bool) -> MetaSolver:
    """Look up ``name`` and make sure it can solve meta-games of this game, so that a bad
    choice fails at configuration time rather than after the first (expensive) PSRO iteration."""
    solver = get_meta_solver(name)
    if solver.two_player_zero_sum_only and not (num_players == 2 and zero_sum):
        fitting = sorted(s.name for s in META_SOLVERS.values() if not s.two_player_zero_sum_only)
        utility = "zero-sum" if zero_sum else "general-sum"
        raise MetaSolverError(
            f"meta-solver {name!r} needs a two-player zero-sum game, but this game has "
            f"{num_players} players and {utility} utility; choose one of: {', '.join(fitting)}"
        )
    return solver


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def _payoff_tensor(payoffs: np.ndarray) -> np.ndarray:
    """Return ``payoffs`` as a float64 array after checking its ``[n, k_0, ..., k_{n-1}]`` shape,
    so that a malformed table fails with a clear message instead of a broadcasting error."""
    table = np.asarray(payoffs, dtype=np.float64)
    if table.ndim < 2 or table.shape[0] != table.ndim - 1 or 0 in table.shape:
        raise MetaSolverError(f"payoff table of shape {table.shape} is not [n_players, k_0, ..., k_(n-1)]")
    if not np.all(np.isfinite(table)):
        raise MetaSolverError("payoff table contains NaN or infinite entries")
    return table


def _normalise(weights: np.ndarray) -> np.ndarray:
    """Clip round-off negatives and rescale to sum to 1 (callers rely on a valid simplex point;
    solvers only get there up to floating-point error)."""
    weights = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
    return weights / weights.sum()


def _own_axis_first(payoffs: np.ndarray) -> list[np.ndarray]:
    """Player p's table with p's own axis moved to the front (others stay in player order), made
    contiguous once so that the iterative solvers' inner loop is a chain of plain matvecs."""
    return [np.ascontiguousarray(np.moveaxis(payoffs[p], p, 0)) for p in range(len(payoffs))]


def _action_values(own_first: np.ndarray, strategies: list[np.ndarray], player: int) -> np.ndarray:
    """Expected payoff of each of ``player``'s members against the others' mixed strategies.

    ``own_first`` is the player's table from ``_own_axis_first``; its trailing axes are the other
    players in order, so contracting from the last axis backwards visits them in reverse order.
    """
    values = own_first
    for other in reversed(range(len(strategies))):
        if other != player:
            values = values @ strategies[other]
    return values


def _all_action_values(tables: list[np.ndarray], strategies: list[np.ndarray]) -> list[np.ndarray]:
    return [_action_values(table, strategies, p) for p, table in enumerate(tables)]


def _uniform_strategies(shape: tuple[int, ...]) -> list[np.ndarray]:
    return [np.full(k, 1.0 / k) for k in shape]


# ---------------------------------------------------------------------------------------------
# Trivial meta-solvers
# ---------------------------------------------------------------------------------------------


def uniform(payoffs: np.ndarray) -> list[np.ndarray]:
    return _uniform_strategies(_payoff_tensor(payoffs).shape[1:])


def last(payoffs: np.ndarray) -> list[np.ndarray]:
    strategies = []
    for k in _payoff_tensor(payoffs).shape[1:]:
        strategy = np.zeros(k)
        strategy[-1] = 1.0
        strategies.append(strategy)
    return strategies


# ---------------------------------------------------------------------------------------------
# Nash by linear programming (two-player zero-sum)
# ---------------------------------------------------------------------------------------------


def _maximin_strategies(matrix: np.ndarray) -> list[np.ndarray]:
    """Both players' optimal strategies in the zero-sum game where the row player receives
    ``matrix`` and the column player pays it.

    The row player's LP over (x, v) is: maximise v subject to x^T matrix[:, j] >= v for every
    column j and x in the simplex. Its dual is exactly the column player's LP, so one solve
    gives both: the row multipliers are the column player's optimal strategy.

    Which equilibrium: meta-games are full of ties (best responses that equal old members, or
    that differ only where the opponent never goes), so the optimal face is usually large.
    A simplex solver returns one of its vertices, which mixes as few members as possible. An
    interior-point solve with crossover turned off returns a point near the centre of the
    face instead, mixing every member that some equilibrium uses. PSRO converges in fewer
    iterations from those broader mixtures: on Leduc poker, exploitability 0.1 was first
    reached at iteration 76 instead of 111 (0.5 at 27 instead of 36). Presolve is off because
    it merges duplicate members and hands all their weight back to one copy.
    """
    rows, cols = matrix.shape
    solver = highspy.Highs()
    for option, value in (
        ("output_flag", False),
        ("solver", "ipm"),
        ("run_crossover", "off"),
        ("presolve", "off"),
        ("threads", 1),
    ):
        solver.setOptionValue(option, value)
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = rows + 1, cols + 1
    lp.col_cost_ = np.append(np.zeros(rows), -1.0)  # minimise -v
    lp.col_lower_ = np.append(np.zeros(rows), -inf)
    lp.col_upper_ = np.full(rows + 1, inf)
    constraints = np.vstack(
        [
            np.hstack([matrix.T, -np.ones((cols, 1))]),  # x^T matrix[:, j] - v >= 0
            np.append(np.ones(rows), 0.0)[None, :],  # sum x = 1
        ]
    )
    lp.row_lower_ = np.append(np.zeros(cols), 1.0)
    lp.row_upper_ = np.append(np.full(cols, inf), 1.0)
    sparse = scipy.sparse.csc_matrix(constraints)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = sparse.indptr, sparse.indices, sparse.data
    solver.passModel(lp)
    solver.run()
    status = solver.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:  # not expected: feasible and bounded
        raise MetaSolverError(f"nash linear program failed: {solver.modelStatusToString(status)}")
    solution = solver.getSolution()
    row_strategy = np.asarray(solution.col_value)[:rows]
    column_strategy = np.abs(np.asarray(solution.row_dual)[:cols])
    return [_normalise(row_strategy), _normalise(column_strategy)]


def nash_zero_sum(payoffs: np.ndarray) -> list[np.ndarray]:
    """Exact Nash equilibrium of a two-player zero-sum meta-game.

    Sampled meta-game entries are only zero-sum in expectation, so the game solved is the
    zero-sum part ``A = (payoffs[0] - payoffs[1]) / 2``; for an exactly zero-sum table A is
    simply player 0's payoff.
    """
    payoffs = _payoff_tensor(payoffs)
    if payoffs.shape[0] != 2:
        raise MetaSolverError(f"meta-solver 'nash' needs a two-player zero-sum game, got {payoffs.shape[0]} players")
    return _maximin_strategies((payoffs[0] - payoffs[1]) / 2.0)


# ---------------------------------------------------------------------------------------------
# Projected replicator dynamics (Lanctot et al. 2017)
# ---------------------------------------------------------------------------------------------


def _project_onto_floored_simplex(point: np.ndarray, floor: float) -> np.ndarray:
    """Euclidean projection onto {x : x_i >= floor, sum(x) = 1}.

    Shifting by ``floor`` turns this into the standard projection onto a scaled simplex, solved
    in O(k log k) by sorting (Wang & Carreira-Perpinan 2013, as in OpenSpiel's PRD).
    """
    if point.min() >= floor:
        # The common case. A replicator step keeps the sum at 1 only in exact arithmetic; its
        # rounding error grows by (1 - dt x.v) per step, which explodes over thousands of steps
        # where every payoff of a player is negative, so the sum is restored here.
        return point / point.sum()
    shifted = point - floor
    mass = 1.0 - floor * len(point)
    descending = np.sort(shifted)[::-1]
    excess = descending.cumsum() - mass
    support = np.count_nonzero(descending * np.arange(1, len(point) + 1) > excess)
    threshold = excess[support - 1] / support
    return np.maximum(shifted - threshold, 0.0) + floor


def projected_replicator_dynamics(
    payoffs: np.ndarray,
    iterations: int = 3000,
    dt: float = 0.1,
    gamma: float = 1e-6,
    average_over_last: int = 2250,
) -> list[np.ndarray]:
    """Projected replicator dynamics for n-player general-sum meta-games.

    Euler steps of the replicator equation x_i += dt * x_i * (v_i - x.v), each followed by a
    projection onto the simplex whose entries are at least ``gamma / k``: the floor keeps every
    member in play (a strategy at 0 could never recover) and is PRD's exploration term. As in
    OpenSpiel, the result is the average over the last ``average_over_last`` points of the
    trajectory (which starts at uniform), which damps the cycling replicator dynamics show
    around mixed equilibria; leaving out the early transient helps in games that converge.

    Payoffs are divided by their range (max - min over the whole table), so ``dt`` is measured
    in payoff ranges and the same defaults behave alike for rewards in [-1, 1] or [0, 100].
    """
    payoffs = _payoff_tensor(payoffs)
    spread = np.ptp(payoffs)
    tables = _own_axis_first(payoffs / spread if spread > 0 else payoffs)
    strategies = _uniform_strategies(payoffs.shape[1:])
    floors = [gamma / len(s) for s in strategies]
    average_from = iterations + 1 - average_over_last  # trajectory points 0..iterations
    totals = [s.copy() if average_from <= 0 else np.zeros_like(s) for s in strategies]
    for step in range(1, iterations + 1):
        values = _all_action_values(tables, strategies)
        strategies = [
            _project_onto_floored_simplex(x + dt * x * (v - x @ v), floor)
            for x, v, floor in zip(strategies, values, floors)
        ]
        if step >= average_from:
            for total, x in zip(totals, strategies):
                total += x
    return [_normalise(total) for total in totals]


# ---------------------------------------------------------------------------------------------
# Fictitious play and regret matching
# ---------------------------------------------------------------------------------------------


def fictitious_play(payoffs: np.ndarray, iterations: int = 5000) -> list[np.ndarray]:
    """Simultaneous fictitious play for n-player meta-games; returns the empirical averages.

    Each round every player best-responds to the empirical (average) strategies of the others,
    starting from uniform beliefs. Only best responses enter the average, so a strictly
    dominated member, never a best response, ends with exactly zero weight.
    """
    payoffs = _payoff_tensor(payoffs)
    tables = _own_axis_first(payoffs)
    averages = _uniform_strategies(payoffs.shape[1:])
    for round_ in range(1, iterations + 1):
        best = [np.argmax(v) for v in _all_action_values(tables, averages)]
        for average, b in zip(averages, best):
            average *= 1.0 - 1.0 / round_  # the first round replaces the uniform belief
            average[b] += 1.0 / round_
    return [_normalise(a) for a in averages]


def _regret_matching_strategy(cumulative_regret: np.ndarray) -> np.ndarray:
    """Play in proportion to positive regret; uniform when no member has positive regret."""
    positive = np.maximum(cumulative_regret, 0.0)
    total = positive.sum()
    return positive / total if total > 0 else np.full(len(positive), 1.0 / len(positive))


def regret_matching(payoffs: np.ndarray, iterations: int = 5000) -> list[np.ndarray]:
    """Regret matching (Hart & Mas-Colell 2000) for n-player meta-games.

    All players update simultaneously from the same round's strategies, starting from
    uniform. The returned meta-strategy is the uniform average of the played strategies: the
    average, not the last iterate, is what converges (to Nash in two-player zero-sum games; in
    general the joint average approaches the coarse correlated equilibria).
    """
    payoffs = _payoff_tensor(payoffs)
    tables = _own_axis_first(payoffs)
    strategies = _uniform_strategies(payoffs.shape[1:])
    regrets = [np.zeros_like(s) for s in strategies]
    totals = [np.zeros_like(s) for s in strategies]
    for _ in range(iterations):
        values = _all_action_values(tables, strategies)
        for regret, total, x, v in zip(regrets, totals, strategies, values):
            regret += v - x @ v
            total += x
        strategies = [_regret_matching_strategy(r) for r in regrets]
    return [_normalise(total) for total in totals]


# ---------------------------------------------------------------------------------------------
# alpha-Rank (Omidshafiei et al. 2019)
# ---------------------------------------------------------------------------------------------

# Chains (and closed classes) up to this many profiles are solved exactly by GTH state
# reduction, O(size^3): 729 = 27^2 = 9^3 profiles (its time: docs/performance.md, "Meta-solvers").
_EXACT_LIMIT = 729
# Larger chains are split where transitions fall below this fraction of the fastest one.
_FAST_RATE = 1e-10


def _log_fixation_probability(fitness_gain: np.ndarray, population_size: int) -> np.ndarray:
    """log of the probability that one mutant with fitness advantage u = alpha * (f_r - f_s)
    takes over a population of m, rho(u) = (1 - e^-u) / (1 - e^-mu).

    Rewritten as e^{(m-1) min(u, 0)} * expm1(-|u|) / expm1(-m|u|) it neither overflows for large
    negative u nor loses precision for small |u|, and its log stays finite where rho itself
    underflows (alpha = 100 makes rho ~ e^-5000 routine). The equal-fitness limit u -> 0 is the
    neutral fixation probability 1/m.
    """
    m = population_size
    magnitude = np.abs(fitness_gain)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(magnitude > 0, np.expm1(-magnitude) / np.expm1(-m * magnitude), 1.0 / m)
    return (m - 1) * np.minimum(fitness_gain, 0.0) + np.log(ratio)


def _alpharank_transitions(
    payoffs: np.ndarray, alpha: float, population_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges (source, target, log rate) of alpha-Rank's Markov chain over pure profiles.

    Profiles are numbered in C order (as ``np.ravel`` and OpenSpiel do). From each profile, each
    player may switch to any other member of its population; the rate is the fixation
    probability of that mutant given the player's payoff gain. The common factor
    1 / sum_p (k_p - 1) and the self-loops are left out: neither changes the stationary
    distribution of the rate matrix.
    """
    shape = payoffs.shape[1:]
    profile_ids = np.arange(int(np.prod(shape))).reshape(shape)
    sources, targets, log_rates = [], [], []
    for player, k in enumerate(shape):
        own_last = np.moveaxis(payoffs[player], player, -1)  # [..., current member]
        ids = np.moveaxis(profile_ids, player, -1)
        switch = ~np.eye(k, dtype=bool)  # [current, new] pairs that change the profile
        gain = (own_last[..., None, :] - own_last[..., :, None])[..., switch]
        grid = ids.shape + (k,)
        sources.append(np.broadcast_to(ids[..., :, None], grid)[..., switch].ravel())
        targets.append(np.broadcast_to(ids[..., None, :], grid)[..., switch].ravel())
        log_rates.append(_log_fixation_probability(alpha * gain.ravel(), population_size))
    return np.concatenate(sources), np.concatenate(targets), np.concatenate(log_rates)


def _closed_classes(n: int, sources: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Label each state with its closed communicating class (0, 1, ...), or -1 if transient.

    Closed classes are the strongly connected components that no edge leaves.
    """
    graph = scipy.sparse.csr_matrix((np.ones(len(sources)), (sources, targets)), shape=(n, n))
    count, component = csgraph.connected_components(graph, directed=True, connection="strong")
    closed = np.ones(count, dtype=bool)
    closed[component[sources][component[sources] != component[targets]]] = False
    class_of_component = np.where(closed, np.cumsum(closed) - 1, -1)
    return class_of_component[component]


def _group_by(labels: np.ndarray, count: int) -> list[np.ndarray]:
    """Indices of ``labels`` equal to 0, 1, ..., count - 1 (label -1 is dropped), in O(n log n)
    rather than one full scan per label (games with 150 pure equilibria have 150 classes)."""
    if count == 1:  # the common case, and a sort of millions of edges saved
        return [np.flatnonzero(labels == 0)]
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(count + 1))
    return [order[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])]


def _reduce_states(rates: np.ndarray) -> np.ndarray:
    """Stationary distribution of an irreducible chain with dense off-diagonal ``rates``, by the
    Grassmann-Taksar-Heyman algorithm.

    It censors states one at a time (state k's flow is rerouted to where it would jump next),
    using only additions, multiplications and divisions of non-negative numbers. Unlike LU or
    eigen-solvers it is accurate entry by entry, so a chain with two nearly separate basins
    joined by e^-100 transitions still gets the right split between them.
    """
    rates = rates.copy()
    for k in range(len(rates) - 1, 0, -1):
        # Censor k: flow i -> k goes on to each j < k in proportion to k's rate to j.
        rates[:k, k] /= rates[k, :k].sum()
        rates[:k, :k] += np.outer(rates[:k, k], rates[k, :k])
    distribution = np.zeros(len(rates))
    distribution[0] = 1.0
    for k in range(1, len(rates)):  # balance of k in the chain censored to states 0..k
        distribution[k] = distribution[:k] @ rates[:k, k]
    return _normalise(distribution)


def _solve_by_gmres(size: int, sources: np.ndarray, targets: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """Stationary distribution of a large irreducible chain, by solving pi Q = 0 with one entry
    fixed to 1 using Jacobi-preconditioned GMRES (LU factors of a profile graph, a product of
    cliques, fill in completely).

    The fixed entry is the state with the smallest exit rate, the one likeliest to carry mass,
    which keeps the solved-for ratios moderate.
    """
    exit_rate = np.bincount(sources, weights=rates, minlength=size)
    anchor = int(np.argmin(exit_rate))
    # Unknowns are pi without the anchor's entry: states after the anchor move down one index.
    states = np.arange(size)
    unknown = states - (states > anchor)
    free = np.flatnonzero(states != anchor)
    from_anchor = sources == anchor
    kept = ~from_anchor & (targets != anchor)
    # Row j of pi Q = 0: inflow sum_i pi_i rate(i, j) equals outflow pi_j exit_rate(j).
    lhs = scipy.sparse.csr_matrix(
        (
            np.concatenate([rates[kept], -exit_rate[free]]),
            (
                np.concatenate([unknown[targets[kept]], unknown[free]]),
                np.concatenate([unknown[sources[kept]], unknown[free]]),
            ),
        ),
        shape=(size - 1, size - 1),
    )
    rhs = -np.bincount(unknown[targets[from_anchor]], weights=rates[from_anchor], minlength=size - 1)
    jacobi = scipy.sparse.diags(1.0 / exit_rate[free])
    solution, info = scipy.sparse.linalg.gmres(lhs, rhs, rtol=1e-12, M=jacobi, restart=100, maxiter=100)
    if info != 0:  # not seen in testing; exact, but slow for very large classes
        solution = scipy.sparse.linalg.spsolve(lhs.tocsc(), rhs)
    return _normalise(np.insert(solution, anchor, 1.0))


def _class_distribution(size: int, sources: np.ndarray, targets: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """Stationary distribution of one closed class, given its internal edges in local numbering:
    exact for small classes, GMRES for large ones."""
    if size == 1:
        return np.ones(1)
    if size <= _EXACT_LIMIT:
        dense = np.zeros((size, size))
        dense[sources, targets] = rates
        return _reduce_states(dense)
    return _solve_by_gmres(size, sources, targets, rates)


def _between_class_log_rates(
    owner: np.ndarray,
    classes: list[np.ndarray],
    within: list[np.ndarray],
    sources: np.ndarray,
    targets: np.ndarray,
    log_rates: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Log rates of the chain whose states are the closed classes (Freidlin-Wentzell reduction).

    The rate from class A to class B is approximated by its most likely route: leave A (flow
    pi_A(x) * rate(x, y) summed over A's states x), then jump through transient states, each
    jump y -> z taken with probability rate(y, z) / exit_rate(y), until a state of B is hit.
    That is a shortest path with costs -log(flow) and -log(jump probability), all in the log
    domain, so routes far below double precision (e^-5000) still compare correctly.

    Summing over all routes would be exact; taking the best one is off by about the number of
    comparable routes. Between classes this far apart (rates below e^-745, or _FAST_RATE in
    large tables) that factor is worth a payoff change of about log(routes) / (alpha (m - 1)),
    under 1e-3 at the defaults: well inside the sampling noise of a meta-game.
    """
    n, count = len(owner), len(classes)
    log_mass = np.full(n, -np.inf)
    with np.errstate(divide="ignore"):
        for states, distribution in zip(classes, within):
            log_mass[states] = np.log(distribution)

    transient = owner[sources] < 0
    log_exit = np.full(n, -np.inf)
    np.logaddexp.at(log_exit, sources, log_rates)
    jump_cost = np.maximum(log_exit[sources[transient]] - log_rates[transient], 0.0)

    leaving = (owner[sources] >= 0) & (owner[sources] != owner[targets])
    exit_keys = owner[sources[leaving]] * n + targets[leaving]  # (class A, outside state y)
    exits, exit_index = np.unique(exit_keys, return_inverse=True)
    log_flow = np.full(len(exits), -np.inf)
    np.logaddexp.at(log_flow, exit_index, log_mass[sources[leaving]] + log_rates[leaving])
    reachable = np.isfinite(log_flow)  # a state with zero mass inside its class sends nothing
    exits, log_flow = exits[reachable], log_flow[reachable]
    offset = log_flow.max()  # Dijkstra needs non-negative costs; added back below

    # Nodes 0..n-1 are profiles, n + A is a source node standing for class A.
    graph = scipy.sparse.csr_matrix(
        (
            np.concatenate([jump_cost, offset - log_flow]),
            (np.concatenate([sources[transient], n + exits // n]), np.concatenate([targets[transient], exits % n])),
        ),
        shape=(n + count, n + count),
    )
    distance = csgraph.dijkstra(graph, directed=True, indices=np.arange(n, n + count))
    log_rate = np.stack([offset - distance[:, states].min(axis=1) for states in classes], axis=1)
    np.fill_diagonal(log_rate, -np.inf)
    source, target = np.nonzero(np.isfinite(log_rate))
    return source, target, log_rate[source, target]


def _stationary_distribution(n: int, sources: np.ndarray, targets: np.ndarray, log_rates: np.ndarray) -> np.ndarray:
    """Stationary distribution of a continuous-time chain given by its edges' log rates.

    With alpha = 100 the rates span hundreds of orders of magnitude, many underflow to 0, and
    the chain then falls apart numerically into several closed classes (where OpenSpiel's
    eigen-solver reports "found 2 stationary distributions"). So:
    1. find the closed classes of the edges that count: every edge that did not underflow for
       chains up to _EXACT_LIMIT profiles, the edges within _FAST_RATE of the fastest beyond
       that (whose leftover, transient profiles are then given no mass; an approximation);
    2. solve each class's own stationary distribution (_class_distribution);
    3. with several classes, weigh them by the stationary distribution of the chain between
       classes (_between_class_log_rates), found by this same function; that chain has fewer
       closed classes than it has states, because its fastest edge joins or leaves a class.
    A small chain that stays in one piece is therefore solved exactly.
    """
    if n == 1:
        return np.ones(1)
    log_rates = log_rates - log_rates.max()
    rates = np.exp(log_rates)
    counted = rates > 0 if n <= _EXACT_LIMIT else rates >= _FAST_RATE
    owner = _closed_classes(n, sources[counted], targets[counted])
    count = owner.max() + 1
    classes = _group_by(owner, count)
    position = np.zeros(n, dtype=np.int64)  # index of each state inside its class
    for states in classes:
        position[states] = np.arange(len(states))
    internal = np.where(owner[sources] == owner[targets], owner[sources], -1)
    within = [
        _class_distribution(len(states), position[sources[e]], position[targets[e]], rates[e])
        for states, e in zip(classes, _group_by(internal, count))
    ]
    weights = np.ones(1)
    if count > 1:
        between = _between_class_log_rates(owner, classes, within, sources, targets, log_rates)
        weights = _stationary_distribution(count, *between)
    distribution = np.zeros(n)
    for states, local, weight in zip(classes, within, weights):
        distribution[states] = weight * local
    return distribution


def alpharank(payoffs: np.ndarray, alpha: float = 100.0, population_size: int = 50) -> list[np.ndarray]:
    """alpha-Rank (multi-population, n players); returns each player's marginal.

    The Markov chain runs over pure profiles: one population at a time adopts a single mutant
    member with its finite-population (size m) fixation probability under selection intensity
    ``alpha``. Its stationary distribution ranks profiles; a player's meta-strategy is the
    marginal of that distribution over its own members. Large alpha (the paper's regime) makes
    the chain follow the game's better-response graph: a profile that a player can improve on
    is soon left, so, e.g., a member worse than all its alternatives gets no weight.

    Tables up to _EXACT_LIMIT profiles are solved exactly, also where OpenSpiel's eigen-solver
    gives up on nearly separate basins; see _stationary_distribution for larger ones.
    """
    payoffs = _payoff_tensor(payoffs)
    shape = payoffs.shape[1:]
    edges = _alpharank_transitions(payoffs, alpha, population_size)
    joint = _stationary_distribution(int(np.prod(shape)), *edges).reshape(shape)
    players = range(len(shape))
    return [_normalise(joint.sum(axis=tuple(q for q in players if q != p))) for p in players]


def _solver(name: str, summary: str, solve: SolveFn, two_player_zero_sum_only: bool = False) -> None:
    """`META_SOLVERS.add`, with the name and summary written once for registry and solver."""
    META_SOLVERS.add(name, MetaSolver(name, summary, solve, two_player_zero_sum_only), summary)


_solver("uniform", "uniform over each population (fictitious self-play)", uniform)
_solver("last", "all weight on each player's newest population member (self-play)", last)
_solver(
    "nash",
    "Nash equilibrium by linear programming, central point of the optimal face (two-player zero-sum)",
    nash_zero_sum,
    two_player_zero_sum_only=True,
)
_solver("prd", "projected replicator dynamics (n players, general-sum)", projected_replicator_dynamics)
_solver("fictitious_play", "fictitious play, empirical average (n players, general-sum)", fictitious_play)
_solver("regret_matching", "regret matching, average strategy (n players, general-sum)", regret_matching)
_solver("alpharank", "alpha-Rank stationary marginals (n players, general-sum)", alpharank)
