"""The MQTT subscriber codec and its packets, through their public API only: no socket, no event loop.

Hypothesis drives the codec with arbitrary bytes and with valid streams cut anywhere: any
bytes give deliveries and events or raise the one protocol error; where a stream is cut does
not change what it gives; Receive Maximum and the Maximum Packet Size hold.
"""

from __future__ import annotations

import ast
import itertools
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.mqtt.codec import (
    BrokerCounter,
    Connected,
    ConnectionRefused,
    CountersRefused,
    Disconnected,
    Event,
    Subscribed,
    SubscriberCodec,
    SubscriptionRefused,
)
from collector.mqtt.packets import (
    BROKER_COUNTERS,
    CORRELATION_DATA,
    RESPONSE_TOPIC,
    MqttProtocolError,
    decode_varint,
    encode_varint,
    parse_properties,
    publish_packet,
    split_packets,
)
from collector.transport import NO_ACK, Delivery

MQTT_PACKAGE = Path(__file__).resolve().parents[2] / "collector" / "mqtt"

PREFIX = b"ldp/v1/reports/"
CONNACK = b"\x20\x03\x00\x00\x00"
SUBACK = b"\x90\x04\x00\x01\x00\x01"
PINGRESP = b"\xd0\x00"

Outcome = tuple[list[Event], list[Delivery], tuple[int, str] | None]


def _codec(*, receive_maximum: int = 20000, max_packet_bytes: int = 1 << 20) -> SubscriberCodec:
    """A codec that has sent CONNECT and awaits CONNACK."""
    codec = SubscriberCodec(receive_maximum=receive_maximum, max_packet_bytes=max_packet_bytes, topic_prefix=PREFIX)
    codec.connect(client_id="collector", keepalive=30, session_expiry=3600)
    return codec


def _events(codec: SubscriberCodec) -> list[Event]:
    """Every event the codec's buffered bytes give."""
    out: list[Event] = []
    while (event := codec.next_event()) is not None:
        out.append(event)
    return out


def _feed(codec: SubscriberCodec, chunks: Iterable[bytes]) -> Outcome:
    """Feed ``chunks`` one read at a time: the events, the deliveries, and the protocol error (reason, text) if any."""
    events: list[Event] = []
    error = None
    for chunk in chunks:
        codec.receive_data(chunk)
        try:
            while (event := codec.next_event()) is not None:
                events.append(event)
        except MqttProtocolError as exc:
            error = (exc.reason, str(exc))
            break
    return events, codec.take(1 << 30), error


def _publish(topic: bytes, payload: bytes, *, qos: int, packet_id: int = 1, properties: bytes = b"") -> bytes:
    """A PUBLISH with an optional property block (a receipt request)."""
    body = struct.pack(">H", len(topic)) + topic + (struct.pack(">H", packet_id) if qos else b"")
    body += encode_varint(len(properties)) + properties + payload
    return bytes([0x30 | qos << 1]) + encode_varint(len(body)) + body


def _receipt_request(topic: bytes, correlation: bytes) -> bytes:
    """Response Topic and Correlation Data properties (MQTT 5 §3.3.2.3.5-6)."""
    return b"\x08" + struct.pack(">H", len(topic)) + topic + b"\x09" + struct.pack(">H", len(correlation)) + correlation


_identities = st.sampled_from([b"", b"device-7/", b"fleet-sim/42/"])
_reports = st.builds(
    lambda identity, payload, qos, pid, receipt: _publish(
        PREFIX + identity + b"usage",
        payload,
        qos=qos,
        packet_id=pid,
        properties=_receipt_request(b"ldp/v1/receipts/c", receipt) if receipt else b"",
    ),
    _identities,
    st.binary(max_size=60),
    st.integers(0, 1),
    st.integers(1, 65535),
    st.one_of(st.none(), st.binary(min_size=1, max_size=16)),
)
_counters = st.builds(
    lambda topic, value: _publish(topic.encode(), value, qos=0),
    st.sampled_from(BROKER_COUNTERS),
    st.one_of(st.integers(0, 10**9).map(lambda v: str(v).encode()), st.binary(max_size=8)),
)
_counters_subacks = st.sampled_from([b"\x90\x07\x00\x02\x00\x00\x00\x00\x00", b"\x90\x07\x00\x02\x00\x00\x80\x00\x87"])
_packets = st.one_of(_reports, _reports, _reports, _counters, _counters_subacks, st.just(SUBACK), st.just(PINGRESP))
_valid_streams = st.lists(_packets, max_size=30).map(lambda packets: CONNACK + b"".join(packets))


def _cut(data: bytes, points: Sequence[int]) -> list[bytes]:
    """``data`` cut at ``points`` (taken modulo its length)."""
    bounds = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


# -- the properties -------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.booleans(), st.lists(st.one_of(_packets, st.binary(max_size=12)), max_size=12))
def test_the_parser_is_total(after_connack: bool, parts: list[bytes]) -> None:
    """Any bytes, before or after CONNACK, give deliveries and events or raise MqttProtocolError, nothing else."""
    data = (CONNACK if after_connack else b"") + b"".join(parts)
    _, deliveries, error = _feed(_codec(receive_maximum=5, max_packet_bytes=200), [data])
    assert error is None or error[0] in (0x81, 0x82, 0x95)
    for delivery in deliveries:
        assert isinstance(delivery.payload, bytes)
        assert delivery.token == NO_ACK or delivery.token & 0xFFFF


@settings(max_examples=300, deadline=None)
@given(_valid_streams, st.lists(st.integers(min_value=0), max_size=10))
def test_split_points_of_a_valid_stream_do_not_change_the_events(stream: bytes, points: list[int]) -> None:
    """A valid stream cut into reads anywhere gives the same events and deliveries as in one read."""
    whole = _feed(_codec(), [stream])
    assert whole[2] is None
    assert isinstance(whole[0][0], Connected)
    assert _feed(_codec(), _cut(stream, points)) == whole


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(_packets, st.binary(max_size=12)), max_size=12), st.lists(st.integers(min_value=0), max_size=8)
)
def test_split_points_do_not_change_what_any_bytes_give(parts: list[bytes], points: list[int]) -> None:
    """Arbitrary bytes cut anywhere give the same events, deliveries and protocol error as in one read."""
    data = CONNACK + b"".join(parts)
    whole = _feed(_codec(receive_maximum=5, max_packet_bytes=200), [data])
    assert _feed(_codec(receive_maximum=5, max_packet_bytes=200), _cut(data, points)) == whole


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(_packets, st.binary(max_size=40)), max_size=20), st.lists(st.integers(min_value=0), max_size=8)
)
def test_memory_stays_within_the_announced_limits(parts: list[bytes], points: list[int]) -> None:
    """A partial packet stays under the Maximum Packet Size; QoS 0 never fills the buffer past Receive Maximum."""
    codec = _codec(receive_maximum=3, max_packet_bytes=64)
    codec.receive_data(CONNACK)
    _events(codec)
    for chunk in _cut(b"".join(parts), points):
        codec.receive_data(chunk)
        try:
            _events(codec)
        except MqttProtocolError:
            break
        assert codec.pending_bytes < codec.max_packet_bytes
        assert codec.buffered <= codec.receive_maximum + codec.in_flight
    assert codec.buffered_bytes == sum(len(d.payload) for d in codec.take(1 << 30))


@given(st.integers(min_value=65, max_value=268435455), st.integers(min_value=0, max_value=3))
def test_a_packet_larger_than_the_maximum_is_refused_from_its_header(declared: int, kind: int) -> None:
    """A fixed header declaring more than max_packet_bytes is refused (0x95) before any of its body arrives."""
    codec = _codec(max_packet_bytes=64)
    codec.receive_data(CONNACK)
    _events(codec)
    codec.receive_data(bytes([(0x30, 0x32, 0x90, 0xD0)[kind]]) + encode_varint(declared))
    with pytest.raises(MqttProtocolError) as info:
        codec.next_event()
    assert info.value.reason == 0x95
    assert codec.pending_bytes == 0


@given(st.integers(min_value=1, max_value=8), st.lists(st.one_of(st.just(None), st.integers(0, 10)), max_size=40))
def test_receive_maximum_accounting_follows_the_acknowledgements(cap: int, steps: list[int | None]) -> None:
    """In flight = received QoS 1 - acknowledged; arrivals while Receive Maximum await acknowledgement are counted."""
    codec = _codec(receive_maximum=cap)
    codec.receive_data(CONNACK)
    _events(codec)
    unacked: list[int] = []
    over = 0
    pid = 0
    for step in steps:
        if step is None:  # one QoS 1 message arrives
            pid = pid % 65535 + 1
            over += len(unacked) >= cap
            codec.receive_data(_publish(PREFIX + b"x", b"r", qos=1, packet_id=pid))
            assert _events(codec) == []
            unacked += [d.token for d in codec.take(10)]
        else:  # ingest acknowledges some of them
            done, unacked = unacked[:step], unacked[step:]
            assert codec.acknowledge(done) == b"".join(b"\x40\x02" + struct.pack(">H", t & 0xFFFF) for t in done)
        assert codec.in_flight == len(unacked)
        assert codec.has_credit == (len(unacked) < cap)
        assert codec.statistics().over_receive_maximum == over


@given(st.integers(min_value=1, max_value=20), st.integers(min_value=0, max_value=40))
def test_qos0_beyond_receive_maximum_is_dropped_and_counted(cap: int, count: int) -> None:
    """QoS 0 messages that find Receive Maximum deliveries buffered are dropped and counted, never buffered."""
    codec = _codec(receive_maximum=cap)
    codec.receive_data(CONNACK + b"".join(_publish(PREFIX + b"x", bytes([i]), qos=0) for i in range(count)))
    _events(codec)
    assert codec.buffered == min(count, cap)
    assert codec.statistics().dropped == max(count - cap, 0)
    assert codec.statistics().received == count


# -- examples -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=20), st.integers(0, 3))
def test_valid_publishes_always_parse(payloads: list[bytes], cut: int) -> None:
    """Well-formed QoS 1 PUBLISHes parse to exactly their payloads, whatever the tail left for the next read."""
    stream = CONNACK + b"".join(_publish(b"t", p, qos=1, packet_id=i + 1) for i, p in enumerate(payloads))
    events, deliveries, error = _feed(_codec(), [stream[: len(stream) - cut], stream[len(stream) - cut :]])
    assert error is None
    assert events == [Connected(session_present=False, server_keep_alive=None)]
    assert [d.payload for d in deliveries] == payloads


def test_a_delivery_keeps_the_payload_the_sender_and_the_receipt_request_only() -> None:
    """The topic gives the sender's identity; a receipt request gives reply_to and correlation; the rest is gone."""
    stream = CONNACK + _publish(
        PREFIX + b"fleet-sim/7/usage",
        b"report",
        qos=1,
        packet_id=9,
        properties=b"\x02\x00\x00\x00\x10" + _receipt_request(b"ldp/v1/receipts/c-1", b"\x01\x02"),
    )
    events, deliveries, error = _feed(_codec(), [stream, _publish(b"other/topic", b"x", qos=0)])
    assert error is None
    assert len(events) == 1
    (first, second) = deliveries
    assert (first.payload, first.sender, first.reply_to, first.correlation) == (
        b"report",
        b"fleet-sim/7",
        b"ldp/v1/receipts/c-1",
        b"\x01\x02",
    )
    assert first.token & 0xFFFF == 9
    assert second == Delivery(b"x", NO_ACK, sender=b"")


def _near_receipt_requests() -> st.SearchStrategy[bytes]:
    """Property blocks (with their length) laid out as agents write a receipt request, and
    blocks a few bytes off it: lengths that miss by one, other or extra properties, cut short."""
    agent = st.builds(_receipt_request, st.binary(max_size=40), st.binary(max_size=20))
    other = st.one_of(
        st.just(b"\x02\x00\x00\x00\x10"), st.just(b"\x09\x00\x01\x07"), st.just(b"\x7f"), st.binary(max_size=4)
    )
    body = st.one_of(
        agent,
        st.builds(bytes.__add__, agent, other),
        st.builds(bytes.__add__, other, agent),
        st.builds(lambda block, cut: block[: cut % (len(block) + 1)], agent, st.integers(min_value=0)),
    )
    return st.builds(
        lambda block, delta: encode_varint(max(len(block) + delta, 0)) + block, body, st.sampled_from([0, 0, 0, -1, 1])
    )


@settings(max_examples=500, deadline=None)
@given(_near_receipt_requests(), st.binary(max_size=8))
def test_a_receipt_request_reads_as_the_general_property_parser_reads_it(block: bytes, payload: bytes) -> None:
    """The hand-read agent layout gives what parse_properties gives: the same topic, correlation
    and payload, or a protocol error for the same blocks."""
    topic = PREFIX + b"fleet-sim/7/usage"
    body = struct.pack(">H", len(topic)) + topic + struct.pack(">H", 5) + block + payload
    stream = CONNACK + b"\x32" + encode_varint(len(body)) + body
    try:
        props, start = parse_properties(body, 2 + len(topic) + 2, len(body))
    except MqttProtocolError:
        expected = None
    else:
        request = (props.get(RESPONSE_TOPIC), props.get(CORRELATION_DATA))
        if not all(isinstance(v, bytes) for v in request):
            request = (None, None)
        expected = (*request, body[start:])
    _, deliveries, error = _feed(_codec(), [stream])
    if expected is None:
        assert error is not None
        assert deliveries == []
    else:
        assert error is None
        (delivery,) = deliveries
        assert (delivery.reply_to, delivery.correlation, delivery.payload) == expected


def test_events_come_in_order_and_a_disconnect_ends_the_connection() -> None:
    """CONNACK, SUBACKs, broker counters, DISCONNECT: events in stream order; bytes after DISCONNECT are ignored."""
    stream = (
        b"\x20\x06\x01\x00\x03\x13\x00\x05"  # session present, Server Keep Alive 5 s
        + SUBACK
        + b"\x90\x07\x00\x02\x00\x00\x80\x00\x87"
        + _publish(b"$SYS/broker/clients/connected", b"12", qos=0)
        + _publish(b"$SYS/broker/clients/connected", b"twelve", qos=0)
        + PINGRESP
        + b"\xe0\x01\x8b"
        + b"\x30\x00"
    )
    events, deliveries, error = _feed(_codec(), [stream])
    assert error is None
    assert deliveries == []
    assert events == [
        Connected(session_present=True, server_keep_alive=5),
        Subscribed(),
        CountersRefused(b"\x00\x80\x00\x87"),
        BrokerCounter("$SYS/broker/clients/connected", 12.0),
        Disconnected(0x8B),
    ]
    assert not _connected_after(stream)


def _connected_after(stream: bytes) -> bool:
    """Whether a codec fed ``stream`` still counts itself connected."""
    codec = _codec()
    codec.receive_data(stream)
    _events(codec)
    return codec.connected


def test_connack_refusals_say_whether_retrying_can_help() -> None:
    """Bad credentials are a permanent refusal; 'server busy' may pass; a first packet not CONNACK is an error."""
    assert _feed(_codec(), [b"\x20\x03\x00\x86\x00"])[0] == [ConnectionRefused(0x86, "bad user name or password")]
    assert _feed(_codec(), [b"\x20\x03\x00\x89\x00"])[0] == [ConnectionRefused(0x89, None)]
    assert _feed(_codec(), [b"\x20\x03\x01\x00\x00"])[0] == [Connected(session_present=True, server_keep_alive=None)]
    assert _feed(_codec(), [SUBACK])[2] == (0x82, "expected CONNACK, got packet type 9")
    assert _feed(_codec(), [b"\x20\x03\x00\x00\xff"])[2] is not None  # an unparsable CONNACK property


@pytest.mark.parametrize(
    ("code", "event"), [(1, Subscribed()), (0, SubscriptionRefused(0)), (0x87, SubscriptionRefused(0x87))]
)
def test_the_reports_subscription_is_granted_only_at_qos_1(code: int, event: Event) -> None:
    """A SUBACK at QoS 1 subscribes; QoS 0 or a refusal ends the connection (ack after commit needs QoS 1)."""
    codec = _codec()
    codec.receive_data(CONNACK + b"\x90\x04\x00\x01\x00" + bytes([code]) + _publish(PREFIX + b"x", b"r", qos=0))
    assert _events(codec)[1:] == [event]
    assert codec.connected == (code == 1)
    assert codec.buffered == (code == 1)


def test_tokens_of_an_earlier_connection_are_stale() -> None:
    """After a reconnect the old tokens are counted stale and not acknowledged; the new ones are."""
    codec = _codec()
    codec.receive_data(CONNACK + _publish(PREFIX + b"x", b"old", qos=1, packet_id=5))
    _events(codec)
    old = [d.token for d in codec.take(10)]
    codec.connection_lost()
    codec.connect(client_id="collector", keepalive=30, session_expiry=3600)
    codec.receive_data(CONNACK + _publish(PREFIX + b"x", b"old", qos=1, packet_id=5))
    _events(codec)
    new = [d.token for d in codec.take(10)]
    assert old != new
    assert codec.acknowledge(old) == b""
    assert codec.acknowledge(new) == b"\x40\x02\x00\x05"
    codec.drop_acks([*new, NO_ACK])
    stats = codec.statistics()
    assert (stats.acked, stats.stale_acks) == (1, 2)


def test_bytes_before_connect_or_after_a_protocol_error_are_ignored() -> None:
    """A codec that is not connected takes no bytes: nothing is parsed, nothing is raised."""
    codec = SubscriberCodec(receive_maximum=10, max_packet_bytes=1024)
    codec.receive_data(b"\x30\x00")
    assert codec.next_event() is None
    codec.connect(client_id="c", keepalive=30, session_expiry=60)
    codec.receive_data(CONNACK + b"\x30\x00")
    assert _feed(codec, [b""])[2] == (0x81, "PUBLISH shorter than its topic length")
    codec.receive_data(b"\x30\x00")
    assert codec.next_event() is None
    assert codec.pending_bytes == 0


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


@pytest.mark.parametrize("module", ["codec.py", "packets.py"])
def test_the_protocol_core_does_no_io(module: str) -> None:
    """The codec and its packets import no event loop, socket, TLS or clock: bytes in, values out."""
    tree = ast.parse((MQTT_PACKAGE / module).read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not imported & {"asyncio", "socket", "ssl", "selectors", "time", "logging"}
