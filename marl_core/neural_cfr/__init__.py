"""Neural CFR: a population method whose members are networks, learned from play of the game.

`NeuralCFR` is the run's state and `NeuralCFR.iterate` one iteration (solver.py explains the
algorithm); `NeuralCFRSettings` its hyperparameters; `exact_exploitability` measures the
average-policy networks on the enumerated tree. docs/neural-equilibria.md has the measurements.
"""

from marl_core.neural_cfr.settings import NeuralCFRSettings

__all__ = ["NeuralCFRSettings", "NeuralCFR", "exact_exploitability"]


def __getattr__(name: str):
    # The solver imports torch; the settings do not, so a config check stays light.
    if name in ("NeuralCFR", "exact_exploitability"):
        from marl_core.neural_cfr import solver

        return getattr(solver, name)
    raise AttributeError(f"module 'marl_core.neural_cfr' has no attribute {name!r}")
