"""Comparing the collector's estimates with the truth, the text report and the SVG plots (fleet.plots)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import msgspec
import pytest

from collector.results import EstimateResult
from fleet.report import compare_period, format_results, summarize, write_plots
from fleet.tally import Tally
from protocol.registry import Registry, parse_registry

ROOT = Path(__file__).resolve().parents[2]
REGISTRY_PATH = ROOT / "deploy" / "fleet.usecases.toml"


@pytest.fixture(scope="module")
def registry() -> Registry:
    """The fleet registry shipped in deploy/."""
    return parse_registry(REGISTRY_PATH.read_bytes(), source=str(REGISTRY_PATH))


_ENTRY: dict[str, Any] = {"ci": [None, None], "z": None, "p_value": None, "released": True}
_RELEASE: dict[str, Any] = {"withheld": 0, "threshold": 0, "tested": 0, "correction": "bh", "alpha": 0.05, "test": "t"}


def _form(kind: str, estimate: dict[str, Any]) -> dict[str, Any]:
    """The API's JSON of an estimate, the fields a test does not care about filled in."""
    if kind in ("mean", "proportion"):
        return {"form": "scalar", "ci": [None, None]} | estimate
    if kind == "histogram":
        buckets = [{"ci": [None, None], "consistent": None} | b for b in estimate["buckets"]]
        return {"form": "histogram"} | estimate | {"buckets": buckets}
    out: dict[str, Any] = {"form": "frequencies"} | _RELEASE | estimate
    for key in ("items", "withheld_items"):
        if key in out:
            out[key] = [_ENTRY | it for it in out[key]]
    return out


def _result(kind: str, estimate: dict[str, Any], *, released: bool = True, start: str = "") -> EstimateResult:
    """An estimate as the fleet reads it from the collector's API."""
    return msgspec.convert(
        {
            "use_case": "u",
            "definition": "u@00000000",
            "description": "",
            "mechanism": "m",
            "period": 100,
            "period_length": "1d",
            "period_start": start or "2024-03-01T00:00:00Z",
            "period_end": "2024-03-02T00:00:00Z",
            "reports": 4,
            "records": 4,
            "min_reports": 1,
            "release_threshold": 0,
            "confidence": 0.95,
            "epsilon": 1.0,
            "epsilon_report": 1.0,
            "released": released,
            "withheld_reason": None if released else "4 reports; at least 50 are needed before release",
            "kind": kind,
            "estimate": _form(kind, estimate) if released else None,
        },
        EstimateResult,
    )


def test_mean_error_and_z(registry: Registry) -> None:
    """A mean's error is estimate minus the reported values' mean, in SE units."""
    tally = Tally(n=4, total=4 * 250.0)
    row = compare_period(
        registry.use_cases["app-usage-seconds"], tally, _result("mean", {"value": 270.0, "standard_error": 8.0})
    )
    assert row.comparison is not None
    assert row.comparison.truth == 250.0
    assert row.comparison.error == 20.0
    assert row.comparison.z == 2.5
    assert row.max_abs_z == 2.5


def test_histogram_compares_shares_per_bucket(registry: Registry) -> None:
    """Each bucket's estimated share is compared with the share of reporting devices in it."""
    uc = registry.use_cases["app-usage-histogram"]
    tally = Tally()
    for v in (0.0, 10.0, 5000.0, 30_000.0):
        tally.add("histogram", v, uc)
    assert tally.buckets[0] == 2
    assert tally.buckets[-1] == 1  # values past the last edge are clamped, as the mechanism does
    edges = list(uc.mechanism.buckets.edges)  # type: ignore[attr-defined]
    buckets = [
        {"low": edges[i], "high": edges[i + 1], "value": 0.5 if i == 0 else 0.0, "standard_error": 0.1}
        for i in range(16)
    ]
    row = compare_period(uc, tally, _result("histogram", {"buckets": buckets, "n": 4}))
    assert row.items[0].truth == 0.5
    assert row.items[0].z == 0.0
    assert row.worst is not None
    assert row.worst.z == pytest.approx(-2.5)
    assert row.max_abs_z == pytest.approx(2.5)


def test_frequencies_compare_released_values_and_list_the_rest(registry: Registry) -> None:
    """Released values are compared with their true counts; reported values the collector withheld are listed."""
    tally = Tally(n=5, counts={"a": 3, "b": 1, "c": 1})
    estimate = {
        "items": [
            {"value": "a", "count": 4.0, "standard_error": 2.0},
            {"value": "z", "count": 1.0, "standard_error": 2.0},
        ],
        "withheld": 3,
        "tested": 5,
    }
    row = compare_period(registry.use_cases["emoji"], tally, _result("frequencies", estimate))
    assert [(it.key, it.truth, it.z) for it in row.items] == [("a", 3.0, 0.5), ("z", 0.0, 0.5)]
    assert row.not_released_count == 2
    assert {d.key for d in row.not_released} == {"b", "c"}


def test_frequencies_compare_withheld_entries_too(registry: Registry) -> None:
    """Entries the collector withheld (listed with withheld=1) are compared with the truth like released ones."""
    tally = Tally(n=5, counts={"a": 3, "b": 1, "c": 1})
    estimate = {
        "items": [{"value": "a", "count": 4.0, "standard_error": 2.0, "released": True}],
        "withheld_items": [
            {"value": "b", "count": -9.0, "standard_error": 2.0, "released": False, "withheld_reason": "below"},
            {"value": "z", "count": 1.0, "standard_error": 2.0, "released": False, "withheld_reason": "test"},
        ],
        "withheld": 2,
        "tested": 3,
    }
    row = compare_period(registry.use_cases["emoji"], tally, _result("frequencies", estimate))
    got = [(it.key, it.truth, it.z, it.released) for it in row.items]
    assert got == [("a", 3.0, 0.5, True), ("b", 1.0, -5.0, False), ("z", 0.0, 0.5, False)]
    assert row.max_abs_z == 5.0
    assert row.worst is not None
    assert row.worst.key == "b"
    assert row.not_released_count == 2
    assert row.not_estimated_count == 1


def test_unreleased_period_is_not_compared(registry: Registry) -> None:
    """A period the collector does not release carries its reason and no comparison."""
    uc = registry.use_cases["dark-mode-enabled"]
    row = compare_period(uc, Tally(n=4, total=1), _result("proportion", {}, released=False))
    assert row.released is False
    assert row.max_abs_z is None
    summary = summarize(uc.name, uc, [row], 5.0)
    assert summary.compared == 0
    assert not summary.ok


def test_summary_counts_errors_beyond_the_tolerance(registry: Registry) -> None:
    """A use case passes only when no compared error exceeds the tolerance."""
    uc = registry.use_cases["app-usage-seconds"]
    rows = [
        compare_period(uc, Tally(n=1, total=100.0), _result("mean", {"value": 100.0 + z, "standard_error": 1.0}))
        for z in (0.5, -4.9, 6.0)
    ]
    summary = summarize(uc.name, uc, rows, 5.0)
    assert (summary.compared, summary.beyond, summary.ok) == (3, 1, False)
    assert summary.max_abs_z == 6.0
    text = format_results([summary], {uc.ref: uc}, tolerance=5.0)
    assert "1 of 3 errors beyond 5 SE" in text
    assert "2024-03-01T00:00:00Z" in text


def test_zero_standard_error(registry: Registry) -> None:
    """An exact estimate with SE 0 has z 0; a wrong one has an infinite z."""
    uc = registry.use_cases["dark-mode-enabled"]
    exact = compare_period(uc, Tally(n=2, total=1), _result("proportion", {"value": 0.5, "standard_error": 0.0}))
    wrong = compare_period(uc, Tally(n=2, total=1), _result("proportion", {"value": 0.6, "standard_error": 0.0}))
    assert exact.comparison is not None
    assert wrong.comparison is not None
    assert exact.comparison.z == 0.0
    assert wrong.comparison.z is not None
    assert math.isinf(wrong.comparison.z)


SVG = "{http://www.w3.org/2000/svg}"


def _texts(path: Path) -> list[str]:
    """Every text the SVG draws (matplotlib keeps text as <text> elements here)."""
    root = ET.fromstring(path.read_text(encoding="utf-8"))
    assert root.tag == f"{SVG}svg"
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def _estimates_drawn(path: Path) -> bool:
    """Whether the chart has the group of estimate points (``gid`` ``estimates``) with a marker in it."""
    root = ET.fromstring(path.read_text(encoding="utf-8"))
    return any(g.get("id") == "estimates" and list(g.iter(f"{SVG}use")) for g in root.iter(f"{SVG}g"))


def test_plots_are_well_formed_svg(tmp_path: Path, registry: Registry) -> None:
    """One SVG per use case, parseable as XML, with its title, axis titles, values and estimate points."""
    mean_uc, freq_uc = registry.use_cases["app-usage-seconds"], registry.use_cases["emoji"]
    means = []
    for day, t in enumerate((10_100.0, 12_000.0, 9_000.0), start=1):
        row = compare_period(
            mean_uc,
            Tally(n=10, total=10.0 * t),
            _result("mean", {"value": t + 300, "standard_error": 200.0}, start=f"2024-03-0{day}T00:00:00Z"),
        )
        means.append(row)
    freq = compare_period(
        freq_uc,
        Tally(n=3, counts={"<b>&": 2, "$x$": 1}),
        _result(
            "frequencies",
            {
                "items": [
                    {"value": "<b>&", "count": 2.5, "standard_error": 1.0},
                    {"value": "$x$", "count": 0.5, "standard_error": 1.0},
                ]
            },
        ),
    )
    summaries = [summarize(mean_uc.name, mean_uc, means, 5.0), summarize(freq_uc.name, freq_uc, [freq], 5.0)]
    files = write_plots(summaries, tmp_path / "plots")
    assert sorted(f.name for f in files) == ["app-usage-seconds.svg", "emoji.svg"]
    mean_texts = _texts(tmp_path / "plots" / "app-usage-seconds.svg")
    assert "app-usage-seconds: mean per period, estimate and truth" in mean_texts
    assert {"mean of the reported values", "period start (UTC)", "truth", "estimate ± 1.96 SE"} <= set(mean_texts)
    assert "10,000" in mean_texts  # thousands separators on the value axis
    freq_texts = _texts(tmp_path / "plots" / "emoji.svg")
    # Values are data: escaped in the XML, and "$x$" stays text rather than TeX.
    assert {"<b>&", "$x$", "reports", "value, by true count", "0"} <= set(freq_texts)
    assert "&lt;b&gt;&amp;" in (tmp_path / "plots" / "emoji.svg").read_text(encoding="utf-8")
    assert all(_estimates_drawn(f) for f in files)


def test_plots_when_the_latest_period_released_no_entry(tmp_path: Path, registry: Registry) -> None:
    """A frequency use case whose latest period released nothing: the plot shows the latest period that did;
    with no entry released in any period, an empty chart that says so; never a crash."""
    uc = registry.use_cases["emoji"]
    nothing = {"items": [], "withheld": 2, "tested": 2}
    earlier = compare_period(
        uc,
        Tally(n=3, counts={"a": 2, "b": 1}),
        _result("frequencies", {"items": [{"value": "a", "count": 2.5, "standard_error": 1.0}]}),
    )
    latest = compare_period(
        uc, Tally(n=3, counts={"a": 2, "b": 1}), _result("frequencies", nothing, start="2024-03-02T00:00:00Z")
    )
    (path,) = write_plots([summarize(uc.name, uc, [earlier, latest], 5.0)], tmp_path / "one")
    assert "emoji: top 1 values, period from 2024-03-01T00:00:00Z" in _texts(path)
    assert _estimates_drawn(path)
    (path,) = write_plots([summarize(uc.name, uc, [latest], 5.0)], tmp_path / "none")
    assert "nothing to show" in _texts(path)
    assert not _estimates_drawn(path)
