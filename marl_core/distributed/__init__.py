"""The servers between rollout workers and learners that never wait for each other: MALib's
dataset server, and its parameter server with the distributed strategies.

- `dataset_server.DatasetServer`: a bounded buffer that rollout workers stream fragments into
  and learners take them from, each fragment tagged with the weights version that played it.
- `parameter_server.ParameterServer`: one policy's master weights and optimizer; several
  learners push gradients to it by a strategy (BSP, ASP, BAP) and pull the weights back.
- `settings`: their typed settings, importable without torch.

The learners that use them are `marl_core.marl.async_learners`. The algorithms that learn from
stale fragments (IMPALA and APPO, on V-trace) are in `marl_core.rl`; the gradients learners push
are their `loss_steps` (`marl_core.rl.gradient_steps`). The rollout pool's weight store
(`marl_core.rollout.weight_store`) is not a parameter server: it only keeps the acting weights
learners publish, for the workers to pull.
"""
