"""The MQTT 5 adapter: packet codec properties, flow control, stale acknowledgements, refusals."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.config import MqttConfig
from collector.errors import TransportError
from collector.mqtt import (
    MqttProtocolError,
    MqttTransport,
    _check_connack,
    _ConnectionLostError,
    decode_varint,
    encode_varint,
    publish_packet,
    split_packets,
)
from collector.transport import NO_ACK, Delivery
from tests.collector.support import run_async
from tests.support.broker import Broker
from tests.support.mqtt_publisher import MqttPublisher


@given(st.integers(min_value=0, max_value=268435455))
def test_varint_round_trips(value: int) -> None:
    """Every Variable Byte Integer decodes to the value it encodes, in 1 to 4 bytes."""
    data = encode_varint(value)
    assert 1 <= len(data) <= 4
    assert decode_varint(data + b"\x00", 0) == (value, len(data))
    assert decode_varint(data[:-1], 0) is None


def test_varint_longer_than_four_bytes_is_a_protocol_error() -> None:
    """A fifth continuation byte is refused rather than read on."""
    with pytest.raises(MqttProtocolError):
        decode_varint(b"\xff\xff\xff\xff\x01", 0)


@given(
    st.lists(st.tuples(st.binary(min_size=1, max_size=40), st.binary(max_size=300)), min_size=1, max_size=12),
    st.lists(st.integers(min_value=0, max_value=5000), max_size=8),
)
def test_split_packets_reassembles_any_fragmentation(payloads: list[tuple[bytes, bytes]], cuts: list[int]) -> None:
    """Packets cut at arbitrary byte positions come out whole and in order."""
    packets = [publish_packet(t, p, qos=1, packet_id=i + 1) for i, (t, p) in enumerate(payloads)]
    stream = b"".join(packets)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    got: list[tuple[int, bytes]] = []
    rest = b""
    start = 0
    for point in [*points, len(stream)]:
        found, rest = split_packets(rest + stream[start:point])
        got += found
        start = point
    assert rest == b""
    assert [bytes([f]) + encode_varint(len(b)) + b for f, b in got] == packets


def test_refusals_that_retrying_cannot_fix_are_transport_errors() -> None:
    """Bad credentials end the service; 'server busy' is retried."""
    with pytest.raises(TransportError, match="bad user name or password"):
        _check_connack(b"\x00\x86\x00", version=5)
    with pytest.raises(Exception, match="for now") as info:
        _check_connack(b"\x00\x89\x00", version=5)
    assert not isinstance(info.value, TransportError)
    assert _check_connack(b"\x01\x00\x00", version=5).session_present is True


def test_a_subscription_granted_below_qos_1_is_refused() -> None:
    """QoS 0 would make acknowledgement after commit meaningless: the service stops instead."""
    transport = MqttTransport(MqttConfig())
    with pytest.raises(TransportError, match="only at QoS 0"):
        transport._handle_suback(b"\x00\x01\x00\x00")
    with pytest.raises(TransportError, match="0x87"):
        transport._handle_suback(b"\x00\x01\x00\x87")


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
    transport = MqttTransport(config)
    runner = asyncio.create_task(transport.run())
    try:
        await asyncio.wait_for(transport.wait_subscribed(), 60)
        payloads = [f"m{i}".encode() for i in range(20)]
        await MqttPublisher(mosquitto.host, mosquitto.port, client_id="pub").publish_all(
            ("ldp/v1/reports/x", p) for p in payloads
        )
        first = await _collect(transport, 20, ack=False)
        writer = transport._writer
        assert writer is not None
        writer.transport.abort()  # the connection drops before anything is acknowledged
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
    """A QoS 0 publish arrives with the NO_ACK token; deliveries carry the payload and the sender's identity only."""
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
        assert deliveries == [
            Delivery(b"payload", NO_ACK, sender=b"device-42"),
            Delivery(b"sim", NO_ACK, sender=b"fleet-sim/7"),
            Delivery(b"none", NO_ACK, sender=b""),
        ]
        # The rest of the topic, client id and flags are gone; a receipt request (reply_to,
        # correlation) stays only until the receipt is sent, the sender only until the commit.
        assert set(Delivery.__slots__) == {"payload", "token", "reply_to", "correlation", "sender"}
        assert all((d.reply_to, d.correlation) == (None, None) for d in deliveries)
    finally:
        await transport.close()
        await asyncio.wait_for(runner, 60)


class _ClosingTransport(asyncio.ReadTransport):
    """A read transport closed while the reader pauses; like a closed TLS transport, it
    refuses to be paused or resumed once closed."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False
        self.calls: list[str] = []

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        assert not self.closed, "paused after close"
        self.calls.append("pause")
        self.closed = True  # the connection goes away during the pause

    def resume_reading(self) -> None:
        raise AssertionError("resumed after close")


@run_async
async def test_a_connection_closed_during_the_read_pause_ends_the_session_cleanly() -> None:
    """The pause after a short read neither resumes a closed transport nor hides the end of the stream."""
    transport = MqttTransport(MqttConfig(), read_pause_s=0.001)
    reader = asyncio.StreamReader()
    reader.feed_data(b"\x30")  # a short read: the first byte of a PUBLISH, the rest never comes
    reader.feed_eof()
    fake = _ClosingTransport()
    with pytest.raises(_ConnectionLostError, match="closed by the broker"):
        await transport._read_loop(reader, fake, b"")
    assert fake.calls == ["pause"]
