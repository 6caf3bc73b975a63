"""Small runs of the scenarios, shared by the suite's end-to-end files (`test_scenarios.py`,
`test_stack.py`): MARL and PBT on MPE's simple_spread (4 rounds of 25 steps, a checkpoint every
2), a league on Kuhn poker (3 generations), neural CFR on Kuhn poker (4 rounds of 2 small iterations);
each commits step 3 last."""

SPREAD = "pettingzoo:mpe2.simple_spread_v3"
SYNC_MARL = {
    "env": SPREAD,
    "algorithm": "ippo",
    "rounds": 4,
    "steps_per_round": 25,
    "workers": 1,
    "envs_per_worker": 2,
    "eval_every": 2,
    "eval_episodes": 2,
    "checkpoint_every": 2,
}
PBT = {
    "marl": {
        "env": SPREAD,
        "algorithm": "mappo",
        "rounds": 4,
        "steps_per_round": 25,
        "envs_per_worker": 2,
        "eval_episodes": 4,
        "checkpoint_every": 2,
        "settings": {"lr": 3e-4, "epochs": 2, "minibatch_size": 50},
    },
    "population": 2,
    "members": [{"lr": 1e-7}],
    "pbt": {"perturbation_interval": 2, "hyperparam_mutations": {"lr": {"loguniform": [1e-5, 3e-3]}}},
}
SMALL_LEAGUE = {
    "game": "kuhn_poker",
    "generations": 3,
    "episodes": 100,
    "episodes_per_round": 50,
    "eval_episodes": 40,
    "rollout": {"workers": 1, "envs_per_worker": 8},
    "league": {"main_agents": 2, "main_exploiters": 0, "league_exploiters": 0, "snapshot": {"max_steps": 200}},
}
# Networks and samples small enough that an iteration takes a tenth of a second on Kuhn.
TINY_CFR = {"traversals": 200, "advantage_hidden": [32], "policy_hidden": [32], "advantage_steps": 30}
SMALL_CFR = {
    "game": "kuhn_poker",
    "rounds": 4,
    "iterations_per_round": 2,
    "neural_cfr": {**TINY_CFR, "policy_steps": 30, "batch_size": 128, "seed": 3},
}
