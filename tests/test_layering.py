"""The dependency direction holds: agent -> runtime -> protocol <- runtime <- collector, fleet on top."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(package: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_protocol_imports_neither_agent_nor_collector() -> None:
    """protocol/ is the shared core and depends on neither side."""
    assert not _imports("protocol") & {"agent", "collector"}


def test_protocol_is_pure() -> None:
    """protocol/ does no I/O of its own: no asyncio, sockets, logging set-up or module-level random."""
    assert not _imports("protocol") & {"asyncio", "socket", "random", "aiomqtt", "paho", "sqlite3"}


def test_protocol_starts_no_thread() -> None:
    """protocol/ makes no thread or pool and asks nothing of the host's CPUs: the caller passes its threads."""
    starters = {"ThreadPoolExecutor", "ProcessPoolExecutor", "Thread", "cpu_count", "threading", "multiprocessing"}
    found: set[str] = set()
    for path in (ROOT / "protocol").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            imported = (
                {a.name.split(".")[-1] for a in node.names} if isinstance(node, ast.Import | ast.ImportFrom) else set()
            )
            found.update(f"{path.relative_to(ROOT)}: {n}" for n in ({name} | imported) & starters)
    assert not found, sorted(found)


def test_protocol_does_not_import_runtime() -> None:
    """protocol/ stays pure: it never uses the host plumbing of runtime/."""
    assert "runtime" not in _imports("protocol")


def test_runtime_imports_only_protocol_of_the_project() -> None:
    """runtime/ serves agent and collector, so it imports neither of them, nor the simulator."""
    assert not _imports("runtime") & {"agent", "collector", "fleet"}


def test_runtime_stays_light() -> None:
    """runtime/ is part of a device's base install: no server, plotting or test library."""
    server = {"scipy", "sklearn", "matplotlib", "aiohttp", "starlette", "uvicorn", "prometheus_client", "psycopg"}
    assert not _imports("runtime") & (server | {"pytest", "hypothesis"})


def test_agent_and_collector_do_not_import_each_other() -> None:
    """The agent never imports the collector and vice versa."""
    assert "collector" not in _imports("agent")
    assert "agent" not in _imports("collector")


def test_nothing_imports_the_simulator() -> None:
    """The fleet simulator is a package of its own on top: protocol, agent and collector never import it."""
    for package in ("protocol", "runtime", "agent", "collector"):
        assert "fleet" not in _imports(package), package


def test_the_agent_holds_no_simulator() -> None:
    """No simulator module ships in the device package."""
    assert not list((ROOT / "agent").glob("fleet*.py"))


def test_agent_stays_light() -> None:
    """The agent never imports what only the server needs."""
    assert not _imports("agent") & {"scipy", "sklearn", "matplotlib"}


def test_the_agent_holds_no_test_clock() -> None:
    """No fake or accelerated clock ships to a device, and nothing there selects a clock from the environment."""
    for package in ("agent", "runtime"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for word in ("FakeClock", "AcceleratedClock", "LDP_AGENT_TEST_CLOCK", "TEST_CLOCK"):
                assert word not in text, f"{path.relative_to(ROOT)} mentions {word}"
    clock = ast.parse((ROOT / "runtime" / "clock.py").read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(clock) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(clock) if isinstance(node, ast.ImportFrom)}
    assert "os" not in imported, "runtime/clock.py reads no environment"
