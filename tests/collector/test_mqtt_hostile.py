"""The collector's MQTT client against a broker that sends what it must not.

Each malformed or limit-breaking packet ends the connection with a logged protocol error and
a reconnect; nothing escapes :meth:`MqttTransport.run`, memory stays bounded (a packet
declared larger than our Maximum Packet Size is refused from its header), and a real
``ldp-collector run`` fed ``30 00`` keeps running. A refusal that retrying cannot fix ends
:meth:`MqttTransport.run` with a ``TransportError``. The MQTT core itself is fuzzed in
``tests/protocol/test_mqtt_session.py``.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from pathlib import Path

import pytest

from collector.config import MqttConfig
from collector.errors import TransportError
from collector.mqtt import MqttTransport
from protocol.mqtt.packets import encode_varint
from runtime.backoff import Backoff
from tests.collector.fake_broker import publish, running_fake_broker
from tests.collector.processes import CollectorProcess, write_config
from tests.collector.support import run_async

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "deploy" / "usecases.example.toml"

_HUGE = (256 << 20) - 1  # the largest MQTT length, 256 MiB

MALFORMED = {
    "publish of length 0": b"\x30\x00",
    "qos 1 publish of length 2": b"\x32\x02\x00\x01",
    "topic length past the packet": b"\x30\x03\x00\x10\x61",
    "qos 1 publish ending inside its packet id": b"\x32\x04\x00\x01\x61\x00",
    "packet id 0 at qos 1": b"\x32\x06\x00\x01\x61\x00\x00\x00",
    "publish without a topic": b"\x30\x03\x00\x00\x00",
    "qos 2 publish": b"\x34\x06\x00\x01\x61\x00\x01\x00",
    "qos 3 publish": b"\x36\x06\x00\x01\x61\x00\x01\x00",
    "properties past the packet": b"\x30\x05\x00\x01\x61\x85\x80",
    "variable byte integer of five bytes": b"\x30\xff\xff\xff\xff\x01",
    "unexpected packet type (AUTH)": b"\xf0\x00",
    "unexpected packet type (CONNACK again)": b"\x20\x03\x00\x00\x00",
    "short SUBACK": b"\x90\x01\x00",
    "declared 256 MiB": b"\x30" + encode_varint(_HUGE) + b"\x00\x01\x61\x00" + bytes(4 << 20),
}


async def _run_against(script: list[bytes], *, connack_properties: bytes = b"") -> tuple[MqttTransport, int, list[int]]:
    """Connect a transport to a fake broker with ``script``; return once it has reconnected."""
    with running_fake_broker(script, connack_properties=connack_properties) as broker:
        config = MqttConfig(
            host="127.0.0.1", port=broker.port, client_id="hostile", reconnect_min_s=0.01, reconnect_max_s=0.05
        )
        transport = MqttTransport(config)
        runner = asyncio.create_task(transport.run())
        try:
            await asyncio.to_thread(broker.wait_for, lambda b: b.connections >= 2)
            await asyncio.wait_for(transport.wait_subscribed(), 30)
            assert not runner.done(), "run() ended"
        finally:
            await transport.close()
            await asyncio.wait_for(runner, 10)
        return transport, broker.connections, list(broker.sent)


@pytest.mark.parametrize("case", sorted(MALFORMED))
@run_async
async def test_each_malformed_packet_is_a_logged_protocol_error_and_a_reconnect(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The connection is dropped with a protocol error naming the fault, and a new one is made."""
    caplog.set_level(logging.WARNING, logger="collector.mqtt")
    transport, connections, _ = await _run_against([MALFORMED[case]])
    stats = transport.statistics()
    assert connections >= 2
    assert stats.protocol_errors >= 1
    assert any("protocol error from the broker" in r.getMessage() for r in caplog.records)
    assert stats.buffered == 0


@run_async
async def test_a_packet_declared_larger_than_our_maximum_is_refused_from_its_header() -> None:
    """A PUBLISH declaring 256 MiB is refused before its body is buffered: the broker could send only a little."""
    transport, _, sent = await _run_against([MALFORMED["declared 256 MiB"]])
    assert transport.statistics().protocol_errors == 1
    # The socket buffers on both sides absorb a few MiB at most before the close is seen.
    assert sent[0] < 4 << 20 + 64


@run_async
async def test_messages_before_a_malformed_packet_are_delivered_and_later_ones_flow() -> None:
    """Valid PUBLISHes ahead of the bad packet reach ingest; after the reconnect delivery goes on."""
    good = publish(b"ldp/v1/reports/x", b"first", packet_id=7)
    later = publish(b"ldp/v1/reports/x", b"second", packet_id=7)
    with running_fake_broker([good + b"\x30\x00", later]) as broker:
        config = MqttConfig(host="127.0.0.1", port=broker.port, client_id="h", reconnect_min_s=0.01)
        transport = MqttTransport(config)
        runner = asyncio.create_task(transport.run())
        try:
            first = await asyncio.wait_for(transport.receive(10), 30)
            got = [d.payload for d in first]
            while len(got) < 2:
                got += [d.payload for d in await asyncio.wait_for(transport.receive(10), 30)]
            assert got == [b"first", b"second"]
            assert transport.statistics().protocol_errors == 1
        finally:
            await transport.close()
            await asyncio.wait_for(runner, 10)


@run_async
async def test_server_keep_alive_replaces_ours() -> None:
    """With Server Keep Alive 1 s in CONNACK the client pings within that interval, although it asked for 600 s."""
    with running_fake_broker([], connack_properties=b"\x13" + struct.pack(">H", 1)) as broker:
        config = MqttConfig(host="127.0.0.1", port=broker.port, client_id="ka", keepalive_s=600)
        transport = MqttTransport(config)
        runner = asyncio.create_task(transport.run())
        try:
            await asyncio.to_thread(broker.wait_for, lambda b: b.pings >= 2)
            assert broker.connections == 1
        finally:
            await transport.close()
            await asyncio.wait_for(runner, 10)


@run_async
async def test_unknown_connack_property_is_a_protocol_error() -> None:
    """A CONNACK whose properties cannot be parsed drops the connection like any malformed packet."""
    with running_fake_broker([], connack_properties=b"\xff\x00") as broker:
        config = MqttConfig(host="127.0.0.1", port=broker.port, client_id="cp", reconnect_min_s=0.01)
        transport = MqttTransport(config)
        runner = asyncio.create_task(transport.run())
        try:
            await asyncio.to_thread(broker.wait_for, lambda b: b.connections >= 3)
            assert transport.statistics().protocol_errors >= 2
        finally:
            await transport.close()
            await asyncio.wait_for(runner, 10)


@run_async
async def test_backoff_starts_again_after_a_healthy_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each drop after a session that received a report waits at most the shortest delay; failures in a row
    double it (a session that only reached SUBACK does not count: tests/collector/test_busy_broker.py)."""
    bounds: list[float] = []

    def record(self: Backoff, attempt: int, fraction: float) -> float:
        bounds.append(self.ceiling(attempt))
        return 0.0

    monkeypatch.setattr(Backoff, "delay", record)
    # Every connection gets a report, then one malformed packet, after its subscription is granted.
    report = publish(b"ldp/v1/reports/dev/flag", b"\x90", qos=1)
    with running_fake_broker([report + b"\x30\x00"] * 6) as broker:
        config = MqttConfig(
            host="127.0.0.1", port=broker.port, client_id="b", reconnect_min_s=0.01, reconnect_max_s=30.0
        )
        transport = MqttTransport(config)
        runner = asyncio.create_task(transport.run())
        try:
            await asyncio.to_thread(broker.wait_for, lambda b: b.connections >= 7)
        finally:
            await transport.close()
            await asyncio.wait_for(runner, 10)
    assert len(bounds) >= 6
    assert bounds[:6] == [0.01] * 6


@pytest.mark.parametrize(
    ("code", "message"),
    [(0, "only at QoS 0; acknowledgement after commit needs QoS 1"), (0x87, r"refused the subscription .*0x87")],
)
@run_async
async def test_a_subscription_granted_below_qos_1_ends_the_transport(code: int, message: str) -> None:
    """QoS 0 would make acknowledgement after commit meaningless: run() stops with a TransportError instead."""
    with running_fake_broker([], suback_code=code) as broker:
        config = MqttConfig(host="127.0.0.1", port=broker.port, client_id="q0", reconnect_min_s=0.01)
        transport = MqttTransport(config)
        with pytest.raises(TransportError, match=message):
            await asyncio.wait_for(transport.run(), 30)
        assert broker.connections == 1


@run_async
async def test_refusals_that_retrying_cannot_fix_are_transport_errors() -> None:
    """Bad credentials end run(); 'server busy' is retried with a new connection."""
    with running_fake_broker([], connack_reason=0x86) as broker:
        transport = MqttTransport(MqttConfig(host="127.0.0.1", port=broker.port, client_id="bad"))
        with pytest.raises(TransportError, match=r"bad user name or password \(reason code 0x86\)"):
            await asyncio.wait_for(transport.run(), 30)
    with running_fake_broker([], connack_reason=0x89) as broker:
        config = MqttConfig(host="127.0.0.1", port=broker.port, client_id="busy", reconnect_min_s=0.01)
        transport = MqttTransport(config)
        runner = asyncio.create_task(transport.run())
        try:
            await asyncio.to_thread(broker.wait_for, lambda b: b.connections >= 3)
            assert not runner.done(), "run() ended"
        finally:
            await transport.close()
            await asyncio.wait_for(runner, 10)


def test_ldp_collector_run_fed_30_00_keeps_running(tmp_path: Path) -> None:
    """The real service, given ``30 00`` by its broker, logs a protocol error, reconnects and stays up."""
    with running_fake_broker([b"\x30\x00"]) as broker:
        config = write_config(tmp_path, registry=REGISTRY, host="127.0.0.1", port=broker.port)
        proc = CollectorProcess(config, log=tmp_path / "collector.log")
        proc.launch()
        try:
            broker.wait_for(lambda b: b.connections >= 2, timeout=60)
            assert proc.process is not None
            assert proc.process.poll() is None, (tmp_path / "collector.log").read_text()
        finally:
            proc.stop()
            proc.close()
    log = (tmp_path / "collector.log").read_text()
    assert "protocol error from the broker" in log
    assert "Traceback" not in log


@run_async
async def test_a_connection_lost_while_ingest_holds_every_credit_is_seen_and_replaced() -> None:
    """Receive Maximum 2, two reports that ingest has not taken yet (the read loop waits for
    credit and reads nothing), then the broker hangs up: the transport still sees the loss and
    connects again, instead of pinging a dead socket for ever."""
    reports = publish(b"ldp/v1/reports/d1/x", b"a", packet_id=1) + publish(b"ldp/v1/reports/d1/x", b"b", packet_id=2)
    with running_fake_broker([reports], hang_up_after_script=True) as broker:
        config = MqttConfig(
            host="127.0.0.1",
            port=broker.port,
            client_id="held",
            receive_maximum=2,
            keepalive_s=1,
            reconnect_min_s=0.01,
            reconnect_max_s=0.05,
        )
        transport = MqttTransport(config)
        runner = asyncio.create_task(transport.run())
        try:
            await asyncio.to_thread(broker.wait_for, lambda b: b.connections >= 2)
            assert not runner.done(), "run() ended"
        finally:
            await transport.close()
            await asyncio.wait_for(runner, 10)


@run_async
async def test_close_while_a_connection_is_being_opened_ends_run() -> None:
    """close() that lands while a connection is still being opened (there is no writer yet
    for it to close) must still end run(): the connection that then opens is closed, not
    kept alive by pings for ever."""
    with running_fake_broker([b""]) as broker:
        config = MqttConfig(host="127.0.0.1", port=broker.port, client_id="late", keepalive_s=1)
        opening = asyncio.Event()
        release = asyncio.Event()

        async def slow_open(cfg: MqttConfig) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            opening.set()
            await release.wait()
            return await asyncio.open_connection(cfg.host, cfg.port)

        transport = MqttTransport(config, open_connection=slow_open)
        runner = asyncio.create_task(transport.run())
        try:
            await asyncio.wait_for(opening.wait(), 10)
            await transport.close()
            release.set()
            await asyncio.wait_for(runner, 10)
            # The broker's side of that connection closes too before the broker stops (else
            # its socket is left to the garbage collector and warns in a later test).
            await asyncio.to_thread(broker.wait_for, lambda b: b.closed_by_client >= 1)
        finally:
            runner.cancel()
