r"""The policies' activation and log-softmax against torch's own kernels, on the CPU.

`marl_core.rl.networks.Tanh` computes tanh as 2 sigmoid(2x) - 1 and `log_softmax` as logits minus
their log-sum-exp, because torch's CPU kernels for `torch.tanh` and for a softmax over a short
last dimension were found slow in the wheels this project installs. This script times both
against torch's (`torch.tanh`, `torch.log_softmax`) in the same process, on the shapes a policy
sees (a rollout worker acting on every agent of 256 copies of a 4-agent task: 1,024 rows of 64
hidden units and 9 actions; a learner's minibatch of 4,096 rows, forward and backward), then a
MAPPO actor's network with each tanh. Each figure is the median of `--repeats` timed loops; the
ratios are torch's time over this project's. Time only on a quiet machine (the load average is
printed).

    python benchmarks/policy_kernels.py [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def per_call_ms(function, repeats: int, calls: int = 2000) -> float:
    for _ in range(100):
        function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            function()
        times.append((time.perf_counter() - started) / calls * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads (a rollout worker uses 1)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch
    from torch import nn

    from marl_core.marl.mappo import MAPPOActor
    from marl_core.rl import networks

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    torch.manual_seed(0)
    hidden = torch.randn(1024, 64)
    logits = torch.randn(1024, 9)
    batch_hidden = torch.randn(4096, 64, requires_grad=True)
    batch_logits = torch.randn(4096, 9, requires_grad=True)
    ours_tanh = networks.Tanh()

    def backward(output):
        output.sum().backward()

    # (what, torch's, ours, whether it runs backward too: else it runs under inference mode)
    rows = [
        ("tanh [1024, 64]", lambda: torch.tanh(hidden), lambda: ours_tanh(hidden), False),
        ("log-softmax [1024, 9]", lambda: torch.log_softmax(logits, -1), lambda: networks.log_softmax(logits), False),
        (
            "tanh [4096, 64], forward and backward",
            lambda: backward(torch.tanh(batch_hidden)),
            lambda: backward(ours_tanh(batch_hidden)),
            True,
        ),
        (
            "log-softmax [4096, 9], forward and backward",
            lambda: backward(torch.log_softmax(batch_logits, -1)),
            lambda: backward(networks.log_softmax(batch_logits)),
            True,
        ),
    ]

    # a MAPPO actor's network (22 inputs, [64, 64] hidden, 9 actions) on 1,024 rows, with torch's
    # tanh in place of this project's between the same layers
    ours_net = MAPPOActor(22, 9, (64, 64)).actor
    torch_net = nn.Sequential(*[nn.Tanh() if isinstance(layer, networks.Tanh) else layer for layer in ours_net])
    obs = torch.randn(1024, 22)
    rows.append(("MAPPO actor's network on 1,024 rows", lambda: torch_net(obs), lambda: ours_net(obs), False))

    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s)")
    print(f"{'':44} {'torch ms':>9} {'ours ms':>9} {'torch / ours':>13}")
    for name, theirs, ours, with_backward in rows:
        with torch.enable_grad() if with_backward else torch.inference_mode():
            torch_ms, ours_ms = per_call_ms(theirs, args.repeats), per_call_ms(ours, args.repeats)
        print(f"{name:44} {torch_ms:>9.4f} {ours_ms:>9.4f} {torch_ms / ours_ms:>12.2f}x")
    load_after = os.getloadavg()
    print(f"load average: {load_before[0]:.2f} before, {load_after[0]:.2f} after")


if __name__ == "__main__":
    main()
