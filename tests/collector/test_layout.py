"""The collector's dependency rules: no agent, no MQTT client library, no dev-only scipy."""

from __future__ import annotations

import ast
from pathlib import Path

COLLECTOR = Path(__file__).resolve().parents[2] / "collector"


def _imports_by_module() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in COLLECTOR.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[path.relative_to(COLLECTOR).as_posix()] = names
    return found


def test_only_the_mqtt_adapter_speaks_mqtt_and_no_client_library_is_used() -> None:
    """MQTT lives in collector/mqtt/ alone, on asyncio streams (no paho, no aiomqtt anywhere)."""
    imports = _imports_by_module()
    assert not any(names & {"paho", "aiomqtt"} for names in imports.values())
    sockets = {name for name, names in imports.items() if names & {"socket", "ssl"}}
    assert sockets <= {"mqtt/transport.py", "mqtt/tls.py"}  # the systemd notify datagram is runtime/sd_notify.py's


def test_collector_needs_no_dev_only_dependency() -> None:
    """scipy is a dev extra: the collector's estimators use numpy and the standard library."""
    assert not any(names & {"scipy", "sklearn", "agent"} for names in _imports_by_module().values())
