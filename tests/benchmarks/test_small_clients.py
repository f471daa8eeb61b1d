"""The clients' benchmark at a small size: every way to record reaches a real agent (speeds only printed)."""

from __future__ import annotations

import pytest

from benchmarks import bench_clients
from tests.benchmarks.support import covers, report, require_keys, run_main


@covers("bench_clients")
def test_clients(capsys: pytest.CaptureFixture[str]) -> None:
    """The command, the Python client (blocking, asyncio, generated) and the C client each record every
    value they send into a real daemon; each figure is printed, none asserted."""
    doc = run_main(bench_clients.main, ["--values", "40", "--runs", "3"], capsys)
    assert doc["checks"]["every_value_recorded"], doc
    require_keys(doc["command"], ("wall_ms_median",), where="command")
    require_keys(doc["python"], ("latency_us_median", "per_s"), where="python")
    require_keys(doc["c"], ("per_s",), where="c")  # the suite has a C compiler (deploy/test.sh)
    require_keys(doc["import"], ("bare_cpu_ms", "client_cpu_ms", "bare_rss_mb", "client_rss_mb"), where="import")
    report("bench_clients", {k: doc[k] for k in ("command", "python", "python_async", "python_generated", "c")})
