"""Bounded influence per device: the collector folds at most one report per (device identity, use
case, period), counts the rest by reason, and forgets the identity's keyed hash (and its key)
when the period closes: no table, log line or API response holds either afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import sqlite3
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from collector import service as service_module
from collector.config import CollectorConfig, IngestConfig, load_config
from collector.ingest import Ingest, StoreThread
from collector.metrics import IngestMetrics
from collector.service import Service, run_service
from collector.transport import MemoryTransport
from protocol.randomized_response import RandomizedResponse
from protocol.registry import Registry
from protocol.server.randomized_response import RRAggregate, RRBatch
from protocol.wire import Report, decode_report, encode_report
from tests.collector.conftest import FixedClock
from tests.collector.stores import StoreSite, sqlite_allowance
from tests.collector.support import bit_reports, current_period, privatized_reports, run_async
from tests.support.broker import Broker, free_port
from tests.support.mqtt_publisher import MqttPublisher

ATTACKS = 2000


async def _ingest_all(
    site: StoreSite,
    registry: Registry,
    clock: FixedClock,
    items: Sequence[tuple[bytes, bytes]],
    *,
    config: IngestConfig | None = None,
) -> tuple[MemoryTransport, IngestMetrics, StoreSite]:
    """Push ``(payload, sender)`` items through ingest into a fresh store; wait until all are acknowledged."""
    transport = MemoryTransport()
    metrics = IngestMetrics()
    store = StoreThread(lambda: site.open(registry, instance="t"))
    ingest = Ingest(
        catalog=registry,
        transport=transport,
        store=store,
        config=config or IngestConfig(commit_max_reports=256, commit_interval_s=0.01),
        metrics=metrics,
        clock=clock,
    )
    task = asyncio.create_task(ingest.run())
    try:
        for payload, sender in items:
            transport.push(payload, sender)
        deadline = time.monotonic() + 60
        while len(transport.acked) < len(items):
            assert time.monotonic() < deadline, f"{len(transport.acked)} of {len(items)} acknowledged"
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        store.close()
    return transport, metrics, site


def _ones(registry: Registry, payloads: Sequence[bytes]) -> tuple[int, int]:
    """(ones, records) over the rr payloads."""
    ones = n = 0
    for p in payloads:
        batch = decode_report(p, registry).batch
        assert isinstance(batch, RRBatch)
        ones += int(batch.bits.sum())
        n += len(batch)
    return ones, n


def _keep(registry: Registry) -> float:
    mechanism = registry.use_cases["flag"].mechanism
    assert isinstance(mechanism, RandomizedResponse)
    return mechanism.keep_probability


def _estimate(registry: Registry, ones: int, n: int) -> float:
    p = _keep(registry)
    return (ones / n - (1 - p)) / (2 * p - 1)


@run_async
async def test_one_identity_sending_2000_reports_moves_the_estimate_by_one_device_at_most(
    site: StoreSite, registry: Registry, clock: FixedClock
) -> None:
    """2,000 valid reports from one identity (allowance 1): 1 folded, 1,999 rejected as over-allowance."""
    period = current_period(registry, "flag", clock.time())
    honest = list(bit_reports(registry, "flag", 400, period=period, seed=5))
    gen = np.random.default_rng(6)
    attack = [
        encode_report(
            Report(
                use_case="flag",
                definition=registry["flag"].definition,
                period=period,
                report_id=gen.bytes(16),
                records=[1],
            )
        )
        for _ in range(ATTACKS)
    ]
    items = [(p, f"device-{i}".encode()) for i, p in enumerate(honest)]
    # The attacker's reports arrive first and among the honest ones: order does not matter.
    stream = [(p, b"mallory") for p in attack[:10]] + items[:200] + [(p, b"mallory") for p in attack[10:]] + items[200:]
    _, metrics, _ = await _ingest_all(site, registry, clock, stream)

    assert metrics.rejected["over-allowance"] == ATTACKS - 1
    assert metrics.reports == len(honest) + 1
    store = site.open(registry, readonly=True)
    try:
        agg, info = store.aggregate(registry["flag"].ref, period)
        counters = store.counters()
    finally:
        store.close()
    assert counters["rejected:over-allowance"] == ATTACKS - 1
    assert info.reports == len(honest) + 1
    ones, n = _ones(registry, honest)
    assert isinstance(agg, RRAggregate)
    assert (agg.n, agg.ones) == (n + 1, ones + 1)  # exactly the honest reports and one of mallory's
    p = _keep(registry)
    before = _estimate(registry, ones, n)
    after = agg.estimate().value
    # One device's worth: one record moves the debiased proportion by at most 1 / ((n + 1)(2p - 1)).
    assert abs(after - before) <= 1 / ((n + 1) * (2 * p - 1)) + 1e-12
    unbounded = _estimate(registry, ones + ATTACKS, n + ATTACKS)
    assert unbounded - before > 0.5  # what the same 2,000 reports would have done without the allowance


@run_async
async def test_a_resent_report_is_a_duplicate_not_over_allowance(
    site: StoreSite, registry: Registry, clock: FixedClock
) -> None:
    """An agent's retry (the same bytes, the same report id) is a duplicate and costs no allowance."""
    period = current_period(registry, "flag", clock.time())
    (report,) = bit_reports(registry, "flag", 1, period=period, seed=9)
    _, metrics, _ = await _ingest_all(
        site, registry, clock, [(report, b"dev-a"), (report, b"dev-a"), (report, b"dev-a")]
    )
    assert metrics.reports == 1
    assert metrics.duplicates == 2
    assert metrics.rejected["over-allowance"] == 0


@run_async
async def test_reports_without_identity_are_refused_when_required(
    site: StoreSite, registry: Registry, clock: FixedClock
) -> None:
    """With require_device_identity, a report whose topic names no device is rejected as no-identity."""
    period = current_period(registry, "flag", clock.time())
    reports = list(bit_reports(registry, "flag", 3, period=period, seed=10))
    config = IngestConfig(commit_max_reports=8, commit_interval_s=0.01, require_device_identity=True)
    _, metrics, _ = await _ingest_all(
        site, registry, clock, [(reports[0], b""), (reports[1], b"dev-a"), (reports[2], b"")], config=config
    )
    assert metrics.reports == 1
    assert metrics.rejected["no-identity"] == 2


# --------------------------------------------------------------------------- forgetting


@contextlib.asynccontextmanager
async def _running(config: CollectorConfig, clock: FixedClock) -> AsyncIterator[Service]:
    stop = asyncio.Event()
    ready: asyncio.Future[Service] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_service(config, clock=clock, stop=stop, on_ready=ready.set_result))
    try:
        waiting: set[asyncio.Future[object]] = {task, ready}  # type: ignore[arg-type]
        done, _ = await asyncio.wait(waiting, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        assert ready in done, "the collector did not subscribe"
        yield ready.result()
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def _get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        return bytes(response.read())


def _dump(path: Path) -> str:
    """Every row of every table, as SQL text (blobs in hex)."""
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return "\n".join(db.iterdump())
    finally:
        db.close()


def _raw(path: Path) -> bytes:
    """The database file and its WAL, byte for byte."""
    return b"".join(p.read_bytes() for p in (path, path.with_name(path.name + "-wal")) if p.exists())


@run_async
async def test_no_identity_or_its_hash_remains_after_the_period_closes(
    tmp_path: Path,
    *,
    mosquitto: Broker,
    registry: Registry,
    registry_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Identities reach the allowance and nothing else; after the period closes, no table, log or API response holds
    an identity, its tag or the period's key (the database file and its WAL are searched byte for byte)."""
    monkeypatch.setattr(service_module, "MAINTENANCE_INTERVAL_S", 0.05)
    caplog.set_level(logging.DEBUG)
    clock = FixedClock()
    http_port = free_port()
    db_path = tmp_path / "collector.sqlite3"
    config_path = tmp_path / "collector.toml"
    config_path.write_text(
        f"""registry = "{registry_path}"
instance = "forget"
[mqtt]
host = "{mosquitto.host}"
port = {mosquitto.port}
client_id = "ldp-collector-forget"
reconnect_max_s = 0.5
[ingest]
commit_max_reports = 500
commit_interval_s = 0.05
retention_periods = 2
require_device_identity = true
[store]
path = "{db_path}"
[http]
enabled = true
port = {http_port}
""",
        encoding="utf-8",
    )
    config = load_config(config_path)
    period = current_period(registry, "flag", clock.time())
    identities = [f"dev-{i:04d}-7f3a9c".encode() for i in range(300)]
    payloads = list(bit_reports(registry, "flag", len(identities), period=period, seed=11))
    items = [(f"ldp/v1/reports/{who.decode()}/flag", p) for who, p in zip(identities, payloads, strict=True)]
    items += [
        ("ldp/v1/reports/dev-0000-7f3a9c/flag", p) for p in bit_reports(registry, "flag", 5, period=period, seed=12)
    ]
    async with _running(config, clock) as service:
        await MqttPublisher(mosquitto.host, mosquitto.port, client_id="devices").publish_all(items)
        deadline = time.monotonic() + 60
        while service.metrics.reports + service.metrics.rejected["over-allowance"] < len(items):
            assert time.monotonic() < deadline, service.metrics
            await asyncio.sleep(0.02)
        assert service.metrics.reports == len(identities)
        assert service.metrics.rejected["over-allowance"] == 5

        # While the period is open, its key and the tags exist (the check below would be vacuous otherwise).
        db = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
        (key,) = db.execute("SELECT key FROM allowance_keys").fetchone()
        tags = sqlite_allowance(db)
        db.close()
        assert len(tags) == len(identities)
        secrets_ = [bytes(key)] + [
            hashlib.blake2b(who, key=bytes(key), digest_size=16, person=b"ldp-allowance").digest() for who in identities
        ]
        assert secrets_[1].hex().upper() in _dump(db_path)

        # The period closes: the clock passes the retention window, maintenance prunes it.
        clock.now += (2 + 1) * registry.use_cases["flag"].period.seconds
        deadline = time.monotonic() + 30
        while True:
            db = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
            left = db.execute("SELECT count(*) FROM allowance_keys")
            remaining = left.fetchone()[0] + len(sqlite_allowance(db))
            db.close()
            if remaining == 0:
                break
            assert time.monotonic() < deadline, f"{remaining} allowance rows left"
            await asyncio.sleep(0.05)
        await service.store.call(lambda s: s.prune(s.low_water()))  # one more pass: its WAL checkpoint, no reader open
        paths = (
            "/",
            "/metrics",
            "/healthz",
            "/api/v1/status",
            "/api/v1/use-cases",
            "/api/v1/use-cases/flag",
            f"/api/v1/use-cases/flag/estimate?period={period}",
            "/api/v1/use-cases/flag/series",
        )
        # The server runs in this event loop: the blocking client goes to a thread.
        responses = [await asyncio.to_thread(_get, http_port, p) for p in paths]
        assert json.loads(responses[3])  # the API answered
    text_rows = _dump(db_path)
    raw = _raw(db_path)
    logged = "\n".join(
        f"{r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in caplog.records if r.name.startswith("collector")
    )
    for who in identities:
        assert who.decode() not in text_rows
        assert who not in raw
        assert who.decode() not in logged
        for body in responses:
            assert who not in body
    for secret in secrets_:
        assert secret not in raw, "a key or tag of the closed period is still in the database file"
        assert secret.hex() not in text_rows.lower()
        assert secret.hex() not in logged
        for body in responses:
            assert secret not in body
            assert secret.hex().encode() not in body


def test_one_commit_judges_each_reports_allowance_on_its_own(site: StoreSite, registry: Registry) -> None:
    """Two reports of one identity in one commit, under two use cases but with the same report id:
    each has its own allowance slot and both are folded (on either backend)."""
    report_id = bytes(range(16))
    reports = []
    for name in ("flag", "usage"):
        (made,) = privatized_reports(registry, name, 1, period=current_period(registry, name, time.time()), seed=3)
        reports.append(decode_report(encode_report(replace(made, report_id=report_id)), registry))
    store = site.open(registry)
    try:
        result = store.commit(reports, {"messages": 2}, [b"dev-a", b"dev-a"])
    finally:
        store.close()
    assert (result.reports, result.over_allowance, result.duplicates) == (2, 0, 0)


def test_reports_over_the_allowance_are_judged_again_and_held_ids_are_told_from_new_ones(
    site: StoreSite, registry: Registry
) -> None:
    """A report refused as over the allowance is not remembered: sent again, it is over again, not a
    duplicate; the slot's count stays at its cap. A commit that mixes held ids, new ids and a
    repeat within itself folds exactly the new ones (on either backend)."""
    period = current_period(registry, "flag", time.time())
    made = [decode_report(p, registry) for p in bit_reports(registry, "flag", 6, period=period, seed=11)]
    store = site.open(registry)
    try:
        first = store.commit(made[:2], {}, [b"dev-a", b"dev-a"])
        assert (first.reports, first.over_allowance, first.duplicates) == (1, 1, 0)
        assert first.over_allowance_ids == {made[1].report_id}
        again = store.commit(made[:2], {}, [b"dev-a", b"dev-a"])
        assert (again.reports, again.over_allowance, again.duplicates) == (0, 1, 1)
        assert list(site.allowance_counts().values()) == [1]
        mixed = store.commit([made[0], made[2], made[3], made[2], made[4]], {}, [b"", b"dev-b", b"", b"", b"dev-c"])
        assert (mixed.reports, mixed.over_allowance, mixed.duplicates) == (3, 0, 2)
        assert store.seen_count() == 4
        last = store.commit([made[5], made[4]], {})
        assert (last.reports, last.duplicates) == (1, 1)
    finally:
        store.close()
