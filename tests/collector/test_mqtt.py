"""The MQTT 5 transport against a real Mosquitto: flow control, stale acknowledgements, QoS 0; and the read pause.

The MQTT core's own properties are in ``tests/protocol/test_mqtt_session.py``; refusals and
malformed packets from a scripted broker in ``test_mqtt_hostile.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from collector.config import MqttConfig
from collector.mqtt import MqttTransport
from collector.mqtt.transport import open_broker_connection
from collector.transport import Delivery, route_of
from protocol.mqtt.events import packet_id_of
from protocol.mqtt.packets import CONNECT, SUBSCRIBE
from tests.collector.support import run_async
from tests.support.broker import Broker
from tests.support.mqtt_publisher import MqttPublisher


async def _collect(transport: MqttTransport, count: int, *, ack: bool, timeout: float = 120) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"received {len(got)} of {count}")
        try:
            batch = await asyncio.wait_for(transport.receive(count - len(got)), remaining)
        except TimeoutError:
            break
        got += batch
        if ack:
            transport.ack([d.token for d in batch])
    return got


@run_async
async def test_receive_maximum_bounds_unacknowledged_messages(mosquitto: Broker) -> None:
    """The broker sends at most Receive Maximum unacknowledged messages; acks release more."""
    config = MqttConfig(host=mosquitto.host, port=mosquitto.port, client_id="flow", receive_maximum=50)
    transport = MqttTransport(config)
    runner = asyncio.create_task(transport.run())
    try:
        await asyncio.wait_for(transport.wait_subscribed(), 60)
        await MqttPublisher(mosquitto.host, mosquitto.port, client_id="pub").publish_all(
            ("ldp/v1/reports/x", bytes([i % 256]) * 10) for i in range(400)
        )
        # Everything is on the broker now; without acknowledgements only 50 may come.
        first = await _collect(transport, 50, ack=False)
        assert len(first) == 50
        assert transport.statistics().unacked == 50
        transport.ack([d.token for d in first])
        rest = await _collect(transport, 350, ack=True)
        assert len(rest) == 350
        assert transport.statistics().acked == 400
    finally:
        await transport.close()
        await asyncio.wait_for(runner, 60)


@run_async
async def test_acks_of_a_dropped_connection_are_discarded_and_messages_redelivered(mosquitto: Broker) -> None:
    """After a reconnect, old tokens are not acknowledged; the broker redelivers those messages."""
    config = MqttConfig(host=mosquitto.host, port=mosquitto.port, client_id="stale", reconnect_max_s=0.2)
    writers: list[asyncio.StreamWriter] = []

    async def open_connection(config: MqttConfig) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await open_broker_connection(config)
        writers.append(writer)
        return reader, writer

    transport = MqttTransport(config, open_connection=open_connection)
    runner = asyncio.create_task(transport.run())
    try:
        await asyncio.wait_for(transport.wait_subscribed(), 60)
        payloads = [f"m{i}".encode() for i in range(20)]
        await MqttPublisher(mosquitto.host, mosquitto.port, client_id="pub").publish_all(
            ("ldp/v1/reports/x", p) for p in payloads
        )
        first = await _collect(transport, 20, ack=False)
        writers[-1].transport.abort()  # the connection drops before anything is acknowledged
        deadline = time.monotonic() + 120  # a hang guard only
        while transport.statistics().connects < 2 or not transport.statistics().connected:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        transport.ack([d.token for d in first])
        assert transport.statistics().stale_acks == 20
        again = await _collect(transport, 20, ack=True)
        assert sorted(d.payload for d in again) == sorted(payloads)
        assert transport.session_present
    finally:
        await transport.close()
        await asyncio.wait_for(runner, 60)


@run_async
async def test_qos0_messages_need_no_ack_and_topics_are_dropped(mosquitto: Broker) -> None:
    """A QoS 0 publish comes with a token that acknowledges nothing; a delivery keeps payload and sender only."""
    config = MqttConfig(host=mosquitto.host, port=mosquitto.port, client_id="q0")
    transport = MqttTransport(config)
    runner = asyncio.create_task(transport.run())
    try:
        await asyncio.wait_for(transport.wait_subscribed(), 60)
        await MqttPublisher(mosquitto.host, mosquitto.port, client_id="pub").publish_all(
            [
                ("ldp/v1/reports/device-42/x", b"payload"),
                ("ldp/v1/reports/fleet-sim/7/x", b"sim"),
                ("ldp/v1/reports/x", b"none"),
            ],
            qos=0,
        )
        deliveries = await _collect(transport, 3, ack=False)
        assert [(d.payload, d.sender) for d in deliveries] == [
            (b"payload", b"device-42"),
            (b"sim", b"fleet-sim/7"),
            (b"none", b""),
        ]
        assert [(packet_id_of(d.token), route_of(d.token)) for d in deliveries] == [(0, 0)] * 3
        # The rest of the topic, client id and flags are gone; a receipt request (reply_to,
        # correlation) stays only until the receipt is sent, the sender only until the commit;
        # the token names the broker that delivered it, only to pick the receipt's way back.
        assert set(Delivery._fields) == {"payload", "token", "reply_to", "correlation", "sender"}
        assert all((d.reply_to, d.correlation) == (None, None) for d in deliveries)
    finally:
        await transport.close()
        await asyncio.wait_for(runner, 60)


class _ClosingTransport(asyncio.Transport):
    """A connection that closes while the reader pauses; like a closed TLS transport, it
    refuses to be paused or resumed once closed.

    It answers CONNECT with CONNACK and the SUBSCRIBE with a short read (the first byte of a
    PUBLISH whose rest never comes) followed by the end of the stream.
    """

    def __init__(self, reader: asyncio.StreamReader, protocol: asyncio.StreamReaderProtocol) -> None:
        super().__init__()
        self.reader = reader
        self.protocol = protocol
        self.closed = False
        self.ended = False
        self.calls: list[str] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.ended:
            return
        if data[0] >> 4 == CONNECT:
            self.reader.feed_data(b"\x20\x03\x00\x00\x00")
        elif data[0] >> 4 == SUBSCRIBE:
            self.reader.feed_data(b"\x30")
            self.reader.feed_eof()
            self.ended = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        assert not self.closed, "paused after close"
        self.calls.append("pause")
        self.closed = True  # the connection goes away during the pause

    def resume_reading(self) -> None:
        raise AssertionError("resumed after close")

    def close(self) -> None:
        if not self.ended:
            self.reader.feed_eof()
            self.ended = True
        self.closed = True
        self.protocol.connection_lost(None)

    def abort(self) -> None:
        self.close()


@run_async
async def test_a_connection_closed_during_the_read_pause_ends_the_session_cleanly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pause after a short read neither resumes a closed transport nor hides the end of the stream."""
    caplog.set_level(logging.WARNING, logger="collector.mqtt")
    loop = asyncio.get_running_loop()
    fakes: list[_ClosingTransport] = []
    reconnecting = asyncio.Event()

    async def open_connection(config: MqttConfig) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if fakes:
            reconnecting.set()
            raise OSError("no second connection in this test")
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        fake = _ClosingTransport(reader, protocol)
        protocol.connection_made(fake)
        fakes.append(fake)
        return reader, asyncio.StreamWriter(fake, protocol, reader, loop)

    config = MqttConfig(reconnect_min_s=0.001, reconnect_max_s=0.001)
    transport = MqttTransport(config, read_pause_s=0.001, open_connection=open_connection)
    runner = asyncio.create_task(transport.run())
    try:
        await asyncio.wait_for(reconnecting.wait(), 30)
    finally:
        await transport.close()
        await asyncio.wait_for(runner, 30)  # an AssertionError of the fake would surface here
    assert fakes[0].calls == ["pause"]
    assert any(r.getMessage().endswith("lost: closed by the broker") for r in caplog.records)
