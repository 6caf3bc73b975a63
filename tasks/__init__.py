from tasks.psro_tasks import (
    evaluate_payoffs,
    expand_population,
    measure_exploitability,
    solve_meta_game,
    train_best_response,
)

__all__ = [
    "evaluate_payoffs",
    "expand_population",
    "measure_exploitability",
    "solve_meta_game",
    "train_best_response",
]
