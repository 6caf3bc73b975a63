"""What Prefect runs: each scenario's flows bound by module path for deployments and workers
(entrypoints.py), and `psro serve`, which serves prefect.yaml's deployments (serve.py)."""
