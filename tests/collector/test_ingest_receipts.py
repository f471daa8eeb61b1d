"""Commit receipts from ingest: after the commit, one message per response topic, honest outcomes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from collector.config import IngestConfig
from collector.ingest import Ingest, StoreThread
from collector.metrics import IngestMetrics, render_prometheus
from collector.store import CheckpointStore
from collector.transport import MemoryTransport
from protocol.registry import Registry
from protocol.wire import decode_report
from tests.collector.conftest import FixedClock
from tests.collector.support import bit_reports, current_period, run_async

PREFIX = b"ldp/v1/receipts/"


async def _until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.005)


def _rid(registry: Registry, payload: bytes) -> bytes:
    return decode_report(payload, registry).report_id


@run_async
async def test_receipts_follow_the_commit_with_each_outcome(
    tmp_path: Path, registry: Registry, clock: FixedClock
) -> None:
    """Fresh, duplicate, expired, malformed and foreign-topic requests get exactly the right answers."""
    config = IngestConfig(commit_max_reports=64, commit_interval_s=0.01, retention_periods=3)
    now = current_period(registry, "flag", clock.now)
    fresh = list(bit_reports(registry, "flag", 20, period=now, seed=1))
    old = list(bit_reports(registry, "flag", 3, period=now - 5, seed=2))
    ahead = list(bit_reports(registry, "flag", 2, period=now + 3, seed=5))
    transport = MemoryTransport()
    metrics = IngestMetrics()
    path = tmp_path / "r.sqlite3"
    store = StoreThread(lambda: CheckpointStore(path, registry, instance="t"))
    sent_at_commit: list[int] = []
    original = transport.send_receipts

    def checking(receipts: object, **route: int) -> None:
        # Whatever a receipt says counted is already in the database, read from outside.
        reader = CheckpointStore(path, registry, readonly=True)
        try:
            sent_at_commit.append(sum(k.reports for k in reader.totals()))
        finally:
            reader.close()
        original(receipts, **route)  # type: ignore[arg-type]

    transport.send_receipts = checking  # type: ignore[method-assign]
    ingest = Ingest(catalog=registry, transport=transport, store=store, config=config, metrics=metrics, clock=clock)
    task = asyncio.create_task(ingest.run())
    try:
        for i, p in enumerate(fresh):
            transport.push(p, reply_to=PREFIX + (b"a" if i % 2 else b"b"), correlation=_rid(registry, p))
        for p in old + ahead:
            transport.push(p, reply_to=PREFIX + b"a", correlation=_rid(registry, p))
        transport.push(b"\x92junk", reply_to=PREFIX + b"a", correlation=b"j" * 16)
        # A request aimed outside the prefix is ignored; its report still counts.
        transport.push(fresh[0], reply_to=b"ldp/v1/reports/x/flag", correlation=b"x" * 16)
        await _until(lambda: transport.unacked == 0)
        # A later resend of a report already folded is answered "counted" again.
        transport.push(fresh[1], reply_to=PREFIX + b"c", correlation=_rid(registry, fresh[1]))
        await _until(lambda: transport.unacked == 0 and len(transport.receipts) == 25)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        store.close()
    by_corr = {(t, r.correlation): r for t, r in transport.receipts}
    assert len(transport.receipts) == 25
    for i, p in enumerate(fresh):
        r = by_corr[(PREFIX + (b"a" if i % 2 else b"b"), _rid(registry, p))]
        assert r.counted
        assert r.reason == ""
    for p in old:
        r = by_corr[(PREFIX + b"a", _rid(registry, p))]
        assert not r.counted
        assert r.reason == "period-expired"
    for p in ahead:  # may count once the clock reaches its period: no receipt, the agent resends
        assert (PREFIX + b"a", _rid(registry, p)) not in by_corr
    junk = by_corr[(PREFIX + b"a", b"j" * 16)]
    assert not junk.counted
    assert junk.reason
    assert by_corr[(PREFIX + b"c", _rid(registry, fresh[1]))].counted
    assert all(not t.startswith(b"ldp/v1/reports") for t, _ in transport.receipts)
    assert metrics.receipt_requests_invalid == 1
    text = render_prometheus(metrics, transport.statistics(), instance="t")
    assert "ldp_collector_receipts_sent_total 25.0\n" in text
    assert "ldp_collector_receipts_dropped_total 0.0\n" in text
    assert "ldp_collector_receipt_requests_invalid_total 1.0\n" in text
    assert metrics.reports == 20
    # Per use case, what the receipts said: the 20 fresh reports and the later resend counted
    # (fresh[0]'s repeat too, if it reached the store in another commit than the first).
    flag = registry["flag"]
    assert set(metrics.use_case_reports) == {(flag.ref, "counted")}
    assert metrics.use_case_reports[flag.ref, "counted"] in (21, 22)
    definition = flag.definition.hex()[:8]
    assert (
        f'ldp_collector_use_case_reports_total{{definition="{definition}",outcome="counted",use_case="flag"}}' in text
    )
    assert f"ldp_collector_commit_latency_seconds_count {float(metrics.commits)}\n" in text
    assert f"ldp_collector_fold_batch_reports_sum {float(metrics.use_case_reports[flag.ref, 'counted'])}\n" in text
    assert sent_at_commit
    assert sent_at_commit[-1] == 20
    # The collector never persists a response topic (nor the prefix that marks one).
    for f in tmp_path.glob("r.sqlite3*"):
        assert b"receipts/" not in f.read_bytes(), f


@run_async
async def test_expired_at_commit_is_refused(tmp_path: Path, registry: Registry, clock: FixedClock) -> None:
    """A report the store refuses because the low-water mark moved past it gets a refusal."""
    now = current_period(registry, "flag", clock.now)
    reports = list(bit_reports(registry, "flag", 4, period=now - 1, seed=3))
    transport = MemoryTransport()
    metrics = IngestMetrics()
    store = StoreThread(lambda: CheckpointStore(tmp_path / "e.sqlite3", registry, instance="t"))
    # Another collector sharing the database moved the mark past the report's period.
    await store.call(lambda s: s.prune({registry["flag"].ref: now}))
    ingest = Ingest(
        catalog=registry,
        transport=transport,
        store=store,
        config=IngestConfig(commit_max_reports=64, commit_interval_s=0.01),
        metrics=metrics,
        clock=clock,
    )
    task = asyncio.create_task(ingest.run())
    try:
        for p in reports:
            transport.push(p, reply_to=PREFIX + b"z", correlation=_rid(registry, p))
        await _until(lambda: len(transport.receipts) == 4)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        store.close()
    assert all(not r.counted and r.reason == "period-expired" for _, r in transport.receipts)


@run_async
async def test_over_allowance_and_missing_identity_are_refused(
    tmp_path: Path, registry: Registry, clock: FixedClock
) -> None:
    """A second report of one device for one (use case, period) is refused "over-allowance"; a resend is counted."""
    now = current_period(registry, "flag", clock.now)
    first, second = bit_reports(registry, "flag", 2, period=now, seed=6)
    transport = MemoryTransport()
    store = StoreThread(lambda: CheckpointStore(tmp_path / "a.sqlite3", registry, instance="t"))
    ingest = Ingest(
        catalog=registry,
        transport=transport,
        store=store,
        config=IngestConfig(commit_max_reports=64, commit_interval_s=0.01, require_device_identity=True),
        metrics=IngestMetrics(),
        clock=clock,
    )
    task = asyncio.create_task(ingest.run())
    try:
        transport.push(first, b"dev-1", reply_to=PREFIX + b"dev-1/c1", correlation=_rid(registry, first))
        await _until(lambda: len(transport.receipts) == 1)
        transport.push(second, b"dev-1", reply_to=PREFIX + b"dev-1/c1", correlation=_rid(registry, second))
        transport.push(first, b"dev-1", reply_to=PREFIX + b"dev-1/c2", correlation=_rid(registry, first))
        transport.push(first, b"", reply_to=PREFIX + b"c3", correlation=_rid(registry, first))
        await _until(lambda: len(transport.receipts) == 4)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        store.close()
    got = {(t, r.correlation): (r.counted, r.reason) for t, r in transport.receipts}
    assert got == {
        (PREFIX + b"dev-1/c1", _rid(registry, first)): (True, ""),
        (PREFIX + b"dev-1/c1", _rid(registry, second)): (False, "over-allowance"),
        (PREFIX + b"dev-1/c2", _rid(registry, first)): (True, ""),
        (PREFIX + b"c3", _rid(registry, first)): (False, "no-identity"),
    }


@run_async
async def test_a_receipt_goes_only_under_its_senders_identity(
    tmp_path: Path, registry: Registry, clock: FixedClock
) -> None:
    """Another identity's receipt topic, or 0.1.0's layout, gets no receipt; each refusal is counted by reason."""
    now = current_period(registry, "flag", clock.now)
    reports = list(bit_reports(registry, "flag", 6, period=now, seed=9))
    transport = MemoryTransport()
    metrics = IngestMetrics()
    store = StoreThread(lambda: CheckpointStore(tmp_path / "s.sqlite3", registry, instance="t"))
    ingest = Ingest(
        catalog=registry,
        transport=transport,
        store=store,
        config=IngestConfig(commit_max_reports=64, commit_interval_s=0.01),
        metrics=metrics,
        clock=clock,
    )
    requests = [
        (b"dev-1", PREFIX + b"dev-1/c1"),  # its own: answered
        (b"fleet-sim/000042", PREFIX + b"fleet-sim/c2"),  # a sub-identity of the broker user fleet-sim: answered
        (b"dev-2", PREFIX + b"dev-1/c1"),  # dev-1's topic named by dev-2: refused
        (b"dev-2", PREFIX + b"dev-2/c1/deeper"),  # not one level under its user: refused
        (b"dev-2", PREFIX + b"c1"),  # the layout of 0.1.0, which names no user: refused
        (b"", PREFIX + b"c3"),  # no identity (a broker without ACL): answered as before
    ]
    task = asyncio.create_task(ingest.run())
    try:
        for payload, (sender, topic) in zip(reports, requests, strict=True):
            transport.push(payload, sender, reply_to=topic, correlation=_rid(registry, payload))
        await _until(lambda: transport.unacked == 0 and len(transport.receipts) == 3)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        store.close()
    assert sorted(t for t, _ in transport.receipts) == [PREFIX + b"c3", PREFIX + b"dev-1/c1", PREFIX + b"fleet-sim/c2"]
    assert metrics.receipt_requests_refused == {"other-identity": 2, "previous-layout": 1}
    assert metrics.receipt_requests_invalid == 0
    text = render_prometheus(metrics, transport.statistics(), instance="t")
    assert 'ldp_collector_receipt_requests_refused_total{reason="other-identity"} 2.0\n' in text
    assert 'ldp_collector_receipt_requests_refused_total{reason="previous-layout"} 1.0\n' in text
