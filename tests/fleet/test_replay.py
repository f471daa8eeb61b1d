"""Replaying a user's own data: per-device counters from a CSV, estimated through a real broker and collector."""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest

from fleet.cli import main
from tests.fleet.support import running_stack

pytestmark = pytest.mark.slow

REGISTRY = Path(__file__).resolve().parents[2] / "deploy" / "fleet.usecases.toml"
DEVICES, PERIODS = 300, 8


def _write_series(path: Path) -> dict[int, list[int]]:
    """Per-device seconds of use per 6-hour period, with a daily rhythm; every 7th device skips odd periods."""
    gen = np.random.default_rng(424242)
    rhythm = [2_000, 9_000, 14_000, 6_000]
    truth: dict[int, list[int]] = {p: [] for p in range(PERIODS)}
    with path.open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["device", "period", "value"])
        for d in range(DEVICES):
            for p in range(PERIODS):
                if d % 7 == 0 and p % 2 == 1:
                    continue  # the device was off: no row, nothing recorded
                value = int(np.clip(gen.normal(rhythm[p % 4], 2_500), 0, 21_600))
                out.writerow([f"laptop-{d:04d}", p, value])
                truth[p].append(value)
    return truth


def test_replayed_counters_estimate_the_csv_mean(tmp_path: Path) -> None:
    """The collector's mean per period is within 5 SE of the CSV's own mean for that period."""
    series = tmp_path / "usage.csv"
    truth = _write_series(series)
    out = tmp_path / "replay.json"
    with running_stack(tmp_path / "stack", tls=False) as stack:
        status = main(
            [
                "--registry",
                str(REGISTRY),
                "--use-case",
                "app-usage-seconds",
                "--population",
                str(series),
                "--days",
                "2",
                "--seed",
                "5",
                "--quiet",
                "--ingest-timeout",
                "600",
                "--output",
                str(out),
                *stack.fleet_args(),
            ]
        )
    assert status == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["config"]["devices"] == DEVICES  # taken from the file
    start = dt.datetime.fromisoformat(doc["config"]["start"].replace("Z", "+00:00")).timestamp()
    first = int(start // 21_600)
    rows = doc["use_cases"]["app-usage-seconds"]["comparison"]["periods"]
    assert [r["period"] - first for r in rows] == list(range(PERIODS))
    for row in rows:
        values = truth[row["period"] - first]
        assert row["reports"] == len(values)
        csv_mean = float(np.mean(values))
        compared = row["comparison"]
        assert compared["truth"] == pytest.approx(csv_mean)
        assert abs(compared["estimate"] - csv_mean) <= 5 * compared["standard_error"], row
