"""The project's import graph, module by module: no circle, no import uphill, agent and collector apart.

Every module of the project's packages is parsed (never imported) and every import in it
counts, wherever it stands: at the top, under ``if TYPE_CHECKING:``, inside a function or a
``try``; absolute or relative. An import names the module it loads (``from a.b import c``
is ``a.b.c`` when that is a module, else ``a.b``); the parent packages it also runs are not
edges, or every package ``__init__`` that re-exports a submodule would make a circle.

The layers, bottom up: ``protocol`` (pure), ``runtime`` (host plumbing shared by the two
daemons, when present), ``agent`` and ``collector`` (side by side, never importing each
other), ``fleet`` (the simulator, on top). A module imports from its own layer or below.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LAYERS: dict[str, int] = {"protocol": 0, "runtime": 1, "agent": 2, "collector": 2, "fleet": 3}
"""Each project package's layer: an import may go to the same layer or lower, never up."""

PACKAGES = tuple(p for p in LAYERS if (ROOT / p / "__init__.py").is_file())

TEST_CLOCKS = {"FakeClock", "AcceleratedClock"}
SIMULATOR_NAME = re.compile(r"(^|_)(fleet|sim|simulat\w*)(_|$)")


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` imports ``target``, at ``where`` (``path:line``)."""

    source: str
    target: str
    where: str


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Every module of ``packages`` by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The project module ``name`` loads: itself, or its longest prefix that is a module."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names one import statement loads."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        # Relative: from the module's package (its own name if it is a package), up level - 1.
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join([*base, node.module] if node.module else base)
    else:
        prefix = node.module or ""
    return [f"{prefix}.{alias.name}" for alias in node.names] + [prefix]


def import_edges(modules: Mapping[str, Path]) -> list[Edge]:
    """Every project-internal import of ``modules``, including TYPE_CHECKING and function-local ones."""
    edges: list[Edge] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = _targets(node, module, is_package)
            resolved: set[str | None]
            if isinstance(node, ast.ImportFrom):
                # ``from a.b import c``: the submodule a.b.c if there is one, else a.b itself.
                *members, prefix = names
                resolved = {m for m in members if m in modules} or {_resolve(prefix, modules)}
            else:
                resolved = {_resolve(n, modules) for n in names}
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            edges.extend(Edge(module, t, where) for t in sorted(r for r in resolved if r and r != module))
    return edges


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One circle per strongly connected group of nodes, as a path that ends where it starts.

    Tarjan's algorithm finds the groups; a breadth-first search inside each gives the
    shortest circle through its first node (sorted, so the answer does not depend on order).
    """
    nodes = sorted(set(graph) | {t for targets in graph.values() for t in targets})
    succ = {n: sorted(set(graph.get(n, ()))) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in succ[v]:
                groups.append(sorted(group))

    for n in nodes:
        if n not in index:
            connect(n)

    cycles = []
    for group in sorted(groups):
        members, start = set(group), group[0]
        parent: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in parent:
            following = []
            for v in frontier:
                for w in succ[v]:
                    if w in members and w not in parent:
                        parent[w] = v
                        following.append(w)
            frontier = following
        path = [start]
        v = parent[start]
        while v != start:
            path.append(v)
            v = parent[v]
        path.append(start)
        cycles.append(path[::-1])
    return cycles


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    """The import graph of the project's packages."""
    return import_edges(project_modules())


def _package(module: str) -> str:
    return module.split(".", maxsplit=1)[0]


def _listing(edges: Iterable[Edge]) -> str:
    return "\n".join(f"  {e.where}: {e.source} imports {e.target}" for e in edges)


# --------------------------------------------------------------------------- the finder itself


def test_the_cycle_finder_finds_a_planted_circle() -> None:
    """The check can fail: a three-module circle, a self-import and a two-module circle are each found,
    as paths that close; a graph without one gives nothing."""
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["e"], "f": ["g"], "g": ["f", "d"]}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"], ["f", "g", "f"]]
    assert find_cycles({"a": ["b", "c"], "b": ["c"], "c": []}) == []


def test_the_edges_cover_every_kind_of_import(tmp_path: Path) -> None:
    """TYPE_CHECKING, function-local and relative imports are edges; a parent package is not."""
    modules = {
        "pkg": tmp_path / "pkg" / "__init__.py",
        "pkg.a": tmp_path / "pkg" / "a.py",
        "pkg.b": tmp_path / "pkg" / "b.py",
        "pkg.c": tmp_path / "pkg" / "c.py",
        "pkg.sub": tmp_path / "pkg" / "sub" / "__init__.py",
        "pkg.sub.d": tmp_path / "pkg" / "sub" / "d.py",
    }
    sources = {
        "pkg": "from pkg import a\n",
        "pkg.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import Thing\n",
        "pkg.b": "def f():\n    import pkg.c\n",
        "pkg.c": "from .sub import d\nfrom . import a\n",
        "pkg.sub": "",
        "pkg.sub.d": "from .. import b\nfrom ..c import x\nimport os\n",
    }
    for name, path in modules.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(sources[name], encoding="utf-8")
    global ROOT  # noqa: PLW0603 - the edges' locations are relative to the tree parsed
    saved, ROOT = ROOT, tmp_path
    try:
        found = {(e.source, e.target) for e in import_edges(modules)}
    finally:
        ROOT = saved
    assert found == {
        ("pkg", "pkg.a"),
        ("pkg.a", "pkg.b"),
        ("pkg.b", "pkg.c"),
        ("pkg.c", "pkg.sub.d"),
        ("pkg.c", "pkg.a"),
        ("pkg.sub.d", "pkg.b"),
        ("pkg.sub.d", "pkg.c"),
    }
    assert find_cycles({}) == []
    graph: dict[str, list[str]] = {}
    for source, target in found:
        graph.setdefault(source, []).append(target)
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


# --------------------------------------------------------------------------- the project


def test_the_graph_sees_the_project(edges: list[Edge]) -> None:
    """The walk found the packages and their imports (an empty graph would pass everything below)."""
    assert {"protocol", "agent", "collector", "fleet"} <= set(PACKAGES)
    assert len(edges) > 100
    assert {_package(e.source) for e in edges} >= {"agent", "collector", "fleet"}


def test_no_circle_among_the_project_modules(edges: list[Edge]) -> None:
    """No module imports itself through others, TYPE_CHECKING and function-local imports included."""
    graph: dict[str, list[str]] = {}
    for e in edges:
        graph.setdefault(e.source, []).append(e.target)
    cycles = find_cycles(graph)
    where = {(e.source, e.target): e.where for e in edges}
    report = [
        " -> ".join(cycle)
        + "\n"
        + "\n".join(f"    {where[a, b]}: {a} imports {b}" for a, b in itertools.pairwise(cycle))
        for cycle in cycles
    ]
    assert not cycles, "import circles:\n  " + "\n  ".join(report)


def test_agent_and_collector_never_import_each_other(edges: list[Edge]) -> None:
    """The device daemon and the server share only protocol (and runtime): no import either way."""
    crossing = [e for e in edges if {_package(e.source), _package(e.target)} == {"agent", "collector"}]
    assert not crossing, "agent and collector import each other:\n" + _listing(crossing)


def test_protocol_imports_no_other_project_package(edges: list[Edge]) -> None:
    """protocol is the bottom layer: it imports nothing of the project but itself."""
    uphill = [e for e in edges if _package(e.source) == "protocol" and _package(e.target) != "protocol"]
    assert not uphill, "protocol imports upward:\n" + _listing(uphill)


def test_no_import_runs_uphill(edges: list[Edge]) -> None:
    """Every import goes to the same layer or below (protocol < runtime < agent, collector < fleet)."""
    uphill = [e for e in edges if LAYERS[_package(e.target)] > LAYERS[_package(e.source)]]
    assert not uphill, "imports into a higher layer:\n" + _listing(uphill)


def test_the_agent_holds_no_simulator_and_no_test_clock() -> None:
    """The device package has no simulator module and defines no test clock: its sense of time is the system's."""
    modules = project_modules(["agent"])
    simulators = [name for name in modules if any(SIMULATOR_NAME.search(part) for part in name.split("."))]
    clocks: list[str] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                defined = [node.name]
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                continue
            clocks.extend(
                f"{path.relative_to(ROOT)}:{node.lineno}: {name} defines {d}" for d in defined if d in TEST_CLOCKS
            )
    assert not simulators, f"simulator modules in agent/: {simulators}"
    assert not clocks, "test clocks in the device package:\n  " + "\n  ".join(clocks)
