"""The frequency oracles' variance benchmark, run small: every cell and the emoji comparison are complete,
and the measured variances agree with their targets within their own sampling error."""

from __future__ import annotations

import pytest

from benchmarks import bench_oracle_variance
from tests.benchmarks.support import covers, report, run_main


@covers("bench_oracle_variance")
def test_oracle_variance(capsys: pytest.CaptureFixture[str]) -> None:
    """ε = 4, k = 8 and 843: each mechanism's measured variance of an unheld count is its target within
    5 of its standard errors; olh's measured SE on the emoji dictionary is below CMS's and HCMS's."""
    doc = run_main(bench_oracle_variance.main, ["--small"], capsys)
    grid = doc["grid"]
    assert {(r["mechanism"], r["k"]) for r in grid} == {
        (m, k) for m in ("grr", "oue", "ss", "pgr", "olh") for k in (8, 843)
    }
    for row in grid:
        assert row["estimates_pooled"] >= 80
        if row["held_to_target"]:
            assert abs(row["ratio"] - 1) <= 5 * row["ratio_se"], row
    emoji = doc["emoji"]
    assert emoji["olh_vs_cms"] < 1
    assert emoji["olh_vs_hcms"] < 0.5
    report("bench_oracle_variance", {f"{r['mechanism']}@{r['k']}": r["ratio"] for r in grid})
