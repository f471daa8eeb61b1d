"""End to end through a real Mosquitto: several clients, a shared subscription, hostile messages."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import msgpack
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from collector.config import CollectorConfig, load_config
from collector.metrics import render_prometheus
from collector.mqtt import READ_PAUSE_S
from collector.service import Service, run_service
from collector.store import CheckpointStore
from protocol.registry import Registry
from protocol.wire import Report, encode_report
from runtime.clock import WallClock
from tests.collector.processes import write_config
from tests.collector.support import (
    bit_reports,
    current_period,
    plain_equal,
    privatized_reports,
    reference_aggregates,
    run_async,
)
from tests.support.broker import Broker
from tests.support.mqtt_publisher import MqttPublisher


@contextlib.asynccontextmanager
async def _running(config: CollectorConfig, *, clock: WallClock | None = None) -> AsyncIterator[Service]:
    """The collector service in this event loop, until the block ends (then a clean stop)."""
    stop = asyncio.Event()
    ready: asyncio.Future[Service] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_service(config, clock=clock, stop=stop, on_ready=ready.set_result))
    try:
        waiting: set[asyncio.Future[object]] = {task, ready}  # type: ignore[arg-type]
        done, _ = await asyncio.wait(waiting, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        assert ready in done, "the collector did not subscribe"
        yield ready.result()
    finally:
        stop.set()
        await asyncio.wait_for(task, 120)


async def _until_committed(service: Service, reports: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while service.metrics.reports < reports:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{service.metrics.reports} of {reports} reports committed")
        await asyncio.sleep(0.02)


def _paho_publish(broker: Broker, client_id: str, items: list[tuple[str, bytes]], *, v5: bool) -> None:
    """An independent MQTT implementation (paho) publishing at QoS 1, as an agent would."""
    protocol = paho.MQTTv5 if v5 else paho.MQTTv311
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        infos = [client.publish(topic, payload, qos=1) for topic, payload in items]
        for info in infos:
            info.wait_for_publish(timeout=30)
            assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


def _store_aggregates(path: Path, registry: Registry) -> dict[tuple[str, int], object]:
    store = CheckpointStore(path, registry, readonly=True)
    try:
        return {(k.use_case, k.period): store.aggregate(k.use_case, k.period)[0] for k in store.totals()}
    finally:
        store.close()


def _mixed_stream(registry: Registry, per_use_case: int, seed: int) -> list[tuple[str, bytes]]:
    items = []
    for i, name in enumerate(sorted(registry.use_cases)):
        period = current_period(registry, name)
        records = 3 if name in ("usage", "hist", "domains") and registry.use_cases[name].daily_limit >= 3 else 1
        for r in privatized_reports(registry, name, per_use_case, period=period, seed=seed + i, records=records):
            items.append((f"ldp/v1/reports/{name}", encode_report(r)))
    return items


@run_async
async def test_reports_from_several_clients_sum_exactly(
    tmp_path: Path, mosquitto: Broker, registry: Registry, registry_path: Path
) -> None:
    """Reports of every mechanism from paho (MQTT 5 and 3.1.1) and native clients fold to their exact sum."""
    config = load_config(write_config(tmp_path, registry=registry_path, host=mosquitto.host, port=mosquitto.port))
    items = _mixed_stream(registry, 60, seed=500)
    parts = [items[i::4] for i in range(4)]
    async with _running(config) as service:
        # After a short read the socket is left to fill, never longer than a quarter of the
        # commit interval (white-box: the pause the service chose).
        pause = service.transport.sessions[0]._read_pause_s
        assert pause == min(READ_PAUSE_S, config.ingest.commit_interval_s / 4) > 0
        await asyncio.gather(
            asyncio.to_thread(_paho_publish, mosquitto, "device-a", parts[0], v5=True),
            asyncio.to_thread(_paho_publish, mosquitto, "device-b", parts[1], v5=False),
            asyncio.to_thread(_paho_publish, mosquitto, "device-c", parts[2], v5=True),
            MqttPublisher(mosquitto.host, mosquitto.port, client_id="device-d").publish_all(parts[3]),
        )
        await _until_committed(service, len(items))
        assert service.metrics.rejected == {}
    reference = reference_aggregates(registry, [p for _, p in items])
    stored = _store_aggregates(config.store.path, registry)
    assert set(stored) == set(reference)
    for key, agg in reference.items():
        assert plain_equal(stored[key], agg), key


@run_async
async def test_shared_subscription_splits_the_stream_and_counts_each_report_once(
    tmp_path: Path, mosquitto: Broker, registry: Registry, registry_path: Path
) -> None:
    """Two collectors in one MQTT 5 shared-subscription group share the work and one database; retries fold once."""
    store = tmp_path / "shared.sqlite3"
    configs = [
        load_config(
            write_config(
                tmp_path,
                registry=registry_path,
                host=mosquitto.host,
                port=mosquitto.port,
                client_id=f"collector-{i}",
                instance=f"member-{i}",
                store=store,
                shared_group="collectors",
            )
        )
        for i in range(2)
    ]
    period = current_period(registry, "usage")
    payloads = list(bit_reports(registry, "usage", 6000, period=period, seed=9, records=20))
    # Every 10th report is sent twice, as a device retries after a lost PUBACK: the copies
    # can reach different members, and only the shared report-id table catches that.
    retried = payloads + payloads[::10]
    async with _running(configs[0]) as first, _running(configs[1]) as second:
        await MqttPublisher(mosquitto.host, mosquitto.port, client_id="gw").publish_all(
            ("ldp/v1/reports/usage", p) for p in retried
        )
        deadline = time.monotonic() + 120  # a hang guard only
        while first.metrics.messages + second.metrics.messages < len(retried) or first.ingest._tokens:
            assert time.monotonic() < deadline, "messages not all received"
            await asyncio.sleep(0.02)
        await _until_committed_pair(first, second, len(payloads))
        split = (first.metrics.messages, second.metrics.messages)
    assert min(split) > len(retried) // 5, f"the group did not share the stream: {split}"
    assert first.metrics.reports + second.metrics.reports == len(payloads)
    assert first.metrics.duplicates + second.metrics.duplicates == len(payloads[::10])
    stored = _store_aggregates(store, registry)
    reference = reference_aggregates(registry, payloads)
    assert plain_equal(stored[(registry["usage"].ref, period)], reference[(registry["usage"].ref, period)])


async def _until_committed_pair(a: Service, b: Service, reports: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while a.metrics.reports + b.metrics.reports < reports:
        if time.monotonic() > deadline:
            raise TimeoutError("not all reports committed")
        await asyncio.sleep(0.02)


def _hostile(registry: Registry, other: Registry) -> tuple[list[tuple[str, bytes]], dict[str, int]]:
    """Bad messages of every kind, and how each must be counted."""
    flag = registry.use_cases["flag"]
    now = current_period(registry, "flag")

    def env(**changes: object) -> bytes:
        base = {"v": 1, "u": "flag", "h": registry.hash, "p": now, "i": b"\x07" * 16, "r": [1]}
        base.update(changes)
        return bytes(msgpack.packb(base, use_bin_type=True))

    def valid(period: int, rid: bytes, definition: bytes = flag.definition) -> bytes:
        report = Report(use_case=flag.name, definition=definition, period=period, report_id=rid, records=[1])
        return encode_report(report)

    cases: list[tuple[bytes, str]] = [
        (b"", "truncated"),
        (b"\x93\x01", "truncated"),
        (b"\xc1", "bad-encoding"),
        (b"\x01", "bad-type"),
        (valid(now, b"\x01" * 16) + b"\x00", "trailing-bytes"),
        (b"\x00" * 70_000, "oversize"),
        (valid(now, b"\x02" * 16, b"\xee" * 16), "unknown-definition"),
        (env(h=other.hash), "registry-mismatch"),  # format 1, made under a registry we were not given
        (env(u="no-such-use-case"), "unknown-use-case"),
        (env(v=3), "unknown-version"),
        (env(r=[2]), "out-of-range"),
        (env(i=b"short"), "bad-length"),
        (env(x=1), "unknown-field"),
        (valid(now - 200, b"\x03" * 16), "period-expired"),
        (valid(now + 5, b"\x04" * 16), "period-future"),
    ]
    expected: dict[str, int] = {}
    items = []
    for payload, reason in cases:
        items.append(("ldp/v1/reports/flag", payload))
        expected[reason] = expected.get(reason, 0) + 1
    return items, expected


@run_async
async def test_hostile_messages_are_counted_by_reason_and_valid_ones_all_folded(
    tmp_path: Path, mosquitto: Broker, registry: Registry, registry_path: Path
) -> None:
    """Malformed, oversize, replayed and foreign-registry messages mixed in: counted by reason, nothing else lost."""
    other = replace(registry, hash=b"\xee" * 16)  # reports "made under" another registry version
    config = load_config(write_config(tmp_path, registry=registry_path, host=mosquitto.host, port=mosquitto.port))
    period = current_period(registry, "flag")
    valid = [("ldp/v1/reports/flag", p) for p in bit_reports(registry, "flag", 3000, period=period, seed=21)]
    # Each of these comes from its own device identity (within its allowance); the identity
    # goes no further than the allowance, the payload counts.
    valid += [
        (f"ldp/v1/reports/device-{i}/usage", p)
        for i, p in enumerate(
            bit_reports(registry, "usage", 50, period=current_period(registry, "usage"), seed=22, records=20)
        )
    ]
    bad, expected = _hostile(registry, other)
    replays = [valid[i] for i in range(0, 3000, 30)]
    stream: list[tuple[str, bytes]] = []
    for i, item in enumerate(valid):
        stream.append(item)
        if i % 200 == 0 and bad:
            stream.append(bad.pop())
    stream += bad
    async with _running(config) as service:
        await MqttPublisher(mosquitto.host, mosquitto.port, client_id="mixed").publish_all(stream)
        await _until_committed(service, len(valid))
        # Replays of reports already committed, and the whole hostile set once more, later.
        again, _ = _hostile(registry, other)
        await MqttPublisher(mosquitto.host, mosquitto.port, client_id="replayer").publish_all(replays + again)
        deadline = time.monotonic() + 120  # a hang guard only
        total = len(stream) + len(replays) + len(again)
        while service.metrics.messages < total or service.ingest._tokens or service.metrics.duplicates < len(replays):
            assert time.monotonic() < deadline, service.metrics
            await asyncio.sleep(0.02)
        assert service.transport.statistics().connected
        assert service.metrics.reports == len(valid)
        assert service.metrics.duplicates == len(replays)
        assert dict(service.metrics.rejected) == {k: 2 * v for k, v in expected.items()}
        text = render_prometheus(service.metrics, service.transport.statistics(), instance="t")
        for reason, count in expected.items():
            assert f'ldp_collector_rejected_total{{reason="{reason}"}} {float(2 * count)}\n' in text
        assert f"ldp_collector_duplicates_total {float(len(replays))}\n" in text
        for name in ("aggregation_lag_seconds", "checkpoint_age_seconds", "buffer_fill_ratio", "messages_total"):
            assert f"\nldp_collector_{name} " in text
    reference = reference_aggregates(registry, [p for _, p in valid])
    stored = _store_aggregates(config.store.path, registry)
    for key, agg in reference.items():
        assert plain_equal(stored[key], agg), key
    counters = CheckpointStore(config.store.path, registry, readonly=True).counters()
    assert counters["rejected:oversize"] == 2
    assert counters["duplicates"] == len(replays)
