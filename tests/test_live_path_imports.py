"""The running collector never loads the planner: ``collector.planner`` is the ``plan`` verb's alone.

The live path is what the service runs (ingest, the materialised aggregates, estimates, the
HTTP API). What it needs of the planner's reasoning, the ``T`` word discovery is decoded
with, lives in ``collector.decoding.discovery_settings``. Two checks: a fresh interpreter
that imports the live path holds no planner module, and no import in the graph (function-local
and ``TYPE_CHECKING`` ones included, as ``tests/test_import_graph.py`` counts them) leads from
the live path to the planner.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Mapping

from tests.test_import_graph import ROOT, import_edges, project_modules

LIVE_PATH = ("collector.service", "collector.live", "collector.http", "collector.estimation", "collector.ingest")
"""The modules the running service imports to ingest, estimate and serve."""

PLANNER = "collector.planner"


def _loaded_after(imports: Iterable[str]) -> list[str]:
    """The planner's modules in ``sys.modules`` of a fresh interpreter once it imported ``imports``."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {list(imports)!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m == {PLANNER!r} or m.startswith({PLANNER + '.'!r}))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def _path_to(graph: Mapping[str, Iterable[str]], starts: Iterable[str], wanted: str) -> list[str] | None:
    """The shortest import path from one of ``starts`` to ``wanted`` or a module under it, if any."""
    parent: dict[str, str | None] = dict.fromkeys(starts)
    frontier = list(parent)
    while frontier:
        following = []
        for v in frontier:
            if v == wanted or v.startswith(wanted + "."):
                path = [v]
                while (p := parent[path[-1]]) is not None:
                    path.append(p)
                return path[::-1]
            for w in sorted(graph.get(v, ())):
                if w not in parent:
                    parent[w] = v
                    following.append(w)
        frontier = following
    return None


def test_importing_the_live_path_loads_no_planner_module() -> None:
    """A fresh interpreter that imports the service, live view, HTTP, estimation and ingest holds no planner module."""
    assert _loaded_after(LIVE_PATH) == []


def test_the_probe_sees_the_planner_once_it_is_loaded() -> None:
    """The check can fail: importing the ``plan`` verb's package puts its modules in ``sys.modules``."""
    loaded = _loaded_after([PLANNER])
    assert PLANNER in loaded
    assert f"{PLANNER}.cli" in loaded


def test_no_import_leads_from_the_live_path_to_the_planner() -> None:
    """No chain of imports, function-local ones included, runs from a live-path module into the planner."""
    graph: dict[str, list[str]] = {}
    for edge in import_edges(project_modules()):
        graph.setdefault(edge.source, []).append(edge.target)
    assert PLANNER in graph, "the import graph does not see the planner package"
    assert _path_to(graph, ["collector.cli"], PLANNER), "the path finder misses the plan verb's own import"
    path = _path_to(graph, LIVE_PATH, PLANNER)
    assert path is None, "the live path imports the planner: " + " -> ".join(path or [])
