from tasks.psro_tasks import (
    evaluate_payoffs,
    measure_exploitability,
    solve_meta_game,
    train_best_response,
)

__all__ = [
    "evaluate_payoffs",
    "measure_exploitability",
    "solve_meta_game",
    "train_best_response",
]
