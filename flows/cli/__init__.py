"""The command line: `psro` (app.py), every scenario's `run` and `resume` derived from its
declaration (scenario_commands.py), `psro stack` (stack_commands.py), and the one-line refusal
of bad input (errors.py)."""
