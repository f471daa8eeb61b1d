"""Ingest through an in-memory transport: exact folding, de-duplication, windows, acks after commit."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import pytest

from collector import ingest as ingest_module
from collector.config import IngestConfig
from collector.errors import StoreUnavailable
from collector.ingest import Ingest, StoreThread
from collector.metrics import IngestMetrics
from collector.store import CheckpointStore, CommitResult, FoldedReport
from collector.transport import MemoryTransport
from protocol.registry import Registry
from protocol.wire import decode_report, encode_report
from tests.collector.conftest import FixedClock
from tests.collector.support import (
    bit_reports,
    current_period,
    plain_equal,
    privatized_reports,
    reference_aggregates,
    run_async,
)


async def _until(predicate: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.005)


def _all_payloads(registry: Registry, now: float, per_use_case: int) -> list[bytes]:
    payloads = []
    for i, name in enumerate(sorted(registry.use_cases)):
        period = current_period(registry, name, now)
        reports = privatized_reports(
            registry,
            name,
            per_use_case,
            period=period,
            seed=100 + i,
            records=2 if name in ("usage", "hist", "domains") else 1,
        )
        payloads += [encode_report(r) for r in reports]
    return payloads


async def _run_ingest(
    tmp_path: Path,
    registry: Registry,
    clock: FixedClock,
    batches: Iterable[list[bytes]],
    *,
    config: IngestConfig | None = None,
    between: Callable[[MemoryTransport], None] | None = None,
) -> tuple[MemoryTransport, IngestMetrics, StoreThread[CheckpointStore]]:
    transport = MemoryTransport()
    metrics = IngestMetrics()
    store = StoreThread(lambda: CheckpointStore(tmp_path / "ingest.sqlite3", registry, instance="t"))
    ingest = Ingest(
        catalog=registry,
        transport=transport,
        store=store,
        config=config or IngestConfig(commit_max_reports=64, commit_interval_s=0.01),
        metrics=metrics,
        clock=clock,
    )
    task = asyncio.create_task(ingest.run())
    try:
        for batch in batches:
            for p in batch:
                transport.push(p)
            if between is not None:
                between(transport)
            await _until(lambda: transport.unacked == 0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return transport, metrics, store


async def _aggregates(store: StoreThread[CheckpointStore]) -> dict[tuple[str, int], object]:
    def read(s: CheckpointStore) -> dict[tuple[str, int], object]:
        return {(k.use_case, k.period): s.aggregate(k.use_case, k.period)[0] for k in s.totals()}

    return await store.call(read)


@run_async
async def test_every_report_of_every_mechanism_is_folded_exactly(
    tmp_path: Path, registry: Registry, clock: FixedClock
) -> None:
    """Reports of all mechanisms give stored aggregates equal to the reference sums, and all are acked."""
    payloads = _all_payloads(registry, clock.now, 150)
    transport, metrics, store = await _run_ingest(tmp_path, registry, clock, [payloads])
    try:
        stored = await _aggregates(store)
        reference = reference_aggregates(registry, payloads)
        assert set(stored) == set(reference)
        for key, agg in reference.items():
            assert plain_equal(stored[key], agg), key
        assert len(transport.acked) == len(payloads)
        assert metrics.reports == len(payloads)
        assert metrics.rejected == {}
    finally:
        store.close()


@run_async
async def test_redelivered_and_replayed_reports_are_counted_once(
    tmp_path: Path, registry: Registry, clock: FixedClock
) -> None:
    """A reconnect redelivering unacked messages and a later replay of everything add nothing twice."""
    period = current_period(registry, "flag", clock.now)
    payloads = list(bit_reports(registry, "flag", 500, period=period, seed=7))
    reconnected: list[bool] = []

    def reconnect_once(t: MemoryTransport) -> None:
        if not reconnected:
            reconnected.append(True)
            t.reconnect()

    _, metrics, store = await _run_ingest(tmp_path, registry, clock, [payloads, payloads[:200]], between=reconnect_once)
    try:
        stored = await _aggregates(store)
        reference = reference_aggregates(registry, payloads)
        assert plain_equal(stored[(registry["flag"].ref, period)], reference[(registry["flag"].ref, period)])
        assert metrics.reports == 500
        assert metrics.duplicates >= 200
        counters = await store.call(lambda s: s.counters())
        assert counters["reports"] == 500
    finally:
        store.close()


@run_async
async def test_periods_outside_the_window_are_rejected_by_reason(
    tmp_path: Path, registry: Registry, clock: FixedClock
) -> None:
    """Reports for expired or future periods are refused and counted; the others folded."""
    config = IngestConfig(commit_max_reports=64, commit_interval_s=0.01, retention_periods=3, future_periods=1)
    now = current_period(registry, "flag", clock.now)
    ok = list(bit_reports(registry, "flag", 10, period=now - 2, seed=1))
    old = list(bit_reports(registry, "flag", 4, period=now - 3, seed=2))
    ahead = list(bit_reports(registry, "flag", 5, period=now + 2, seed=3))
    soon = list(bit_reports(registry, "flag", 6, period=now + 1, seed=4))
    _, metrics, store = await _run_ingest(tmp_path, registry, clock, [ok + old + ahead + soon], config=config)
    try:
        assert metrics.reports == 16
        assert metrics.rejected == {"period-expired": 4, "period-future": 5}
    finally:
        store.close()


@run_async
async def test_acknowledgement_waits_for_the_commit(tmp_path: Path, registry: Registry, clock: FixedClock) -> None:
    """No message is acknowledged before the transaction holding it has committed."""
    period = current_period(registry, "flag", clock.now)
    payloads = list(bit_reports(registry, "flag", 300, period=period, seed=9))
    transport = MemoryTransport()
    path = tmp_path / "ack.sqlite3"
    store = StoreThread(lambda: CheckpointStore(path, registry, instance="t"))
    committed_before_ack: list[int] = []
    original_ack = transport.ack

    def checking_ack(tokens: Sequence[int]) -> None:
        # Read the database from another connection: what is acknowledged must be there.
        reader = CheckpointStore(path, registry, readonly=True)
        try:
            committed_before_ack.append(sum(k.reports for k in reader.totals()))
        finally:
            reader.close()
        acked_after = len(transport.acked) + sum(1 for t in tokens if t >= 0)
        assert committed_before_ack[-1] >= acked_after
        original_ack(tokens)

    transport.ack = checking_ack  # type: ignore[method-assign]
    ingest = Ingest(
        catalog=registry,
        transport=transport,
        store=store,
        config=IngestConfig(commit_max_reports=50, commit_interval_s=0.01),
        metrics=IngestMetrics(),
        clock=clock,
    )
    task = asyncio.create_task(ingest.run())
    try:
        for p in payloads:
            transport.push(p)
        await _until(lambda: transport.unacked == 0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        store.close()
    assert len(committed_before_ack) >= 6
    assert len(transport.acked) == 300


@pytest.mark.parametrize("commit_max", [1, 7, 4000])
@run_async
async def test_batching_does_not_change_the_sums(
    tmp_path: Path, registry: Registry, clock: FixedClock, commit_max: int
) -> None:
    """The stored aggregate is the same whatever the commit size (folding is exact)."""
    period = current_period(registry, "usage", clock.now)
    payloads = list(bit_reports(registry, "usage", 120, period=period, seed=11, records=20))
    config = IngestConfig(commit_max_reports=commit_max, commit_interval_s=0.005)
    _, metrics, store = await _run_ingest(tmp_path, registry, clock, [payloads], config=config)
    try:
        stored = await _aggregates(store)
        reference = reference_aggregates(registry, payloads)
        assert plain_equal(stored[(registry["usage"].ref, period)], reference[(registry["usage"].ref, period)])
        assert metrics.records == 120 * 20
    finally:
        store.close()


@run_async
async def test_a_decoder_bug_is_counted_not_fatal(
    tmp_path: Path, registry: Registry, clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decoder that breaks its promise (raises something else) costs one message, not the service."""
    real = decode_report
    poison = b"\x81\xa1v\x01"

    def flaky(data: bytes, *args: object, **kwargs: object) -> object:
        if data == poison:
            raise ZeroDivisionError("a bug")
        return real(data, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ingest_module, "decode_report", flaky)
    period = current_period(registry, "flag", clock.now)
    payloads = list(bit_reports(registry, "flag", 20, period=period, seed=5))
    transport, metrics, store = await _run_ingest(tmp_path, registry, clock, [[*payloads[:10], poison, *payloads[10:]]])
    try:
        assert metrics.reports == 20
        assert metrics.rejected == {"decoder-error": 1}
        assert len(transport.acked) == 21
    finally:
        store.close()


class _FailingStore(CheckpointStore):
    """A checkpoint store whose commits fail with StoreUnavailable while ``failing`` is set."""

    failing = True
    attempts = 0

    def commit(
        self, reports: Sequence[FoldedReport], counters: Mapping[str, int], senders: Sequence[bytes] | None = None
    ) -> CommitResult:
        type(self).attempts += 1
        if type(self).failing:
            raise StoreUnavailable("disk-full", str(self.path), "the disk is full (SQLITE_FULL)")
        return super().commit(reports, counters, senders)


@run_async
async def test_a_store_that_cannot_commit_gets_nothing_acknowledged_and_ingest_resumes_by_itself(
    tmp_path: Path, registry: Registry, clock: FixedClock
) -> None:
    """While commits fail: no ack, no further reading, the cause is reported; once they succeed all is counted once."""
    period = current_period(registry, "usage", clock.now)
    payloads = list(bit_reports(registry, "usage", 400, period=period, seed=21, records=20))
    transport = MemoryTransport()
    metrics = IngestMetrics()
    _FailingStore.failing, _FailingStore.attempts = True, 0
    store = StoreThread(lambda: _FailingStore(tmp_path / "f.sqlite3", registry, instance="t"))
    ingest = Ingest(
        catalog=registry,
        transport=transport,
        store=store,
        config=IngestConfig(commit_max_reports=50, commit_interval_s=0.01),
        metrics=metrics,
        clock=clock,
    )
    task = asyncio.create_task(ingest.run())
    try:
        for p in payloads:
            transport.push(p)
        await _until(lambda: _FailingStore.attempts >= 4)  # the first batch, retried with backoff
        assert metrics.store_error == "disk-full"
        assert "f.sqlite3" in metrics.store_error_detail
        assert metrics.store_failures["disk-full"] >= 4
        assert transport.acked == []
        # Reading stopped: at most the failed batch and one buffer were taken from the transport.
        assert metrics.messages <= 2 * 50
        _FailingStore.failing = False
        await _until(lambda: transport.unacked == 0, timeout=60.0)
        assert metrics.store_error == ""
        stored = await _aggregates(store)
        reference = reference_aggregates(registry, payloads)
        assert plain_equal(stored[(registry["usage"].ref, period)], reference[(registry["usage"].ref, period)])
        assert metrics.reports == len(payloads)
        assert len(transport.acked) == len(payloads)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        store.close()
