"""Population-based training (Jaderberg et al. 2017) under Ray Tune's names, for policies.

settings.py  PBTSettings: perturbation_interval, quantile_fraction, resample_probability,
             perturbation_factors, hyperparam_mutations (Tune's names and defaults)
schedule.py  the exploit and explore steps as pure functions, and the lineage they leave
"""
