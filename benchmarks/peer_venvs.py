"""What the peers' own virtual environments (RLlib's, BenchMARL's) share: whether a package
index answers, and which of a peer's modules its venv still lacks."""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Iterable
from pathlib import Path

# Run by the peer's interpreter: a module whose parent package fails to import counts as missing.
_PROBE = (
    "import importlib.util as u, sys\n"
    "def found(m):\n"
    "    try:\n"
    "        return u.find_spec(m) is not None\n"
    "    except ImportError:\n"
    "        return False\n"
    "print(' '.join(m for m in sys.argv[1:] if not found(m)))"
)


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


def missing_modules(python: Path, modules: Iterable[str]) -> list[str]:
    """The `modules` that `python` cannot import."""
    out = subprocess.run([str(python), "-c", _PROBE, *modules], capture_output=True, text=True, check=True)
    return out.stdout.split()
