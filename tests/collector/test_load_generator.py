"""The load generator's reports are valid privatized reports: they decode under the example
registry, carry the use case's record shape, and fold into estimates near the truth."""

from __future__ import annotations

import math

from benchmarks.load import REGISTRY, build_counters, build_single
from protocol.registry import parse_registry
from protocol.server.contract import mean_server
from protocol.wire import decode_report


def test_single_reports_decode_with_distinct_ids() -> None:
    """Every single-shape message is a one-record HCMS report of safari-energy-domains; ids never repeat."""
    registry = parse_registry(REGISTRY.read_bytes())
    messages = build_single(registry, 2_000, seed=3, period=1000)
    reports = [decode_report(payload, registry) for _, payload in messages]
    assert {r.use_case.name for r in reports} == {"safari-energy-domains"}
    assert {r.count for r in reports} == {1}
    assert {r.period for r in reports} == {1000}
    assert len({r.report_id for r in reports}) == len(reports)
    assert {topic for topic, _ in messages} == {"ldp/v1/reports/safari-energy-domains"}


def test_counter_reports_estimate_the_mean() -> None:
    """20-record 1BitMean reports decode and their mean estimate lies within 5 SE of the generator's mean."""
    registry = parse_registry(REGISTRY.read_bytes())
    uc = registry.use_cases["app-usage-seconds"]
    messages = build_counters(registry, 1_000, seed=4, period=7)
    aggregate = uc.server.new_aggregate()
    for _, payload in messages:
        report = decode_report(payload, registry)
        assert report.count == 20
        uc.server.fold(aggregate, report.batch)
    estimate = mean_server(uc.server).estimate_mean(aggregate)
    # Values are Exponential(3600 s) clipped at m = 21,600: the mean is 3600 (1 - e^-6).
    truth = 3600.0 * (1 - math.exp(-6.0))
    assert abs(estimate.value - truth) <= 5 * estimate.standard_error
