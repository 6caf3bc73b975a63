"""What both RLlib peers (`rllib_peer.py`, `rllib_atari_peer.py`) set up the same way; runs in
the peers' own venv (`rllib_venv.py`), imported from this folder."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def local_ray():
    """A Ray of its own on this 2-core machine (never one found running), no dashboard, shut
    down at the end so nothing keeps running."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, address="local", configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def shared_policy_ppo(env: str, runners: int, envs_per_runner: int, seed: int):
    """RLlib's PPO (new API stack) on the registered `env`: every agent on one shared policy
    (parameter sharing, as this project's side), `runners` remote EnvRunners of one CPU each
    (0: the driver samples), the Learner in the driver."""
    from ray.rllib.algorithms.ppo import PPOConfig

    return (
        PPOConfig()
        .environment(env)
        .framework("torch")
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs_per_runner, num_cpus_per_env_runner=1)
        .learners(num_learners=0)
        .multi_agent(policies={"shared"}, policy_mapping_fn=lambda agent_id, *a, **k: "shared")
        .debugging(seed=seed)
    )
