"""No run path assumes loopback: 127.0.0.1 is written in the library, the tasks and the flows only
where a local default is chosen (a server a run or `psro server` starts for itself, the team's
stack on one host, Ray kept on loopback when it is started there). Every other address a run
uses comes from its flags or its environment."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"
# file -> why it may name loopback
LOCAL_DEFAULTS = {
    "flows/services/stack.py": "the stack's default host, and PostgreSQL, which listens on loopback alone",
    "flows/services/prefect_server.py": "the Prefect server a run or `psro server` starts for itself",
    "flows/services/patches.py": "`ray start` keeps a node given 127.0.0.1 there",
    "flows/services/ray_session.py": "a Ray on this machine's loopback is joined there",
    "flows/cli/app.py": "`psro server`'s Prefect server, on this machine",
    "flows/deployments/serve.py": "`psro serve`'s own Prefect server, and its message saying how to start one",
}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes: prose, not an address any code uses."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def naming_loopback() -> dict[str, list[int]]:
    """Each source file of flows/, tasks/ and marl_core/ whose code (docstrings and comments
    aside) holds a string with 127.0.0.1, and the lines."""
    found: dict[str, list[int]] = {}
    for package in ("flows", "tasks", "marl_core"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            prose = _docstrings(tree)
            lines = sorted(
                node.lineno
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and LOOPBACK in node.value
                and id(node) not in prose
            )
            if lines:
                found[str(path.relative_to(ROOT))] = lines
    return found


def test_loopback_is_written_only_where_a_local_default_is_chosen():
    found = naming_loopback()
    assert set(found) <= set(LOCAL_DEFAULTS), {path: found[path] for path in set(found) - set(LOCAL_DEFAULTS)}


def test_the_check_sees_loopback_in_code_but_not_in_prose(tmp_path, monkeypatch):
    """The scan finds an address in an f-string and in a plain string, and skips a docstring."""
    package = tmp_path / "flows"
    package.mkdir()
    (package / "run_path.py").write_text(
        '"""Talks to 127.0.0.1 in prose."""\n'
        'def url(port):\n    """127.0.0.1 here too."""\n    return f"http://127.0.0.1:{port}"\n'
        'HOST = "127.0.0.1"\n'
    )
    (tmp_path / "tasks").mkdir()
    (tmp_path / "marl_core").mkdir()
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert naming_loopback() == {"flows/run_path.py": [4, 5]}
