"""The dashboard answers the next question, in headless Chromium: an older period of a histogram
and of a frequency table, the withheld entries and why, the release rule in words, every axis
labelled, no text over other text, one number format, legend markers in the chart's colours."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from collector.http import HttpApi
from collector.numbers import format_number
from collector.store import CheckpointStore
from protocol.registry import Registry
from protocol.wire import decode_report, encode_report
from tests.collector.support import current_period, privatized_reports, run_async, shown_row
from tests.collector.test_dashboard import CHROMIUM, _card, _chromium, _config, _get, _rows, _text


def _populate_two_periods(path: Path, registry: Registry, now: float) -> dict[str, int]:
    """Every use case gets its current period (400 reports) and the one before (1,200 reports,
    so four-digit counts show); returns the older period per use case."""
    store = CheckpointStore(path, registry, instance="dash")
    older: dict[str, int] = {}
    try:
        for i, name in enumerate(sorted(registry.use_cases)):
            current = current_period(registry, name, now)
            older[name] = current - 1
            for back, count in ((1, 1200), (0, 400)):
                reports = privatized_reports(registry, name, count, period=current - back, seed=500 + 10 * i + back)
                store.commit([decode_report(encode_report(r), registry) for r in reports], {"messages": count})
    finally:
        store.close()
    return older


def _svgs(card: str) -> list[str]:
    return re.findall(r'<svg [^>]*class="chart[^"]*".*?</svg>', card, re.S)


def _bar_titles(card: str) -> list[str]:
    return [_text(t) for t in re.findall(r'<rect [^>]*class="bar"[^>]*><title>(.*?)</title>', card, re.S)]


def _expected_bars(estimate: dict[str, Any]) -> list[str]:
    def edge(v: float | None) -> str:
        return "∞" if v is None else format_number(v, 6)

    return [
        f"[{edge(b['low'])}, {edge(b['high'])}): "
        f"{format_number(b['value'])} ± {format_number(b['standard_error'])} (SE)"
        for b in estimate["estimate"]["buckets"]
    ]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@run_async
async def test_an_older_period_its_withheld_entries_and_a_clean_layout(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """Picked periods (the picker's ?period.NAME=P) draw that period's histogram and table, with
    the withheld entries and why; every chart's axes are titled, no text overlaps, one number format."""
    older = _populate_two_periods(tmp_path / "dash.sqlite3", registry, time.time())
    api = HttpApi(_config(tmp_path, registry_path))
    port = await api.start()
    serving = asyncio.create_task(api.serve())
    # The older period on every card (what choosing it in each card's picker writes).
    pick = "?" + "&".join(f"period.{name}={p}" for name, p in sorted(older.items()))
    try:
        dom = (await _chromium(["--dump-dom", f"http://127.0.0.1:{port}/{pick}"], tmp_path / "profile")).decode()

        async def api_json(path: str) -> Any:
            status, _, body = await asyncio.to_thread(_get, port, path)
            assert status == 200, body
            return json.loads(body)

        hist_old = await api_json(f"/api/v1/use-cases/hist/estimate?period={older['hist']}")
        hist_latest = await api_json("/api/v1/use-cases/hist/estimate")
        frequencies = {
            name: await api_json(f"/api/v1/use-cases/{name}/estimate?period={older[name]}&withheld=1")
            for name in ("domains", "emoji", "home", "words")
        }
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert 'data-ready="1"' in dom, dom[-3000:]
    # The histogram of the older period, not the latest one.
    hist = _card(dom, "hist")
    assert f'data-period="{older["hist"]}"' in hist
    assert hist_old["reports"] == 1200
    assert hist_latest["reports"] == 400
    assert "1,200 reports" in _text(hist)
    assert _bar_titles(hist) == _expected_bars(hist_old)
    assert _bar_titles(hist) != _expected_bars(hist_latest)
    # The histogram's value axis says what its ticks are (the registry declares no unit).
    assert "bucket (value range: low edge … high edge)" in _text(hist)
    # The frequency table of the older period, and its withheld entries with the reason.
    name, emoji_old = next((n, r) for n, r in frequencies.items() if r["estimate"]["withheld_items"])
    emoji = _card(dom, name)
    assert f'data-period="{older[name]}"' in emoji
    items, withheld = emoji_old["estimate"]["items"], emoji_old["estimate"]["withheld_items"]
    table, withheld_table = re.findall(r"<table.*?</table>", emoji, re.S)
    assert _rows(table)[: len(items)] == [shown_row(i) for i in items[:50]]
    assert 'class="withheld-list"' in emoji
    reason_rows = re.findall(r"<tr><td>(.*?)</td>.*?<td class=\"reason\">(.*?)</td></tr>", withheld_table, re.S)
    assert [(_text(v), _text(r)) for v, r in reason_rows] == [(w["value"], w["withheld_reason"]) for w in withheld[:50]]
    # The release rule, in words, with where it is explained.
    e = emoji_old["estimate"]
    assert (
        f"released: estimate ≥ {format_number(e['threshold'])} and significant after Benjamini–Hochberg "
        f"at α = {format_number(e['alpha'])} over {format_number(e['tested'])} entries tested"
    ) in _text(emoji)
    assert "docs/estimation.md" in _text(emoji)
    _check_layout(dom, registry, older)


def _check_layout(dom: str, registry: Registry, older: dict[str, int]) -> None:
    """Pickers on every card; axes, legends, overlaps and the number format of every card."""
    # Every card has a period picker listing its periods, the older one among them.
    for name in registry.use_cases:
        card = _card(dom, name)
        assert 'class="period-picker"' in card
        assert f'<option value="{older[name]}"' in card
    # Every chart labels both axes; the reports strips label their periods.
    charts = [svg for name in registry.use_cases for svg in _svgs(_card(dom, name))]
    assert len(charts) >= 2 * len(registry.use_cases) - 4  # a strip per card, a chart per plotted kind
    for svg in charts:
        for axis in ("x", "y"):
            title = re.search(rf'<text [^>]*data-axis="{axis}"[^>]*>(.*?)</text>', svg, re.S)
            assert title, f"an unlabelled {axis} axis in {svg[:200]}"
            assert _text(title[1])
    assert dom.count('class="tick period-label"') >= len(registry.use_cases)
    # Legend markers are filled with the colour of the element they stand for.
    for svg in charts:
        for mark, colour in re.findall(r'<tspan class="legend-marker" data-mark="([\w-]+)" fill="([^"]+)"', svg):
            drawn = re.findall(rf'<\w+ [^>]*class="{mark}"[^>]*>', svg)
            if drawn:  # a series without released periods draws no band, for instance
                assert all(f'fill="{colour}"' in d or f'stroke="{colour}"' in d for d in drawn), (mark, colour)
    assert dom.count('class="legend-marker"') >= 2 * len(registry.use_cases)
    # No text over other text, in the charts or around them (measured in the page as drawn).
    assert 'data-layout-problems="0"' in dom
    # One number format: no four-digit integer without its thousands separator in what a card
    # shows (timestamps, stamps and refs aside).
    for name in registry.use_cases:
        stamps = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d)?Z?|\d\d-\d\d \d\d:\d\d|@[0-9a-f]+"
        shown = re.sub(stamps, " ", _text(_card(dom, name)))
        assert not re.findall(r"(?<![\d.,])\d{4,}(?![\d,])", shown), (name, shown)
