"""Check, on a machine with a GPU, the learner path that `asynchronous: {device: cuda}` takes on
pixels: an APPO and an IMPALA trainer with the Nature-CNN actor-critic moved to the GPU
(`marl_core.marl.learner.place`), fed a Pong-shaped batch whose frames come as uint8
and are read as floats, as `JointExperience.agent_experience` hands them over.

For each algorithm, from the same seed and the same batch, one update on the CPU and one on the
GPU must give the same loss (relative 1e-2: cuDNN may convolve in TF32) and weights within two
learning rates per optimizer step of each other (Adam moves each weight by about one learning
rate a step, and APPO takes several steps per batch); the
GPU's weights must come back from `get_weights` as CPU tensors that a CPU policy loads and acts
with. The seconds per update on each are printed beside them (the card named in the output).
CI has no GPU: this is run by hand, e.g. through the device tool, and exits 1 on a mismatch.

    python scripts/gpu_learner_check.py [--batch 512]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from marl_core.marl.learner import place  # noqa: E402
from marl_core.rl import ALGORITHMS  # noqa: E402
from marl_core.rl.batch import Experience  # noqa: E402

OBS, ACTIONS = 6 * 84 * 84, 6  # atari:pong_v3: 4 stacked frames and 2 agent-indicator planes


class _Trainers:
    """Whatever `place` moves: a learner's `policies`."""

    def __init__(self, trainer):
        self.policies = {"pong": trainer.policy}


def pong_batch(size: int, seed: int = 0) -> Experience:
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (size, OBS), dtype=np.uint8)
    following = rng.integers(0, 256, (size, OBS), dtype=np.uint8)
    logits = rng.normal(size=(size, ACTIONS))
    action = rng.integers(ACTIONS, size=size)
    logp = (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True)))[np.arange(size), action]
    last = np.zeros(size, bool)
    last[size // 2 - 1] = last[-1] = True
    return Experience(
        obs=frames.astype(np.float32),
        mask=np.ones((size, ACTIONS), bool),
        action=action.astype(np.int64),
        reward=rng.choice([-1.0, 0.0, 1.0], size, p=[0.05, 0.9, 0.05]).astype(np.float32),
        next_obs=following.astype(np.float32),
        next_mask=np.ones((size, ACTIONS), bool),
        done=np.zeros(size, bool),
        last=last,
        extras={"logp": logp.astype(np.float32)},
    )


def pong_config(name: str, seed: int = 0):
    """The actor-critic of `configs/marl/pong/ippo.yaml`: Nature CNN, one 512-unit layer, one trunk."""
    return ALGORITHMS[name].config(encoder="nature_cnn", hidden=(512,), shared_trunk=True, seed=seed)


def one_update(name: str, device: str, batch: Experience) -> tuple[dict, dict, float, int]:
    trainer = ALGORITHMS[name].trainer(OBS, ACTIONS, pong_config(name))
    place(_Trainers(trainer), device)
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    metrics = trainer.update(batch)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    steps = max(int(state["step"]) for state in trainer.optimizer.state.values())
    return metrics, trainer.policy.get_weights(), seconds, steps


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=512, help="transitions in the batch")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: torch.cuda.is_available() is False")
        return 1
    torch.set_num_threads(4)
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    batch, failures = pong_batch(args.batch), 0
    for name in ("appo", "impala"):
        one_update(name, "cuda", batch)  # warm-up: kernels chosen, memory allocated
        cpu_metrics, cpu_weights, cpu_seconds, steps = one_update(name, "cpu", batch)
        gpu_metrics, gpu_weights, gpu_seconds, _ = one_update(name, "cuda", batch)
        lr = ALGORITHMS[name].config().lr
        loss_gap = abs(gpu_metrics["loss"] - cpu_metrics["loss"]) / max(abs(cpu_metrics["loss"]), 1e-6)
        weight_gap = max(float((gpu_weights[k] - cpu_weights[k]).abs().max()) for k in cpu_weights)
        on_cpu = all(w.device.type == "cpu" for w in gpu_weights.values())
        acting = ALGORITHMS[name].policy(OBS, ACTIONS, pong_config(name, seed=1))
        acting.set_weights(gpu_weights)
        actions, _ = acting.act(batch.obs[:8], batch.mask[:8], True, np.random.default_rng(0))
        ok = loss_gap < 1e-2 and weight_gap < 2 * lr * steps and on_cpu and actions.shape == (8,)
        failures += not ok
        print(
            f"{name}: loss cpu {cpu_metrics['loss']:.6f} gpu {gpu_metrics['loss']:.6f} (relative gap {loss_gap:.1e}); "
            f"largest weight gap {weight_gap:.1e} (lr {lr:g}, {steps} Adam steps); weights back on the CPU: {on_cpu}; "
            f"one update of {args.batch}: cpu {cpu_seconds * 1e3:.0f} ms, gpu {gpu_seconds * 1e3:.0f} ms; "
            f"{'ok' if ok else 'MISMATCH'}"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
