"""One way of writing numbers: the CLI's format_number and the dashboard's fmt (run in node) agree on every case."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest

from collector.decoding.release import NEAR_CUTOFF
from collector.numbers import FORMAT_JS, format_number
from collector.rendering import _release_lines, format_estimate
from collector.results import EstimateResult, FrequencyEntry, ReleaseDecision

NODE = shutil.which("node")

# (value, digits, written): the list, negatives, and the edges of each rule.
CASES: list[tuple[float | None, int, str]] = [
    (0, 4, "0"),
    (-0.0, 4, "0"),
    (1, 4, "1"),
    (7.02, 4, "7.02"),
    (70.2, 4, "70.2"),
    (70.2, 3, "70.2"),
    (100, 4, "100"),
    (1000, 4, "1,000"),
    (999.96, 4, "1,000"),  # rounding up to a fourth digit groups it too
    (1500, 4, "1,500"),
    (10955.8, 4, "10,956"),
    (1e6, 4, "1,000,000"),
    (1.5e-5, 4, "1.5e-5"),
    (-1, 4, "-1"),
    (-7.02, 4, "-7.02"),
    (-1500, 4, "-1,500"),
    (-10955.8, 4, "-10,956"),
    (-1.5e-5, 4, "-1.5e-5"),
    (0.5694451960428426, 4, "0.5694"),
    (0.001, 4, "0.001"),
    (0.000999, 4, "9.99e-4"),
    (0.00123456, 4, "0.001235"),
    (0.1 + 0.2, 4, "0.3"),
    (9.99996, 4, "10"),
    (99999.5, 4, "100,000"),
    (2.5, 1, "3"),
    (-2.5, 1, "-3"),
    (123456.789, 4, "123,457"),
    (999_999_999_999_999.0, 4, "999,999,999,999,999"),
    (1e15, 4, "1e15"),
    (2.345e17, 3, "2.35e17"),
    (9.9996e-4, 4, "1e-3"),  # the rule is chosen on the value, before rounding
    (9.9999e-5, 3, "1e-4"),
    (None, 4, "n/a"),
    (math.nan, 4, "n/a"),
    (math.inf, 4, "n/a"),
    (-math.inf, 4, "n/a"),
]


def _js_literal(x: float | None) -> str:
    if x is None:
        return "null"
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return repr(float(x))


@pytest.mark.parametrize(("value", "digits", "written"), CASES)
def test_python_formatter(value: float | None, digits: int, written: str) -> None:
    """format_number writes each case as the rules say."""
    assert format_number(value, digits) == written


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_dashboard_formatter_writes_the_same() -> None:
    """The dashboard's fmt, run by node, writes every case exactly as format_number does."""
    assert NODE is not None
    calls = ",".join(f"fmt({_js_literal(v)}, {d})" for v, d, _ in CASES)
    script = FORMAT_JS + f"\nconsole.log(JSON.stringify([{calls}]));\n"
    out = subprocess.run([NODE, "-e", script], capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out) == [w for _, _, w in CASES]


def test_the_cli_writes_numbers_the_same_way() -> None:
    """format_estimate writes its figures with format_number (no 1e+06, no stripped whole-number zeros)."""
    entry = FrequencyEntry(
        value="heart", count=10955.8, standard_error=70.2, ci=(None, None), z=None, p_value=None, released=True
    )
    result = EstimateResult(
        use_case="emoji",
        definition="emoji@5338c1d1",
        description="",
        mechanism="cms",
        kind="frequencies",
        period=3,
        period_length="1d",
        period_start="a",
        period_end="b",
        reports=1_000_000,
        records=1_500,
        min_reports=1,
        release_threshold=1000,
        confidence=0.95,
        epsilon=4.0,
        epsilon_report=4.0,
        released=True,
        withheld_reason=None,
        estimate=ReleaseDecision(
            items=(entry,), withheld=3, threshold=1000, tested=4, correction="bh", alpha=0.05, test="t"
        ),
    )
    text = format_estimate(result)
    assert "1,000,000 reports, 1,500 records" in text
    assert "10,956" in text
    assert "70.2" in text
    assert "3 entries withheld: below the threshold 1,000 or not significant" in text


def test_released_entries_say_their_se_and_interval_are_conditional_on_release() -> None:
    """The CLI shows a released entry's selection-adjusted SE and its interval, and says what they mean."""
    entry = FrequencyEntry(
        value="🙂",
        count=10_956.0,
        standard_error=70.2,
        ci=(10_000.0, 11_093.6),
        z=5.0,
        p_value=1e-6,
        released=True,
        interval="95 % interval conditional on release",
        selection_standard_error=278.8,
    )
    decision = ReleaseDecision(
        items=(entry,),
        withheld=0,
        threshold=1000,
        tested=1,
        correction="bh",
        alpha=0.05,
        test="t",
        interval="95 % interval conditional on release",
    )
    lines = _release_lines(decision)
    row = next(line for line in lines if "🙂" in line)
    assert "278.8" in row
    assert "70.2" not in row
    assert "10,000 .. 11,094" in row
    assert "  (SE and CI: 95 % interval conditional on release)" in lines


def test_an_entry_near_the_cutoff_is_shown_by_its_interval_alone() -> None:
    """A barely released entry's row has no count or SE, only its interval, and a line says why."""
    near = FrequencyEntry(
        value="near.example",
        count=57.85,
        standard_error=40.0,
        ci=(0.0, 80.56),
        z=1.5,
        p_value=0.01,
        released=True,
        interval="95 % interval conditional on release",
        selection_standard_error=92.72,
        near_cutoff=True,
    )
    decision = ReleaseDecision(
        items=(near,),
        withheld=0,
        threshold=0,
        tested=1,
        correction="bh",
        alpha=0.05,
        test="t",
        interval="95 % interval conditional on release",
        near_cutoff=NEAR_CUTOFF,
    )
    lines = _release_lines(decision)
    row = next(line for line in lines if "near.example" in line)
    assert "near cutoff" in row
    assert "0 .. 80.56" in row
    assert "57.85" not in row
    assert "92.72" not in row
    assert f"  ({NEAR_CUTOFF})" in lines
