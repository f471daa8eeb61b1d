"""Fault tests through a real Mosquitto: kill -9 the collector, restart the broker; count exactly once.

The stream size is ``LDP_FAULT_REPORTS`` (default 100,000 reports, which is what the
acceptance criterion asks for). Each test compares the final checkpoint with an in-process
reference aggregate of every published report, exactly (integer sums, not tolerances).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from protocol.registry import Registry
from tests.collector.processes import (
    BackgroundPublishers,
    CollectorProcess,
    committed,
    open_readonly,
    wait_committed,
    write_config,
)
from tests.collector.support import bit_reports, current_period, plain_equal, reference_aggregates
from tests.support.broker import Broker

REPORTS = int(os.environ.get("LDP_FAULT_REPORTS", "100000"))


def _stream(registry: Registry, total: int, seed: int) -> list[tuple[str, bytes]]:
    """Four fifths single-bit flags, one fifth 20-counter usage reports, interleaved."""
    usage = total // 5
    flags = total - usage
    items = [
        ("ldp/v1/reports/flag", p)
        for p in bit_reports(registry, "flag", flags, period=current_period(registry, "flag"), seed=seed)
    ]
    items += [
        ("ldp/v1/reports/usage", p)
        for p in bit_reports(
            registry, "usage", usage, period=current_period(registry, "usage"), seed=seed + 1, records=20
        )
    ]
    random.Random(seed).shuffle(items)
    return items


def _check_exact(store_path: Path | str, registry: Registry, items: list[tuple[str, bytes]]) -> dict[str, int]:
    """Every aggregate equals the reference of ``items``; every id remembered once. ``store_path``: file or URL."""
    reference = reference_aggregates(registry, [p for _, p in items])
    store = open_readonly(store_path, registry)
    assert store is not None, f"nothing was committed to {store_path}"
    try:
        totals = {(k.use_case, k.period): k for k in store.totals()}
        assert set(totals) == set(reference)
        for key, agg in reference.items():
            stored, info = store.aggregate(*key)
            assert plain_equal(stored, agg), f"aggregate {key} differs from the reference"
            assert info.reports == sum(1 for t, _ in items if t.endswith("/" + key[0].partition("@")[0]))
        assert store.seen_count() == len(items)
        return store.counters()
    finally:
        store.close()


def test_kill_9_ten_times_during_the_stream_counts_every_report_once(
    tmp_path: Path, mosquitto: Broker, registry: Registry, registry_path: Path
) -> None:
    """SIGKILL 10 times while QoS 1 reports stream in: every report is folded exactly once."""
    store_path = tmp_path / "ckpt.sqlite3"
    config = write_config(tmp_path, registry=registry_path, host=mosquitto.host, port=mosquitto.port, store=store_path)
    collector = CollectorProcess(config, log=tmp_path / "collector.log")
    items = _stream(registry, REPORTS, seed=1)
    chooser = random.Random(2024)
    try:
        collector.start()  # creates the persistent session before anything is published
        # The stream is let through in twelfths, one more before each kill; the collector must commit
        # some of it before the kill, and the last kill still finds the stream unfinished: the test
        # depends on counts, not on how fast this machine publishes or folds.
        step = max(1, len(items) // 12)
        chunk = max(1, min(500, step // 16))  # several paced chunks per client and step
        publishers = BackgroundPublishers(
            mosquitto.host, mosquitto.port, [items[i::4] for i in range(4)], rate=REPORTS / 20, chunk=chunk
        )
        publishers.allow(0)
        publishers.start()
        at_kill: list[int] = []
        for kill in range(10):
            publishers.allow(step * (kill + 1))
            wait_committed(store_path, registry, at_kill[-1] + 1 if at_kill else 1, timeout=300)
            # Kill at a random moment of the collector's life: during start-up catch-up,
            # mid-batch, or mid-commit.
            time.sleep(chooser.uniform(0.0, 0.5))
            at_kill.append(committed(store_path, registry).get("reports", 0))
            collector.kill9()
            collector.start()
        publishers.allow(None)
        publishers.join(timeout=600)  # a hang guard only
        assert publishers.published == len(items)
        counters = wait_committed(store_path, registry, len(items), timeout=600)
        assert collector.stop() == 0
        # The kills happened while reports were flowing: progress between them, not all at the end.
        assert at_kill == sorted(set(at_kill))
        assert at_kill[-1] < len(items)
        final = _check_exact(store_path, registry, items)
        assert final["reports"] == len(items) == counters["reports"]
        print(f"kills at committed={at_kill}; counters={final}")
    finally:
        collector.close()


def test_broker_restarts_during_the_stream_lose_and_duplicate_nothing(
    tmp_path: Path, mosquitto: Broker, registry: Registry, registry_path: Path
) -> None:
    """Restarting Mosquitto (persistence on) three times mid-stream: every report is folded exactly once."""
    store_path = tmp_path / "ckpt.sqlite3"
    config = write_config(tmp_path, registry=registry_path, host=mosquitto.host, port=mosquitto.port, store=store_path)
    collector = CollectorProcess(config, log=tmp_path / "collector.log")
    total = REPORTS
    items = _stream(registry, total, seed=3)
    try:
        collector.start()
        # Full speed and large chunks, so each restart finds messages in flight on both sides:
        # publishes not yet acknowledged to the devices, deliveries not yet acknowledged by us.
        step = max(1, len(items) // 4)
        chunk = max(1, min(5000, step // 3))
        publishers = BackgroundPublishers(
            mosquitto.host, mosquitto.port, [items[i::3] for i in range(3)], rate=None, chunk=chunk
        )
        publishers.allow(0)
        publishers.start()
        restarts_at: list[int] = []
        for restart in range(3):
            # Restart once the collector has folded part of the quarter just let through (a count,
            # not a time), while the rest of it is in flight.
            publishers.allow(step * (restart + 1))
            wait_committed(store_path, registry, (restarts_at[-1] if restarts_at else 0) + 1, timeout=300)
            restarts_at.append(committed(store_path, registry).get("reports", 0))
            mosquitto.restart()
        publishers.allow(None)
        publishers.join(timeout=600)  # a hang guard only
        wait_committed(store_path, registry, len(items), timeout=600)
        assert collector.stop() == 0
        assert restarts_at[-1] < len(items)
        final = _check_exact(store_path, registry, items)
        assert final["reports"] == len(items)
        print(f"broker restarts at committed={restarts_at}; publisher resent={publishers.resent}; counters={final}")
    finally:
        collector.close()
