"""The agent calls its mechanisms in one module only, agent/mechanism_calls.py, so a change of the
mechanism contract (protocol.interfaces.Mechanism) is met there and nowhere else in the agent."""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent"
SEAM = "mechanism_calls.py"


def _mechanism_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls of a mechanism's methods (``x.mechanism.m(...)``) and names bound to a mechanism."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "mechanism"
        ):
            found.append((node.lineno, f"calls mechanism.{node.func.attr}()"))
        if isinstance(node, ast.Assign | ast.AnnAssign) and (
            isinstance(node.value, ast.Attribute) and node.value.attr == "mechanism"
        ):
            found.append((node.lineno, "binds a name to a mechanism"))
    return found


def test_only_the_mechanism_calls_module_calls_a_mechanism() -> None:
    """No module of the agent but agent/mechanism_calls.py calls a mechanism's method or holds a mechanism."""
    offenders = [
        f"agent/{path.name}:{line}: {what}"
        for path in sorted(AGENT.glob("*.py"))
        if path.name != SEAM
        for line, what in _mechanism_uses(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert offenders == []
    assert _mechanism_uses(ast.parse((AGENT / SEAM).read_text(encoding="utf-8")))  # the check sees calls
