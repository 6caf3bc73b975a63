"""The services a run uses, started or joined: a Prefect server (prefect_server.py, with its
patches), Ray (ray_session.py), both for one run (run_services.py) or kept up by `psro server`
(psro_server.py), the checks of what settings point at (preflight.py), the watcher that stops
what a dead run left (reaper.py), and the team's stack (stack.py)."""
