"""The RLlib peer's own virtual environment, shared by the benchmarks that race RLlib.

RLlib's requirements may clash with this project's pins, so the peer runs in a venv of its own
(default `.bench/rllib-venv`), created on first use and topped up when a benchmark needs a
package an older venv lacks. It pins Ray, torch, PettingZoo and the environment packages to this
project's versions, so both sides run the same code of everything but the library under test.
"""

from __future__ import annotations

import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

from peer_venvs import missing_modules, reachable  # benchmarks/, this script's directory

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# importable module -> distribution pinned to this project's version
PEER_PACKAGES = {
    "ray.rllib": "ray[rllib]",
    "pettingzoo": "pettingzoo",
    "mpe2": "mpe2",
    "multi_agent_ale_py": "multi-agent-ale-py",
    "ale_py": "ale-py",
    # the Atari peer steps this project's own preprocessed env (marl_core.envs, which imports these)
    "tinyscaler": "tinyscaler",
    "pyspiel": "open_spiel",
}


def peer_python(venv: Path) -> Path:
    """The peer's interpreter, creating its virtual environment (or installing what it lacks) first.

    Torch is the CPU build: the exact version of this venv's torch (``2.x.y+cpu`` here, found
    through pip's own configured indexes and find-links), with PyTorch's CPU index added when it
    can be reached; a plain ``2.x.y`` pin alone would pull the CUDA build from PyPI.
    """
    import ray
    import torch

    python = venv / "bin" / "python"
    if python.exists() and not missing_modules(python, PEER_PACKAGES):
        return python
    print(f"preparing the RLlib peer's virtual environment in {venv} (once)", flush=True)
    started = time.perf_counter()
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    torch_pin = f"torch=={torch.__version__.split('+')[0]}+cpu"
    index = ["--extra-index-url", TORCH_CPU_INDEX] if reachable(TORCH_CPU_INDEX + "/torch/") else []
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, *index, torch_pin], check=True)  # first, so that nothing below picks a CUDA build
    pins = [torch_pin] + [
        f"{dist}=={ray.__version__ if dist.startswith('ray') else version(dist)}" for dist in PEER_PACKAGES.values()
    ]
    subprocess.run([*pip, *index, *pins], check=True)
    print(f"peer environment ready in {time.perf_counter() - started:.0f} s", flush=True)
    return python
