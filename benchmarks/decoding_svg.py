"""Small self-contained SVG charts for the decoding benchmarks (no plotting library is installed).

Only what the benchmarks draw: grouped bar charts (a histogram and its estimate, as in 004
Fig. 4-5) and line charts on a log-x axis (error against ε, as in 000 Fig. 2). Files go
under ``benchmarks/out/`` (git-ignored).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).resolve().parent / "out"

_W, _H = 760, 360
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 20, 40, 50


def _frame(title: str, ylabel: str, xlabel: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" font-family="sans-serif" font-size="11">',
        f'<rect width="{_W}" height="{_H}" fill="white"/>',
        f'<text x="{_W / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
        f'<text x="{_W / 2}" y="{_H - 10}" text-anchor="middle">{escape(xlabel)}</text>',
        f'<text x="15" y="{_H / 2}" text-anchor="middle" transform="rotate(-90 15 {_H / 2})">{escape(ylabel)}</text>',
    ]


def _y_axis(lines: list[str], low: float, high: float, scale_y: object) -> None:
    ticks = 5
    for t in range(ticks + 1):
        v = low + (high - low) * t / ticks
        y = scale_y(v)  # type: ignore[operator]
        lines.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        lines.append(f'<text x="{_LEFT - 5}" y="{y + 4:.1f}" text-anchor="end">{v:.3g}</text>')


def bar_chart(
    path: Path,
    *,
    title: str,
    labels: Sequence[str],
    series: Sequence[tuple[str, Sequence[float], str]],
    ylabel: str = "",
    xlabel: str = "",
    label_every: int = 1,
) -> Path:
    """Overlaid bars (later series narrower, drawn on top), one group per label; returns ``path``."""
    values = [v for _, vals, _ in series for v in vals if math.isfinite(v)]
    low, high = min(0.0, *values), max(values) if values else 1.0
    if high <= low:
        high = low + 1
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def sy(v: float) -> float:
        return _TOP + plot_h * (high - v) / (high - low)

    lines = _frame(title, ylabel, xlabel)
    _y_axis(lines, low, high, sy)
    slot = plot_w / max(len(labels), 1)
    for s, (_, vals, color) in enumerate(series):
        width = slot * (0.9 if s == 0 else 0.5)
        for i, v in enumerate(vals):
            if not math.isfinite(v):
                continue
            x = _LEFT + slot * i + (slot - width) / 2
            top, bottom = sy(max(v, 0.0)), sy(min(v, 0.0))
            lines.append(
                f'<rect x="{x:.2f}" y="{top:.2f}" width="{width:.2f}" height="{max(bottom - top, 0.0):.2f}" '
                f'fill="{color}" fill-opacity="{0.9 if s == 0 else 0.75}"/>'
            )
    for i, lab in enumerate(labels):
        if i % label_every == 0:
            x = _LEFT + slot * (i + 0.5)
            lines.append(f'<text x="{x:.1f}" y="{_TOP + plot_h + 14}" text-anchor="middle">{escape(lab)}</text>')
    _legend(lines, [(name, color) for name, _, color in series])
    lines.append("</svg>")
    return _write(path, lines)


def line_chart(
    path: Path,
    *,
    title: str,
    x: Sequence[float],
    series: Sequence[tuple[str, Sequence[float], str]],
    ylabel: str = "",
    xlabel: str = "",
    log_y: bool = True,
) -> Path:
    """Lines over a log-scaled x axis (and log y by default); returns ``path``."""
    ys = [v for _, vals, _ in series for v in vals if math.isfinite(v) and (v > 0 or not log_y)]

    def tf(v: float) -> float:
        return math.log10(v) if log_y else v

    low, high = tf(min(ys)), tf(max(ys))
    if high <= low:
        high = low + 1
    lx = [math.log10(v) for v in x]
    x0, x1 = min(lx), max(lx)
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def sx(v: float) -> float:
        return _LEFT + plot_w * (math.log10(v) - x0) / ((x1 - x0) or 1)

    def sy(v: float) -> float:
        return _TOP + plot_h * (high - tf(v)) / (high - low)

    lines = _frame(title, ylabel, xlabel)
    for t in range(6):
        raw = low + (high - low) * t / 5
        value = 10**raw if log_y else raw
        y = _TOP + plot_h * (high - raw) / (high - low)
        lines.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        lines.append(f'<text x="{_LEFT - 5}" y="{y + 4:.1f}" text-anchor="end">{value:.3g}</text>')
    for v in x:
        lines.append(f'<text x="{sx(v):.1f}" y="{_TOP + plot_h + 14}" text-anchor="middle">{v:g}</text>')
    for _, vals, color in series:
        pts = " ".join(f"{sx(a):.1f},{sy(b):.1f}" for a, b in zip(x, vals, strict=True) if math.isfinite(b) and b > 0)
        lines.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
    _legend(lines, [(name, color) for name, _, color in series])
    lines.append("</svg>")
    return _write(path, lines)


def _legend(lines: list[str], entries: Sequence[tuple[str, str]]) -> None:
    for i, (name, color) in enumerate(entries):
        y = _TOP + 6 + 16 * i
        lines.append(f'<rect x="{_W - _RIGHT - 170}" y="{y}" width="12" height="10" fill="{color}"/>')
        lines.append(f'<text x="{_W - _RIGHT - 152}" y="{y + 9}">{escape(name)}</text>')


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
