from tasks.psro_tasks import (
    TASKS,
    approximate_best_response,
    evaluate_payoffs,
    measure_exploitability,
    solve_meta_game,
    train_best_response,
    train_levels,
)

__all__ = [
    "TASKS",
    "approximate_best_response",
    "evaluate_payoffs",
    "measure_exploitability",
    "solve_meta_game",
    "train_best_response",
    "train_levels",
]
