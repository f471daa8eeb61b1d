"""How a plan is printed: as text for people, or as JSON (non-finite numbers as ``null``)."""

from __future__ import annotations

import math
from typing import Any

from collector.planner.inputs import Result

__all__ = ["plain", "text"]


def plain(value: Any) -> Any:
    """JSON-safe: non-finite floats become ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.4g}"
        return f"{value:.6g}"
    return str(value)


def text(result: Result) -> str:
    """The plan as lines of ``name: value``, solved values marked, then the options and the formulas."""
    lines = [f"plan: {result['mechanism']}" + (f" (use case {result['use_case']})" if "use_case" in result else "")]
    solved = result.get("solved", {})
    for key, value in result.items():
        if key in ("mechanism", "formulas", "options", "solved", "use_case"):
            continue
        mark = "  (solved)" if key in solved else ""
        lines.append(f"  {key.replace('_', ' ')}: {_fmt(value)}{mark}")
    if "options" in result:
        lines.append("  options:")
        for row in result["options"]:
            lines.append("    " + ", ".join(f"{k.replace('_', ' ')} {_fmt(v)}" for k, v in row.items()))
    lines.append("  from:")
    lines.extend(f"    {f}" for f in result["formulas"])
    return "\n".join(lines)
