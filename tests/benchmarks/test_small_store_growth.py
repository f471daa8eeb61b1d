"""The store-growth benchmark at a small size: both measuring points, every report counted once."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_store_growth
from tests.benchmarks.support import covers, report, require_keys, run_main


@covers("bench_store_growth")
def test_store_growth(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """2,000 devices into SQLite, measured from 0 and from 4,000 stored ids, every report counted once."""
    argv = ["--devices", "2000", "--at", "0,4000", "--window", "2000", "--batch", "500", "--dir", str(tmp_path)]
    doc = run_main(bench_store_growth.main, argv, capsys)
    assert doc["checks"] == {"every_report_counted_once": True}
    assert [row["stored_ids"] for row in doc["results"]] == [0, 4000]
    for row in doc["results"]:
        require_keys(row, ("commit_cpu_us_per_report", "written_bytes_per_report"), where="store_growth")
        assert row["reports"] >= 2000
    report("bench_store_growth", {str(r["stored_ids"]): r["commit_cpu_us_per_report"] for r in doc["results"]})
