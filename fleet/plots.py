"""Static plots: the fleet simulator's report (``ldp-fleet --plots``) and the benchmarks' figures.

This module is the project's one plotter for files; the collector's dashboard draws its own
charts in the browser (``collector/dashboard.py``), and those two are the only chart code.
Everything here goes through matplotlib's Agg canvas (no display, no pyplot and its global
state) and is saved as SVG with its text kept as text, so a label can be searched for and
read by a screen reader.

Readable axes are the point of having one module:

* value axes have round ticks at a 1-2-2.5-5 step, zero among them whenever the range spans
  it (bars always start at zero), and thousands separators (``12,500``); a log axis labels
  its decades only;
* category labels are shortened, turned when they would not fit side by side, and thinned
  to a round stride; :func:`layout_problems` then measures every drawn text and the
  functions here drop any tick label that still touches its neighbour, so none overlap;
* a constrained layout keeps every label inside the figure, titles are wrapped to its width,
  and every axis has a title (with its unit where there is one).

Charts are built by :func:`estimate_chart`, :func:`bar_chart` and :func:`line_chart`, which
return the figure, and written by :func:`save_svg`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import itertools
import math
import textwrap
import unicodedata
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import matplotlib as mpl
from matplotlib import dates as mdates
from matplotlib import font_manager, ticker
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ft2font import FT2Font
from matplotlib.text import Text

__all__ = [
    "Series",
    "bar_chart",
    "estimate_chart",
    "layout_problems",
    "line_chart",
    "save_svg",
]

# Size in inches at 96 px per inch: 768 x 360 px, the width the old hand-drawn charts had.
_SIZE = (8.0, 3.75)
_DPI = 96
_TITLE_CHARS = 80  # characters per title line at 11 pt across the figure
_LABEL_CHARS = 18  # a category label under a column longer than this is shortened with an ellipsis
_ROW_LABEL_CHARS = 32  # the same for a label left of a row, where there is more room

TRUTH_COLOR = "#98a2b3"
TRUTH_BAR_COLOR = "#c7d7f5"
ESTIMATE_COLOR = "#2f6fde"

# Kept to this module's figures through rc_context, never set globally: a caller's own
# matplotlib settings are left as they were.
_STYLE: dict[Any, Any] = {  # keys are rcParams names (typed as a Literal in newer matplotlib)
    "font.size": 9,
    "axes.titlesize": 11,
    "axes.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.grid.axis": "y",
    "axes.axisbelow": True,
    "grid.color": "#eaecf0",
    "legend.frameon": False,
    # Labels are data (use-case values may hold "$"), never TeX.
    "text.parse_math": False,
    "text.usetex": False,
    # Text stays <text> in the SVG (searchable, smaller); ids are stable from run to run.
    "svg.fonttype": "none",
    "svg.hashsalt": "ldp-telemetry",
}


@contextlib.contextmanager
def _drawing() -> Iterator[None]:
    """This module's settings, and quiet about glyphs its font lacks (an emoji among the values):
    the SVG keeps the character as text and the viewer's fonts draw it; only the measuring
    here takes the missing glyph's box for its width."""
    with mpl.rc_context(_STYLE), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        yield


# --------------------------------------------------------------------------- number formats


def _decimals(step: float) -> int:
    """The fewest decimals that write every multiple of ``step`` exactly (0.25 -> 2, 500 -> 0)."""
    for d in range(12):
        if abs(round(step, d) - step) <= abs(step) * 1e-9:
            return d
    return 12


class _Plain(ticker.Formatter):
    """Tick labels of a linear axis: thousands separators, the decimals the tick step needs,
    and ``0`` (never ``-0`` or ``1e-17``) at zero."""

    def __init__(self) -> None:
        self._ticks: list[float] = []

    def set_locs(self, locs: Sequence[float]) -> None:
        # The axis hands over all its ticks before asking for labels: the step comes from them.
        self._ticks = sorted(float(v) for v in locs)

    def __call__(self, x: float, pos: int | None = None) -> str:
        locs = self._ticks
        steps = [b - a for a, b in itertools.pairwise(locs) if b > a]
        step = min(steps) if steps else (abs(x) or 1.0)
        if abs(x) < step * 1e-6:
            return "0"
        return f"{x:,.{_decimals(step)}f}"


class _Log(ticker.Formatter):
    """Tick labels of a log axis: decades, and 2 and 5 times them when the view spans three decades
    or less (else they crowd); plain from 0.001 to 1,000,000 (``0.02``, ``50,000``), else ``2e-5``."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        if x <= 0 or not math.isfinite(x):
            return ""
        exponent = math.floor(math.log10(x) + 1e-9)
        mantissa = round(x / 10.0**exponent, 6)
        lo, hi = sorted(self.axis.get_view_interval()) if self.axis is not None else (x, x)
        wide = lo > 0 and math.log10(hi / lo) > 3
        if mantissa not in ((1.0,) if wide else (1.0, 2.0, 5.0)):
            return ""
        if -3 <= exponent <= 6:
            return f"{x:,.{max(0, -exponent)}f}"
        return f"{mantissa:g}e{exponent}"


def _number(x: float) -> str:
    """A value on a fixed tick (an ε of a benchmark): as short as it is exact, thousands grouped."""
    return f"{x:,.{_decimals(x) if x != 0 else 0}f}" if abs(x) >= 1 or x == 0 else f"{x:g}"


def _value_axis(axis: Axis, *, log: bool = False) -> None:
    if log:
        axis.set_major_locator(ticker.LogLocator(base=10.0, subs=(1.0, 2.0, 5.0), numticks=12))
        axis.set_major_formatter(_Log())
        axis.set_minor_formatter(ticker.NullFormatter())
    else:
        axis.set_major_locator(ticker.MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
        axis.set_major_formatter(_Plain())


# --------------------------------------------------------------------------- layout


def _new_figure(*, height: float = _SIZE[1]) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(_SIZE[0], height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)  # the raster canvas measures text; nothing is shown
    return fig, fig.add_subplot()


def _renderer(fig: Figure) -> Any:
    """The figure laid out and drawn (to nothing) once, and the renderer that measures its text."""
    canvas = fig.canvas
    assert isinstance(canvas, FigureCanvasAgg)
    fig.draw_without_rendering()
    return canvas.get_renderer()  # type: ignore[no-untyped-call]


def _short(text: str, chars: int = _LABEL_CHARS) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


@functools.cache
def _drawable() -> frozenset[int]:
    """The code points some font on this machine has a glyph for (the fonts matplotlib knows)."""
    points: set[int] = set()
    # A last-resort font maps every code point to the very box this avoids.
    fonts = font_manager.fontManager.ttflist
    for path in {f.fname for f in fonts if "lastresort" not in f.name.lower().replace(" ", "")}:
        with contextlib.suppress(OSError, RuntimeError):
            points.update(FT2Font(path).get_charmap())
    return frozenset(points)


def _readable(text: str) -> str:
    """``text``, followed by the code points of the characters no font here draws (an emoji on a
    machine without an emoji font shows as an empty box): ``🙏 (U+1F64F)``. The character stays,
    for a viewer whose fonts have it; joiners and variation selectors draw nothing and are skipped."""
    drawable = _drawable()
    missing = [
        f"U+{ord(c):04X}"
        for c in dict.fromkeys(text)
        if ord(c) not in drawable and unicodedata.category(c) not in ("Cf", "Mn", "Cc")
    ]
    return f"{text} ({' '.join(missing)})" if missing else text


def _titles(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(textwrap.fill(title, _TITLE_CHARS), loc="left")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def _nice_stride(every: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 25, 50, 100, ... that is at least ``every``."""
    scale = 1
    while True:
        for m in (1, 2, 2.5, 5):
            if m * scale >= every and float(m * scale).is_integer():
                return int(m * scale)
        scale *= 10


def _category_axis(fig: Figure, ax: Axes, labels: Sequence[str]) -> None:
    """Category labels, level, under slots 0..n-1: all of them if they fit side by side, else a
    round stride of them (1, 2, 5, 10, ...). Labels are never turned: a turned label's box is
    not what the overlap check measures, and a reader tilts their head."""
    shown = [_readable(_short(label)) for label in labels]
    n = len(shown)
    ax.set_xlim(-0.6, max(n, 1) - 0.4)
    # No tick marks under slots; the labels sit low enough to clear the value axis's "0", which
    # is centred on the bottom edge when bars start at zero (a wide first label reaches under it).
    ax.tick_params(axis="x", length=0, pad=7)
    if n == 0:
        ax.set_xticks([])
        return
    ax.set_xticks(range(n), shown)
    renderer = _renderer(fig)
    widest = max(t.get_window_extent(renderer).width for t in ax.get_xticklabels())
    slot = ax.get_window_extent(renderer).width / (n + 0.2)
    every = _nice_stride(math.ceil((widest + 8) / slot))
    if every > 1:
        ax.set_xticks(range(0, n, every), shown[::every])


def _row_axis(ax: Axes, labels: Sequence[str]) -> None:
    """Category labels down the left, the first at the top: one row each, all of them shown."""
    ax.set_yticks(range(len(labels)), [_readable(_short(label, _ROW_LABEL_CHARS)) for label in labels])
    ax.set_ylim(len(labels) - 0.4, -0.6)
    ax.tick_params(axis="y", length=0)


def _drawn(text: Text) -> bool:
    return bool(text.get_visible() and text.get_text().strip())


def _undrawn_ticks(fig: Figure) -> set[int]:
    """Ids of the tick labels matplotlib keeps but does not draw (their tick is outside the view)."""
    hidden: set[int] = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            slack = (hi - lo) * 1e-9
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                if not lo - slack <= tick.get_loc() <= hi + slack:
                    hidden.update((id(tick.label1), id(tick.label2)))
    return hidden


def _boxes_overlap(a: Any, b: Any) -> bool:
    return bool(a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1)


def _drop_crowded_ticks(fig: Figure) -> None:
    """Hide any tick label that overlaps the last one kept, along each axis (the safety net)."""
    renderer = _renderer(fig)
    hidden = _undrawn_ticks(fig)
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            kept = None
            for label in axis.get_ticklabels():
                if not _drawn(label) or id(label) in hidden:
                    continue
                box = label.get_window_extent(renderer)
                if kept is not None and _boxes_overlap(box, kept):
                    label.set_visible(False)
                else:
                    kept = box


def layout_problems(fig: Figure) -> list[str]:
    """What a reader could not read: drawn texts that overlap another or leave the figure.

    The same check the dashboard runs on its charts in the browser (``layoutProblems``);
    tests assert it is empty for every chart this module draws.
    """
    with _drawing():
        renderer = _renderer(fig)
        hidden = _undrawn_ticks(fig)
        boxes = [
            (t.get_text(), t.get_window_extent(renderer))
            for t in fig.findobj(Text)
            if isinstance(t, Text) and _drawn(t) and id(t) not in hidden
        ]
    frame = fig.bbox
    problems = []
    for i, (text, box) in enumerate(boxes):
        if box.x0 < frame.x0 - 0.5 or box.x1 > frame.x1 + 0.5 or box.y0 < frame.y0 - 0.5 or box.y1 > frame.y1 + 0.5:
            problems.append(f"{text!r} leaves the figure")
        for other, obox in boxes[i + 1 :]:
            if _boxes_overlap(box, obox):
                problems.append(f"{text!r} overlaps {other!r}")
    return problems


def _legend(fig: Figure) -> None:
    entries = len(fig.axes[0].get_legend_handles_labels()[1])
    fig.legend(loc="outside lower center", ncols=min(max(entries, 1), 6))


# --------------------------------------------------------------------------- charts


Series: TypeAlias = tuple[str, Sequence[float], str]
"""One series of :func:`bar_chart` or :func:`line_chart`: its name, values and colour."""


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _drawn_points(
    chart: str, name: str, at: Sequence[float], values: Sequence[float], what: str, *, positive: bool = False
) -> tuple[list[float], list[float]]:
    """The ``(at, value)`` points of series ``name`` that are drawn, as two lists: its finite
    values (and only those above zero where ``positive``, as a log axis needs); a ValueError
    naming ``chart`` unless the series has one value for each of the ``what`` in ``at``."""
    if len(values) != len(at):
        raise ValueError(f"{chart}: series {name!r} has {len(values)} values for {len(at)} {what}")
    kept = [(a, v) for a, v in zip(at, values, strict=True) if math.isfinite(v) and (v > 0 or not positive)]
    return [a for a, _ in kept], [v for _, v in kept]


def _draw_truth(
    fig: Figure,
    ax: Axes,
    x: Sequence[str] | Sequence[dt.datetime],
    positions: list[Any],
    truth: Sequence[float],
    *,
    over_time: bool,
    rows: bool,
) -> None:
    """The truth: a line on a date axis over time, else bars in columns (or in rows) with their labels."""
    if over_time:
        ax.plot(positions, truth, color=TRUTH_COLOR, linewidth=2, marker="o", markersize=3, label="truth")
        locator = mdates.AutoDateLocator(minticks=3, maxticks=7)  # type: ignore[no-untyped-call]
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    elif rows:
        ax.barh(positions, truth, height=0.7, color=TRUTH_BAR_COLOR, label="truth")
        _row_axis(ax, [str(v) for v in x])
    else:
        ax.bar(positions, truth, width=0.7, color=TRUTH_BAR_COLOR, label="truth")
        _category_axis(fig, ax, [str(v) for v in x])


def estimate_chart(
    *,
    title: str,
    x: Sequence[str] | Sequence[dt.datetime],
    truth: Sequence[float],
    estimate: Sequence[float | None],
    standard_error: Sequence[float | None],
    z: float,
    value_label: str,
    category_label: str,
    rows: bool = False,
) -> Figure:
    """Estimates as points with ``± z·SE`` error bars against the truth.

    With datetimes for ``x`` (periods over time) the truth is a line on a date axis, whose
    value axis fits the data (a mean far from zero keeps its detail). With labels (buckets,
    values) the truth is bars from zero, in columns, or with ``rows`` one row per label
    down the left (long labels, such as a top-20 of strings, stay whole and level). Missing
    estimates are left out, one by one; an estimate without a standard error has no bar.

    Raises:
        ValueError: the four sequences differ in length.
    """
    if not len(x) == len(truth) == len(estimate) == len(standard_error):
        raise ValueError(
            f"estimate_chart: x, truth, estimate and standard_error have lengths {len(x)}, {len(truth)}, "
            f"{len(estimate)} and {len(standard_error)}; they must be equal"
        )
    over_time = bool(x) and all(isinstance(v, dt.datetime) for v in x)
    rows = rows and not over_time
    with _drawing():
        fig, ax = _new_figure(height=max(_SIZE[1], 1.6 + 0.24 * len(x)) if rows else _SIZE[1])
        positions: list[Any] = list(x) if over_time else list(range(len(x)))
        _draw_truth(fig, ax, x, positions, truth, over_time=over_time, rows=rows)
        points = [
            (p, float(e), z * s if s is not None and _finite(s) else 0.0)
            for p, e, s in zip(positions, estimate, standard_error, strict=True)
            if e is not None and _finite(e)
        ]
        if points:
            at = [p for p, _, _ in points]
            values = [v for _, v, _ in points]
            errors = [e for _, _, e in points]
            # Any: matplotlib's errorbar keywords, of several types.
            style: dict[str, Any] = {"fmt": "o", "markersize": 4, "color": ESTIMATE_COLOR, "capsize": 2}
            label = f"estimate ± {z:g} SE"
            if rows:
                drawn = ax.errorbar(values, at, xerr=errors, label=label, **style)
            else:
                drawn = ax.errorbar(at, values, yerr=errors, label=label, **style)
            drawn.lines[0].set_gid("estimates")
        if not over_time:
            # Bars start at zero, and an empty chart still has a value axis.
            lo, hi = ax.get_xlim() if rows else ax.get_ylim()
            lo, hi = (min(lo, 0.0), hi) if points or any(truth) else (0.0, 1.0)
            if rows:
                ax.set_xlim(lo, hi)
            else:
                ax.set_ylim(lo, hi)
        _value_axis(ax.xaxis if rows else ax.yaxis)
        if rows:
            ax.grid(True, axis="x")
            ax.grid(False, axis="y")
        _titles(ax, title, value_label if rows else category_label, category_label if rows else value_label)
        if x:
            _legend(fig)
        else:
            ax.text(0.5, 0.5, "nothing to show", transform=ax.transAxes, ha="center", va="center", color="#667085")
        _drop_crowded_ticks(fig)
    return fig


def bar_chart(
    *,
    title: str,
    labels: Sequence[str],
    series: Sequence[Series],
    ylabel: str,
    xlabel: str,
) -> Figure:
    """Overlaid bars, one slot per label: the first series wide, later ones narrower on top.

    ``series`` holds ``(name, values, colour)``; non-finite values are left out.
    """
    with _drawing():
        fig, ax = _new_figure()
        positions = range(len(labels))
        for i, (name, values, color) in enumerate(series):
            xs, ys = _drawn_points("bar_chart", name, positions, values, "labels")
            ax.bar(
                xs,
                ys,
                width=0.9 if i == 0 else 0.5,
                color=color,
                alpha=0.9 if i == 0 else 0.75,
                label=name,
            )
        _category_axis(fig, ax, labels)
        _value_axis(ax.yaxis)
        _titles(ax, title, xlabel, ylabel)
        _legend(fig)
        _drop_crowded_ticks(fig)
    return fig


def line_chart(
    *,
    title: str,
    x: Sequence[float],
    series: Sequence[Series],
    ylabel: str,
    xlabel: str,
    log_y: bool = True,
) -> Figure:
    """Lines over a log x axis with a tick at each ``x`` (the ε of a sweep); log y by default.

    ``series`` holds ``(name, values, colour)``; non-finite values (and, on a log axis,
    values at or below zero) are left out.
    """
    with _drawing():
        fig, ax = _new_figure()
        ax.set_xscale("log")
        if log_y:
            ax.set_yscale("log")
        for name, values, color in series:
            xs, ys = _drawn_points("line_chart", name, x, values, "x values", positive=log_y)
            ax.plot(xs, ys, color=color, linewidth=2, marker="o", markersize=3, label=name)
        ax.xaxis.set_major_locator(ticker.FixedLocator(list(x)))
        ax.xaxis.set_major_formatter(ticker.FixedFormatter([_number(v) for v in x]))
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        _value_axis(ax.yaxis, log=log_y)
        ax.grid(True, which="major", axis="both", color="#eaecf0")
        _titles(ax, title, xlabel, ylabel)
        _legend(fig)
        _drop_crowded_ticks(fig)
    return fig


def save_svg(fig: Figure, path: Path) -> Path:
    """Write ``fig`` to ``path`` as SVG (its directory made if missing) and return ``path``.

    The file carries no creation date, so the same figure gives the same bytes.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with _drawing():
        fig.savefig(path, format="svg", metadata={"Date": None})
    return path
