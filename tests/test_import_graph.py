"""The project's modules import each other without cycles.

A cycle makes the import order matter: which module of the pair is imported first decides
whether the other finds its names defined yet (`import flows.marl_cli` alone once failed that
way), and a cycle hidden in a function body only moves the failure to the first call. So every
import statement counts here, at module level or inside a function, under `if TYPE_CHECKING:`
or not.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("marl_core", "tasks", "flows")
# Folders of scripts run as files: their modules import each other by bare name (`from
# benchmarl_peer import load_task`), Python putting the script's own folder on the path.
SCRIPT_FOLDERS = ("benchmarks", "scripts", "tests")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    folders = PACKAGES + SCRIPT_FOLDERS
    return {_module_name(path): path for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))}


def _in_script_folder(importer: str, name: str, modules: dict[str, Path]) -> str:
    """A bare import from a script folder names its sibling module there, if there is one."""
    folder = importer.rpartition(".")[0]
    if folder in SCRIPT_FOLDERS and f"{folder}.{name}" in modules:
        return f"{folder}.{name}"
    return name


def _imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The project modules one import statement names: `import a.b` names `a.b`; `from a import
    b` names `a.b` when that is a module, else `a`."""
    if isinstance(node, ast.Import):
        names = (_in_script_folder(importer, alias.name, modules) for alias in node.names)
        return {name for name in names if name in modules}
    base = _in_script_folder(importer, node.module, modules) if node.module and not node.level else node.module or ""
    if node.level:  # relative: from the importer's package, one level up per extra dot
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    named = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            named.add(f"{base}.{alias.name}")
        elif base in modules:
            named.add(base)
    return named


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(node, name, path.name == "__init__.py", modules)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def _describe(component: frozenset[str], graph: dict[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in sorted(component) for b in sorted(graph[a] & component)]
    return "{" + ", ".join(sorted(component)) + "}: " + "; ".join(edges)


def test_the_graph_sees_imports_everywhere_in_a_module():
    """The parser itself: a function-level `from pkg import module` is an edge to that module,
    `from pkg import name` one to the package, and a two-module loop is reported."""
    modules = project_modules()
    assert {"flows.cli.app", "flows.cli.scenario_commands", "marl_core.psro.config", "tasks"} <= set(modules)
    graph = import_graph()
    assert "flows.services.preflight" in graph["flows.cli.app"]  # imported inside `run`
    assert "marl_core.psro.config" in graph["flows.cli.app"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_no_project_module_is_part_of_an_import_cycle():
    graph = import_graph()
    found = list(cycles(graph))
    assert not found, "import cycles:\n" + "\n".join(_describe(component, graph) for component in found)


def _subpackage(module: str) -> str:
    """`marl_core.rollout.worker` -> `marl_core.rollout`; a top-level module such as
    `marl_core.registry` stands for itself."""
    return ".".join(module.split(".")[:2])


def library_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """`marl_core`'s graph between its subpackages: each module's edges collapsed to its
    subpackage; and, per edge, the module imports that make it (for the failure message)."""
    graph: dict[str, set[str]] = {}
    behind: dict[tuple[str, str], list[str]] = {}
    for module, imported in sorted(import_graph().items()):
        if module.partition(".")[0] != "marl_core":
            continue
        source = _subpackage(module)
        graph.setdefault(source, set())
        for target in sorted(imported):
            if target.partition(".")[0] == "marl_core" and _subpackage(target) != source:
                graph[source].add(_subpackage(target))
                behind.setdefault((source, _subpackage(target)), []).append(f"{module} -> {target}")
    return graph, behind


def test_the_library_subpackages_import_each_other_without_cycles():
    """The library layers: registry, games and envs at the bottom; policies, rl and rollout on
    them; marl, distributed and empirical_game above; psro, league and pbt on top. Two
    subpackages that import each other, even through modules that form no cycle themselves,
    leave no place where either concept can be read (or tested) without the other."""
    graph, behind = library_graph()
    assert {"marl_core.games", "marl_core.policies", "marl_core.rollout", "marl_core.registry"} <= set(graph)
    found = cycles(graph)
    lines = [
        f"{a} -> {b}: " + ", ".join(behind[a, b])
        for component in found
        for a in sorted(component)
        for b in sorted(graph[a] & component)
    ]
    assert not found, "cycles between marl_core's subpackages:\n" + "\n".join(lines)


def test_the_library_imports_neither_prefect_nor_mlflow():
    """`marl_core` runs in Ray actors, tests and scripts without the orchestration and tracking
    layers (`flows/`, `tasks/`): every one of its modules, imported in a fresh interpreter, leaves
    neither Prefect nor MLflow in `sys.modules`."""
    library = sorted(name for name in project_modules() if name.partition(".")[0] == "marl_core")
    check = (
        "import importlib, sys\n"
        f"for name in {library!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('prefect', 'mlflow') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_the_marl_command_module_imports_on_its_own():
    """A fresh interpreter, so nothing imported earlier in the suite hides an import-order bug."""
    result = subprocess.run(
        [sys.executable, "-c", "import flows.cli.scenario_commands"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


# `flows/`'s folders are the layers of docs/architecture.md, bottom-up: each imports only the
# folders before it (and `marl_core`, `tasks`), so each layer reads without the ones above it.
FLOWS_LAYERS = ("tracking", "services", "runtime", "scenarios", "deployments", "cli")


def test_flows_folders_are_its_layers_and_import_only_downwards():
    flows = ROOT / "flows"
    root_modules = sorted(p.name for p in flows.glob("*.py"))
    assert root_modules == ["__init__.py"], f"modules at flows/'s root, in no layer: {root_modules}"
    assert sorted(p.name for p in flows.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(FLOWS_LAYERS)
    rank = {layer: k for k, layer in enumerate(FLOWS_LAYERS)}
    upward = [
        f"{module} -> {target}"
        for module, imported in sorted(import_graph().items())
        if module.startswith("flows.")
        for target in sorted(imported)
        if target.startswith("flows.") and rank[target.split(".")[1]] > rank[module.split(".")[1]]
    ]
    assert not upward, "imports from a lower layer of flows/ into a higher one:\n" + "\n".join(upward)
