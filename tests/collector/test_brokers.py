"""A collector on several brokers (``mqtt.addresses``): one session per broker feeding one
ingest, acknowledgements and receipts back through the broker that delivered, exactly once
across brokers, and a broker killed with -9 mid-stream costing nothing (two real Mosquittos)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.cli import main as collector_main
from collector.config import CollectorConfig, MqttConfig, load_config, parse_config
from collector.errors import ConfigError
from collector.metrics import IngestMetrics, render_prometheus
from collector.mqtt.brokers import BrokerSet
from collector.rendering import format_status
from collector.results import CollectorStatus, ServiceStatus
from collector.service import Service, run_service
from collector.store import CheckpointStore
from collector.transport import BrokerStatistics, TransportStatistics
from protocol.registry import Registry
from protocol.wire import decode_report
from tests.collector.brokers import ReceiptDevice, kill9
from tests.collector.support import bit_reports, current_period, run_async
from tests.support.broker import Broker, free_port, running_broker

REPORTS = int(os.environ.get("LDP_BROKERS_REPORTS", "4000"))
GUARD_S = 300.0  # hang guards only: every wait below ends on a count or a state


# -- configuration -------------------------------------------------------------------------


def test_addresses_give_one_config_per_broker() -> None:
    """``addresses`` gives one broker config each, sharing every other key; without it, one."""
    cfg = parse_config(
        {
            "registry": "r.toml",
            "mqtt": {"addresses": ["mqtt-a:8883", "[::1]:1884"], "shared_group": "g", "client_id": "c"},
        },
        source="collector.toml",
    )
    assert [(b.host, b.port, b.shared_group, b.client_id) for b in cfg.mqtt.brokers] == [
        ("mqtt-a", 8883, "g", "c"),
        ("::1", 1884, "g", "c"),
    ]
    one = parse_config({"registry": "r.toml", "mqtt": {"host": "b", "port": 1}}, source="collector.toml")
    assert one.mqtt.brokers == (one.mqtt,)


@pytest.mark.parametrize(
    ("mqtt", "expected"),
    [
        ({"addresses": ["mqtt-a"]}, "collector.toml: mqtt.addresses: expected 'host:port'"),
        ({"addresses": ["mqtt-a:0"]}, "collector.toml: mqtt.addresses: expected a port in [1, 65535]; got 'mqtt-a:0'"),
        ({"addresses": ["::1:1883"]}, "collector.toml: mqtt.addresses: expected 'host:port'"),
        ({"addresses": ["a:1", "a:1"]}, "collector.toml: mqtt.addresses: the same broker twice: 'a:1' and 'a:1'"),
        ({"addresses": ["a:1"], "host": "b"}, "collector.toml: mqtt.addresses: give either host and port"),
        ({"addresses": "a:1"}, "collector.toml: mqtt.addresses: "),
    ],
)
def test_bad_addresses_name_the_file_the_field_and_the_value(mqtt: dict[str, Any], expected: str) -> None:
    """A bad address stops start-up with an error naming the file, ``mqtt.addresses`` and the value."""
    with pytest.raises(ConfigError) as caught:
        parse_config({"registry": "r.toml", "mqtt": mqtt}, source="collector.toml")
    assert str(caught.value).startswith(expected), str(caught.value)


# -- what each broker's session shows --------------------------------------------------------

_A = BrokerStatistics(
    address="mqtt-a:8883", connected=False, since=1764197130.0, connects=2, received=5, acked=4, receipts_sent=3
)
_B = BrokerStatistics(
    address="mqtt-b:8883", connected=True, since=None, connects=1, received=7, acked=7, receipts_sent=0
)


def test_metrics_label_each_broker_session() -> None:
    """/metrics has each broker's session labelled ``broker="host:port"``; a session never up has no since."""
    stats = TransportStatistics(
        connected=False,
        connects=3,
        buffered=0,
        capacity=2,
        unacked=1,
        received=12,
        acked=11,
        stale_acks=0,
        dropped=0,
        brokers=(_A, _B),
    )
    text = render_prometheus(IngestMetrics(), stats, instance="t")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    a, b = (("broker", "mqtt-a:8883"),), (("broker", "mqtt-b:8883"),)
    assert samples["ldp_collector_broker_session_connected", a] == 0
    assert samples["ldp_collector_broker_session_connected", b] == 1
    assert samples["ldp_collector_broker_session_received_total", a] == 5
    assert samples["ldp_collector_broker_session_acked_total", b] == 7
    assert samples["ldp_collector_broker_session_receipts_sent_total", a] == 3
    assert samples["ldp_collector_broker_session_connects_total", a] == 2
    assert samples["ldp_collector_broker_session_since_seconds", a] == 1764197130.0
    assert ("ldp_collector_broker_session_since_seconds", b) not in samples
    assert samples["ldp_collector_broker_connected", ()] == 0  # the sum: not every broker is up


def test_statistics_sum_every_counter_over_the_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    """With several brokers, each counter is the sum of the sessions', ``connected`` holds only
    while every session is up, the ``$SYS`` counters add up topic by topic."""
    cfg = parse_config(
        {"registry": "r.toml", "mqtt": {"addresses": ["mqtt-a:8883", "mqtt-b:8883"]}}, source="collector.toml"
    )
    brokers = BrokerSet(cfg.mqtt)
    counters = dataclasses.fields(TransportStatistics)[1:13]  # connects .. receipts_dropped
    for i, (session, own) in enumerate(zip(brokers.sessions, (_A, _B), strict=True)):
        one = TransportStatistics(
            connected=own.connected,
            broker={"$SYS/broker/clients/connected": 2.0 + i},
            brokers=(own,),
            **{f.name: 10 * (i + 1) + k for k, f in enumerate(counters)},
        )
        monkeypatch.setattr(session, "statistics", lambda one=one: one)
    total = brokers.statistics()
    assert {f.name: getattr(total, f.name) for f in counters} == {f.name: 30 + 2 * k for k, f in enumerate(counters)}
    assert not total.connected
    assert total.broker == {"$SYS/broker/clients/connected": 5.0}
    assert total.brokers == (_A, _B)


def test_status_text_lists_each_broker() -> None:
    """``ldp-collector status`` prints one line per broker after the store's status."""
    base = CollectorStatus(registry_hash="h", registries=(), store="s", use_cases={}, counters={}, instances={})
    text = format_status(ServiceStatus.of(base, instance="m", brokers=(_A, _B)))
    assert text.splitlines()[-2:] == [
        "broker mqtt-a:8883: disconnected since 2025-11-26T22:45:30Z; 5 received, 4 acknowledged, 3 receipts, "
        "2 connections",
        "broker mqtt-b:8883: connected; 7 received, 7 acknowledged, 0 receipts, 1 connection",
    ]
    assert format_status(base) == format_status(ServiceStatus.of(base, instance="m"))


# -- two real brokers ----------------------------------------------------------------------


def _write_config(directory: Path, registry: Path, brokers: list[Broker], http_port: int) -> Path:
    addresses = ", ".join(f'"{b.host}:{b.port}"' for b in brokers)
    path = directory / "collector.toml"
    path.write_text(
        f"""registry = "{registry}"
instance = "member-0"

[mqtt]
addresses = [{addresses}]
client_id = "ldp-collector-brokers"
shared_group = "collectors"
reconnect_min_s = 0.05
reconnect_max_s = 0.5

[ingest]
commit_interval_s = 0.05

[store]
path = "{directory / "store.sqlite3"}"

[http]
port = {http_port}
""",
        encoding="utf-8",
    )
    return path


@contextlib.asynccontextmanager
async def _running(config: CollectorConfig) -> AsyncIterator[Service]:
    """The collector service in this event loop, subscribed on every broker, until the block ends."""
    stop = asyncio.Event()
    ready: asyncio.Future[Service] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_service(config, stop=stop, on_ready=ready.set_result))
    try:
        waiting: set[asyncio.Future[object]] = {task, ready}  # type: ignore[arg-type]
        done, _ = await asyncio.wait(waiting, timeout=GUARD_S, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        assert ready in done, "the collector did not subscribe on every broker"
        yield ready.result()
    finally:
        stop.set()
        await asyncio.wait_for(task, GUARD_S)


async def _until(what: str, condition: Any) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.02)


def _healthz(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
            body: dict[str, Any] = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read())
    return body


def _status_json(config_path: Path) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert collector_main(["--config", str(config_path), "status", "--json"]) == 0
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


def _items(registry: Registry, n: int, seed: int) -> list[tuple[str, bytes, bytes]]:
    period = current_period(registry, "flag")
    return [
        ("ldp/v1/reports/flag", p, decode_report(p, registry).report_id)
        for p in bit_reports(registry, "flag", n, period=period, seed=seed)
    ]


def _stored(path: Path, registry: Registry) -> tuple[int, int]:
    """(reports folded, report ids remembered) in the store."""
    store = CheckpointStore(path, registry, readonly=True)
    try:
        return sum(k.reports for k in store.totals()), store.seen_count()
    finally:
        store.close()


@run_async
async def test_one_report_through_both_brokers_is_counted_once_and_answered_on_each(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """The same report via broker A and broker B: folded once, acknowledged on each, "counted" on each."""
    with running_broker(tmp_path / "a") as a, running_broker(tmp_path / "b") as b:
        http_port = free_port()
        config_path = _write_config(tmp_path, registry_path, [a, b], http_port)
        config = load_config(config_path)
        (item,) = _items(registry, 1, seed=11)
        async with _running(config) as service:
            devices = [ReceiptDevice(a, "device-a"), ReceiptDevice(b, "device-b")]
            try:
                for device in devices:
                    await asyncio.to_thread(device.wait_subscribed)
                await asyncio.to_thread(devices[0].deliver, [item])
                await asyncio.to_thread(devices[1].deliver, [item])
                stats = service.transport.statistics()
                await _until(
                    "both acknowledged", lambda: [s.acked for s in service.transport.broker_statistics()] == [1, 1]
                )
            finally:
                for device in devices:
                    device.close()
            stats = service.transport.statistics()
            assert [(s.received, s.acked, s.receipts_sent) for s in stats.brokers] == [(1, 1, 1), (1, 1, 1)]
            assert service.metrics.reports == 1
            assert service.metrics.duplicates == 1
            # Each device heard back on its own broker, and what it heard is "counted".
            assert devices[0].outcomes == {item[2]: [(True, "")]}
            assert devices[1].outcomes == {item[2]: [(True, "")]}
        assert _stored(tmp_path / "store.sqlite3", registry) == (1, 1)


@run_async
async def test_kill_9_of_one_broker_mid_stream_loses_and_duplicates_nothing(
    tmp_path: Path, registry: Registry, registry_path: Path
) -> None:
    """Devices on two brokers; broker A is killed with -9 mid-stream and restarted: every report
    counted exactly once, every device told "counted", the member back on A; /healthz says
    "degraded" while A is down; ``status --json`` shows both brokers."""
    with running_broker(tmp_path / "a") as a, running_broker(tmp_path / "b") as b:
        http_port = free_port()
        config_path = _write_config(tmp_path, registry_path, [a, b], http_port)
        config = load_config(config_path)
        items_a = _items(registry, REPORTS // 2, seed=21)
        items_b = _items(registry, REPORTS - REPORTS // 2, seed=22)
        async with _running(config) as service:
            device_a, device_b = ReceiptDevice(a, "device-a"), ReceiptDevice(b, "device-b")
            try:
                await asyncio.to_thread(device_a.wait_subscribed)
                await asyncio.to_thread(device_b.wait_subscribed)
                sending = [
                    asyncio.create_task(asyncio.to_thread(device_a.deliver, items_a)),
                    asyncio.create_task(asyncio.to_thread(device_b.deliver, items_b)),
                ]
                # Mid-stream: part of A's reports counted (a count, not a time).
                first = REPORTS // 8
                broker_a = service.transport.sessions[0]
                await _until("part of A's stream counted", lambda: broker_a.broker_statistics().acked >= first)
                kill9(a)
                await _until("A seen down", lambda: not broker_a.broker_statistics().connected)
                health = await asyncio.to_thread(_healthz, http_port)
                assert health["status"] == "degraded"
                assert [x["connected"] for x in health["brokers"]] == [False, True]
                a.start()
                resent = sum(await asyncio.gather(*sending))
                await _until("A reconnected", lambda: broker_a.broker_statistics().connected)
                await _until("everything committed", lambda: service.metrics.reports >= REPORTS)
                assert broker_a.broker_statistics().connects >= 2
                status = await asyncio.to_thread(_status_json, config_path)
            finally:
                device_a.close()
                device_b.close()
            assert service.metrics.reports == REPORTS
            assert device_a.counted() == {rid for _, _, rid in items_a}
            assert device_b.counted() == {rid for _, _, rid in items_b}
            # Refused never: a re-sent report is a duplicate and answered "counted".
            for device in (device_a, device_b):
                assert all(counted for got in device.outcomes.values() for counted, _ in got)
        assert _stored(tmp_path / "store.sqlite3", registry) == (REPORTS, REPORTS)
        assert [(x["address"], x["connected"]) for x in status["brokers"]] == [
            (f"{a.host}:{a.port}", True),
            (f"{b.host}:{b.port}", True),
        ]
        assert sum(x["received"] for x in status["brokers"]) >= REPORTS
        print(f"reports {REPORTS}, resent {resent}, broker A connections {status['brokers'][0]['connects']}")


def test_one_broker_config_keeps_its_single_session() -> None:
    """Without ``addresses`` the collector holds exactly the one session of ``host:port``, as before."""
    cfg = MqttConfig(host="broker.example", port=8883)
    (only,) = cfg.brokers
    assert (only.host, only.port) == ("broker.example", 8883)
