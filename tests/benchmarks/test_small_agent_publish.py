"""The agent's publish benchmark at a small size: both ways publish every message through a real Mosquitto."""

from __future__ import annotations

import pytest

from benchmarks import bench_agent_publish
from tests.benchmarks.support import covers, report, require_keys, run_main


@covers("bench_agent_publish")
def test_agent_publish(capsys: pytest.CaptureFixture[str]) -> None:
    """aiomqtt's publish and the hooked, checked one each finish their runs (the broker accepted every
    publish, or the benchmark would have stopped); the difference per publish is printed, not asserted."""
    doc = run_main(bench_agent_publish.main, ["--publishes", "30", "--repeat", "2"], capsys)
    assert {name: len(runs) for name, runs in doc["runs_seconds"].items()} == {
        "aiomqtt_publish": 2,
        "publish_checked": 2,
    }
    require_keys(doc, ("checked_minus_plain_us_per_publish", "checked_minus_plain_cpu_us_per_publish"), where="doc")
    report("bench_agent_publish", doc["median_seconds"])
