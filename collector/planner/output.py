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


_TABLE_COLUMNS = (
    ("mechanism", "mechanism"),
    ("parameters", "parameters"),
    ("standard_error", "SE of a count"),
    ("variance_vs_best", "variance vs best"),
    ("report_bytes", "record bytes"),
    ("decode_ops", "decode ops"),
)


def _cell(key: str, value: Any) -> str:
    if key == "variance_vs_best":
        return f"{value:,.2f}x" if value < 1000 else f"{value:,.0f}x"
    if key == "decode_ops":
        return "n/a" if not math.isfinite(value) else f"{value:.3g}"
    if key == "standard_error":
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(rows: list[Result]) -> list[str]:
    """The rows aligned under their headers (text left, numbers right)."""
    cells = [[h for _, h in _TABLE_COLUMNS]] + [[_cell(k, r[k]) for k, _ in _TABLE_COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(_TABLE_COLUMNS))]
    out = []
    for row in cells:
        parts = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.append("    " + "  ".join(parts).rstrip())
    return out


def text(result: Result) -> str:
    """The plan as lines of ``name: value``, solved values marked, then the options and the formulas."""
    if "plans" in result:
        blocks = [text({**plan, "mechanism": plan.get("current", ""), "formulas": []}) for plan in result["plans"]]
        tail = ["from:", *(f"  {f}" for f in result["formulas"])]
        return "\n\n".join(b.rsplit("\n  from:", 1)[0] for b in blocks) + "\n\n" + "\n".join(tail)
    lines = [f"plan: {result['mechanism']}" + (f" (use case {result['use_case']})" if "use_case" in result else "")]
    solved = result.get("solved", {})
    for key, value in result.items():
        if key in ("mechanism", "formulas", "options", "solved", "use_case", "table"):
            continue
        mark = "  (solved)" if key in solved else ""
        lines.append(f"  {key.replace('_', ' ')}: {_fmt(value)}{mark}")
    if "options" in result:
        lines.append("  options:")
        for row in result["options"]:
            lines.append("    " + ", ".join(f"{k.replace('_', ' ')} {_fmt(v)}" for k, v in row.items()))
    if "table" in result:
        lines.append("  mechanisms:")
        lines.extend(_table(result["table"]))
    lines.append("  from:")
    lines.extend(f"    {f}" for f in result["formulas"])
    return "\n".join(lines)
