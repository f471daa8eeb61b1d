"""The one file plotter (fleet.plots): valid SVG with readable axes, for the fleet report and the benchmarks."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from fleet.plots import bar_chart, estimate_chart, layout_problems, line_chart, save_svg

SVG = "{http://www.w3.org/2000/svg}"


def _texts(path: Path) -> list[str]:
    root = ET.fromstring(path.read_text(encoding="utf-8"))
    assert root.tag == f"{SVG}svg"
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def _tick_labels(fig: Figure, axis: str) -> list[str]:
    """The tick labels a reader sees on ``axis`` ("x" or "y"): drawn, inside the view."""
    ax = fig.axes[0]
    which = ax.xaxis if axis == "x" else ax.yaxis
    lo, hi = sorted(which.get_view_interval())
    return [
        t.label1.get_text()
        for t in which.get_major_ticks()
        if lo <= t.get_loc() <= hi and t.label1.get_visible() and t.label1.get_text()
    ]


def _benchmark_bars(n: int) -> Figure:
    return bar_chart(
        title="004 §5.2: population (grey) and strings detected (dark red; E[false positives] <= 2), last seed",
        labels=[str(i + 1) for i in range(n)],
        series=[
            ("true count", [25_000 * math.exp(-i / 20) for i in range(n)], "#999999"),
            ("estimated count", [25_000 * math.exp(-i / 20) - 900 for i in range(n)], "#8b0000"),
        ],
        ylabel="count",
        xlabel="string",
    )


def test_a_crowded_bar_chart_reads_right(tmp_path: Path) -> None:
    """200 bars with a long title: zero and thousands separators on the value axis, category labels at a round
    stride, nothing overlapping or clipped, and the titles written into the SVG as text."""
    fig = _benchmark_bars(200)
    assert layout_problems(fig) == []
    values = _tick_labels(fig, "y")
    assert "0" in values
    assert "25,000" in values or "20,000" in values
    assert all("e" not in v for v in values)
    categories = _tick_labels(fig, "x")
    assert 5 <= len(categories) < 200
    strides = {int(b) - int(a) for a, b in itertools.pairwise(categories)}
    assert len(strides) == 1
    assert strides <= {2, 5, 10, 20, 25, 50}
    path = save_svg(fig, tmp_path / "deep" / "bars.svg")
    texts = _texts(path)
    assert {"count", "string", "true count", "estimated count", "0"} <= set(texts)
    assert any(t.startswith("004 §5.2: population") for t in texts)


def test_long_category_labels_are_shortened_and_thinned_never_overlapping() -> None:
    """Sixty bucket labels too wide to stand side by side: shortened where long, a stride of them, no overlap."""
    labels = [f"[{i * 1000:,}, {(i + 1) * 1000:,}) seconds of use, long label" for i in range(60)]
    fig = estimate_chart(
        title="latency: share per bucket",
        x=labels,
        truth=[1 / 60] * 60,
        estimate=[1 / 60 + 0.001 * (-1) ** i for i in range(60)],
        standard_error=[0.002] * 60,
        z=1.96,
        value_label="share of reporting devices",
        category_label="bucket",
    )
    assert layout_problems(fig) == []
    shown = _tick_labels(fig, "x")
    assert 0 < len(shown) < 60
    assert all(len(t) <= 18 for t in shown)
    assert shown[0].endswith("…")
    assert "0" in _tick_labels(fig, "y")


def test_rows_keep_every_label_whole() -> None:
    """A top-40 of strings as rows: every label shown (long ones shortened), the value axis from zero."""
    values = [f"value number {i}" for i in range(40)]
    fig = estimate_chart(
        title="emoji: top 40 values, period from 2024-03-01T00:00:00Z",
        x=values,
        truth=[40_000 / (i + 1) for i in range(40)],
        estimate=[40_000 / (i + 1) + 300 for i in range(40)],
        standard_error=[400.0] * 40,
        z=1.96,
        value_label="reports",
        category_label="value",
        rows=True,
    )
    assert layout_problems(fig) == []
    assert _tick_labels(fig, "y") == values
    assert {"0", "10,000", "40,000"} <= set(_tick_labels(fig, "x"))


def test_periods_over_time_on_a_date_axis(tmp_path: Path) -> None:
    """Means per six-hour period: a date axis, the value axis fitted to the data with thousands separators."""
    start = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
    times = [start + dt.timedelta(hours=6 * i) for i in range(12)]
    fig = estimate_chart(
        title="app-usage-seconds: mean per period",
        x=times,
        truth=[10_800 + 300 * math.sin(i) for i in range(12)],
        estimate=[10_800 + 300 * math.sin(i) + 50 for i in range(12)],
        standard_error=[120.0] * 11 + [None],
        z=1.96,
        value_label="mean of the reported values (s)",
        category_label="period start (UTC)",
    )
    assert layout_problems(fig) == []
    assert any("," in v for v in _tick_labels(fig, "y"))
    assert len(_tick_labels(fig, "x")) >= 3
    assert "period start (UTC)" in _texts(save_svg(fig, tmp_path / "mean.svg"))


def test_a_log_log_line_chart_labels_its_sweep(tmp_path: Path) -> None:
    """Error against ε: a tick and label at every ε, log y labelled at 1-2-5 steps with separators."""
    eps = [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
    fig = line_chart(
        title="000 §5: mean absolute error (s) of 1BitRRPM, n = 3e5, m = 24 h",
        x=eps,
        series=[
            (f"gamma = {g:.3g}", [3_000 * (1 + g) / e for e in eps], c) for g, c in ((0, "#1f77b4"), (1, "#d62728"))
        ],
        ylabel="mean absolute error (s)",
        xlabel="ε per report",
    )
    assert layout_problems(fig) == []
    assert _tick_labels(fig, "x") == ["0.1", "0.2", "0.5", "1", "2", "5", "10"]
    assert {"1,000", "10,000"} <= set(_tick_labels(fig, "y"))
    assert {"ε per report", "gamma = 0", "gamma = 1"} <= set(_texts(save_svg(fig, tmp_path / "line.svg")))


def test_the_same_figure_gives_the_same_bytes(tmp_path: Path) -> None:
    """No date and stable ids in the SVG: a re-run of a benchmark does not rewrite an unchanged plot."""
    a = save_svg(_benchmark_bars(30), tmp_path / "a.svg").read_bytes()
    b = save_svg(_benchmark_bars(30), tmp_path / "b.svg").read_bytes()
    assert a == b


def test_an_empty_chart_says_so() -> None:
    """Nothing released: a chart with a value axis from zero and a note, not a crash."""
    fig = estimate_chart(
        title="emoji: top 0 values",
        x=[],
        truth=[],
        estimate=[],
        standard_error=[],
        z=1.96,
        value_label="reports",
        category_label="value",
    )
    assert layout_problems(fig) == []
    assert "0" in _tick_labels(fig, "y")
    assert "nothing to show" in [t.get_text() for t in fig.axes[0].texts]


def test_layout_problems_finds_overlap_and_clipping() -> None:
    """The check itself can fail: two texts on one spot, and one past the figure's edge, are reported."""
    fig = _benchmark_bars(10)
    fig.text(0.5, 0.5, "one")
    fig.text(0.5, 0.5, "two")
    fig.text(0.99, 0.5, "past the right edge")
    problems = layout_problems(fig)
    assert "'one' overlaps 'two'" in problems
    assert "'past the right edge' leaves the figure" in problems


def test_mismatched_lengths_are_refused() -> None:
    """A series of the wrong length is a caller's mistake, named, not a silently shifted chart."""
    with pytest.raises(ValueError, match="series 'b' has 2 values for 3 labels"):
        bar_chart(title="t", labels=["1", "2", "3"], series=[("b", [1.0, 2.0], "#000")], ylabel="y", xlabel="x")
    with pytest.raises(ValueError, match="lengths 2, 1, 2 and 2"):
        estimate_chart(
            title="t",
            x=["a", "b"],
            truth=[1.0],
            estimate=[1.0, 2.0],
            standard_error=[None, None],
            z=1.96,
            value_label="v",
            category_label="c",
        )


def test_a_value_the_font_lacks_stays_text(tmp_path: Path) -> None:
    """An emoji among the values (DejaVu Sans has none): no warning, and the SVG keeps the character for the
    viewer's fonts to draw."""
    fig = estimate_chart(
        title="emoji: top 2 values",
        x=["🙏", "👍"],
        truth=[10.0, 5.0],
        estimate=[9.0, 6.0],
        standard_error=[1.0, 1.0],
        z=1.96,
        value_label="reports",
        category_label="value",
        rows=True,
    )
    assert layout_problems(fig) == []
    # The character stays for a viewer whose fonts draw it; its code point follows, since no
    # font here draws it and the viewer's may not either (an empty box alone says nothing).
    assert {"🙏 (U+1F64F)", "👍 (U+1F44D)"} <= set(_texts(save_svg(fig, tmp_path / "emoji.svg")))
