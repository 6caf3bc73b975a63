"""The one scenario runtime: what a scenario declares (scenario.py), its run from checked
settings to its last commit (run.py), a step's library runner as Prefect tasks on Ray
(task_steps.py, ray_runner.py), and long work on screen (progress.py)."""
