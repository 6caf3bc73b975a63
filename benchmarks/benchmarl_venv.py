"""The BenchMARL peer's own virtual environment (`marl_vs_benchmarl.py`, `benchmarl_differential.py`).

BenchMARL 1.5.2 asks for `torchrl>=0.10,<0.12` (and so tensordict 0.11), `hydra-core`,
`torchvision` and `av<14`, and it reaches PettingZoo's MPE through torchrl's `PettingZooEnv`,
which looks the task up in `pettingzoo.mpe`: PettingZoo 1.25 moved MPE out into `mpe2`, which
this project uses. None of that fits this project's venv, so the peer gets a venv of its own
(default `.bench/benchmarl-venv`), created on first use and topped up when it lacks a package:

- BenchMARL 1.5.2, torchrl 0.11.1 and tensordict 0.11.0 (the newest torchrl it accepts);
- VMAS at this project's version, so the VMAS tasks run the same simulator code on both sides;
- PettingZoo 1.24.3, the last release that carries MPE, with its `mpe` extra (pygame): its MPE
  is not the code this project steps (`mpe2`), so `benchmarl_differential.py` checks, on the same
  seeds and actions, that both step the same task with the same observations and rewards;
- torch and torchvision as a pair that installs here (`TORCH_PAIRS`).

Torch. torchvision must be built against the very torch beside it: PyPI's torchvision fails to
import beside this project's `torch==2.13.0+cpu` ("operator torchvision::nms does not exist").
When PyTorch's CPU index can be reached, the CPU builds of the pair torchrl 0.11 was built
against are taken from it; otherwise the pair this machine's pip finds for its architecture
(on x86_64 with Python 3.11 both lie on the local disk, a CUDA build, several GB in the venv;
on aarch64 PyPI's are CPU builds). The peer runs on the CPU either way, as this project's side.
Beside torch 2.14.1, torchrl 0.11.1's C++ extension (built against torch 2.10) does not load (an
undefined symbol); it serves only prioritized replay, which BenchMARL's experiment yaml leaves
off (`off_policy_use_prioritized_replay_buffer: False`), so nothing the benchmark runs needs it.

What was installed is written to `versions.json` in the venv (`installed_versions`), and the
peer reports the versions it imported beside its figures.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

from peer_venvs import missing_modules, reachable  # benchmarks/, this script's directory

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV = ROOT / ".bench" / "benchmarl-venv"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# (torch, torchvision) by where they come from: the CPU index, else by `platform.machine()`
CPU_INDEX_PAIR = ("2.10.0+cpu", "0.25.0+cpu")  # what torchrl 0.11.1 and tensordict 0.11.0 were built against
TORCH_PAIRS = {"x86_64": ("2.14.1", "0.29.1"), "aarch64": ("2.9.1", "0.24.1")}

# importable module -> requirement; the probe for a venv that needs topping up
PEER_PACKAGES = {
    "benchmarl": "benchmarl==1.5.2",
    "torchrl": "torchrl==0.11.1",
    "tensordict": "tensordict==0.11.0",
    "hydra": "hydra-core",
    "av": "av<14",
    "pettingzoo.mpe": "pettingzoo[mpe]==1.24.3",
    "vmas": f"vmas=={version('vmas')}",
}

# distributions whose versions `versions.json` records and the peer reports
REPORTED = ["benchmarl", "torchrl", "tensordict", "torch", "torchvision", "vmas", "pettingzoo", "gymnasium", "numpy"]


def torch_pair() -> tuple[list[str], list[str]]:
    """(pip's index arguments, [torch pin, torchvision pin]) for this machine."""
    if reachable(TORCH_CPU_INDEX + "/torch/"):
        torch, vision = CPU_INDEX_PAIR
        return ["--extra-index-url", TORCH_CPU_INDEX], [f"torch=={torch}", f"torchvision=={vision}"]
    machine = platform.machine()
    if machine not in TORCH_PAIRS:
        raise SystemExit(f"no known torch/torchvision pair for {machine}; add one to TORCH_PAIRS")
    torch, vision = TORCH_PAIRS[machine]
    return [], [f"torch=={torch}", f"torchvision=={vision}"]


def installed_versions(python: Path) -> dict[str, str]:
    """The versions of `REPORTED` in the venv of `python`, as its own importlib.metadata reads them."""
    probe = (
        "import json, sys\n"
        "from importlib.metadata import version, PackageNotFoundError\n"
        "def v(d):\n"
        "    try:\n"
        "        return version(d)\n"
        "    except PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({d: v(d) for d in sys.argv[1:]}))"
    )
    out = subprocess.run([str(python), "-c", probe, *REPORTED], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def peer_python(venv: Path = DEFAULT_VENV) -> Path:
    """The peer's interpreter, creating its virtual environment (or installing what it lacks) first.

    Torch and torchvision go in first, as a pair, so that nothing below pulls another torch; the
    rest is installed in one pip call with them pinned again, so that pip keeps them.
    """
    python = venv / "bin" / "python"
    if python.exists() and not missing_modules(python, PEER_PACKAGES):
        return python
    print(f"preparing the BenchMARL peer's virtual environment in {venv} (once)", flush=True)
    started = time.perf_counter()
    if not python.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    index, pair = torch_pair()
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *index, *pair], check=True)
    subprocess.run([*pip, *index, *pair, *PEER_PACKAGES.values()], check=True)
    versions = installed_versions(python)
    (venv / "versions.json").write_text(json.dumps(versions, indent=2) + "\n")
    print(f"peer environment ready in {time.perf_counter() - started:.0f} s: {versions}", flush=True)
    return python


if __name__ == "__main__":
    print(peer_python(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_VENV))
