"""The MQTT core's reading, through its public API only: no socket, no event loop.

Hypothesis drives a :class:`~protocol.mqtt.session.Session` in each role with arbitrary bytes
and with valid streams cut anywhere: any bytes give deliveries, acknowledgements and events
or raise the one protocol error; where a stream is cut does not change what it gives; Receive
Maximum and the Maximum Packet Size hold. The table of states, step by step, is fuzzed in
``test_mqtt_roles.py``.
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

from protocol.mqtt.events import (
    Acknowledged,
    BrokerMessage,
    Connected,
    ConnectionRefused,
    Delivery,
    Disconnected,
    Event,
    Subscribed,
    packet_id_of,
)
from protocol.mqtt.packets import (
    CORRELATION_DATA,
    RESPONSE_TOPIC,
    MqttProtocolError,
    decode_varint,
    encode_varint,
    parse_properties,
    publish_packet,
    split_packets,
)
from protocol.mqtt.session import Session
from protocol.mqtt.states import Role

MQTT_PACKAGE = Path(__file__).resolve().parents[2] / "protocol" / "mqtt"

PREFIX = b"ldp/v1/reports/"
COUNTERS = ("$SYS/broker/clients/connected", "$SYS/broker/store/messages/count")
CONNACK = b"\x20\x03\x00\x00\x00"
SUBACK = b"\x90\x04\x00\x01\x00\x01"
COUNTERS_SUBACK = b"\x90\x05\x00\x02\x00\x00\x00"
PINGRESP = b"\xd0\x00"
PUBLISHED = range(11, 19)
"""The packet ids of a publisher's QoS 1 PUBLISHes (1 and 2 name its SUBSCRIBEs)."""

Outcome = tuple[list[Event], list[Delivery], list[Acknowledged], tuple[int, str] | None]


def _session(role: Role = Role.SUBSCRIBER, *, receive_maximum: int = 20000, max_packet_bytes: int = 1 << 20) -> Session:
    """A session that has sent CONNECT and awaits CONNACK."""
    session = Session(role, receive_maximum=receive_maximum, max_packet_bytes=max_packet_bytes, topic_prefix=PREFIX)
    session.connect(client_id="collector", clean_start=False, keepalive=30, session_expiry=3600)
    return session


def _react(session: Session, event: Event) -> None:
    """What a client does on CONNACK: subscribe (the reports at the role's QoS, and two counters), and,
    as a publisher, send QoS 1 PUBLISHes with packet ids 11 to 18, so that their PUBACKs are expected."""
    if not isinstance(event, Connected):
        return
    qos = 1 if session.our_role is Role.SUBSCRIBER else 0
    session.subscribe(1, [("ldp/v1/reports/#", qos)])
    session.subscribe(2, [(topic, 0) for topic in COUNTERS])
    if session.our_role is Role.PUBLISHER:
        for pid in PUBLISHED:
            session.publish(b"ldp/v1/reports/x", b"r", qos=1, packet_id=pid)


def _feed(session: Session, chunks: Iterable[bytes]) -> Outcome:
    """Feed ``chunks`` one read at a time: the events, the deliveries, the acknowledgements, and
    the protocol error (reason, text) if any."""
    events: list[Event] = []
    error = None
    for chunk in chunks:
        session.receive_data(chunk)
        try:
            while (event := session.next_event()) is not None:
                events.append(event)
                _react(session, event)
        except MqttProtocolError as exc:
            error = (exc.reason, str(exc))
            break
    return events, session.take_deliveries(), session.take_acknowledgements(), error


def _publish(topic: bytes, payload: bytes, *, qos: int, packet_id: int = 1, properties: bytes = b"") -> bytes:
    """A PUBLISH with an optional property block (a receipt request), written by hand."""
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
_qos0_reports = _reports.filter(lambda packet: packet[0] == 0x30)
_counters = st.builds(
    lambda topic, value: _publish(topic.encode(), value, qos=0),
    st.sampled_from(COUNTERS),
    st.one_of(st.integers(0, 10**9).map(lambda v: str(v).encode()), st.binary(max_size=8)),
)
_pubacks = st.builds(
    lambda pid, reason: b"\x40\x03" + struct.pack(">HB", pid, reason),
    st.sampled_from(PUBLISHED),
    st.sampled_from([0, 0x87]),
)
_packets = st.one_of(_reports, _reports, _reports, _counters, _pubacks, st.just(SUBACK), st.just(PINGRESP))


@st.composite
def _valid_streams(draw: st.DrawFn, role: Role) -> bytes:
    """CONNACK, then the role's traffic with each SUBACK once, anywhere, and each PUBACK once (a publisher's)."""
    traffic = [_reports, _reports, _counters, st.just(PINGRESP)] if role is Role.SUBSCRIBER else [_qos0_reports]
    packets = draw(st.lists(st.one_of(*traffic), max_size=30))
    answers = [SUBACK if role is Role.SUBSCRIBER else b"\x90\x04\x00\x01\x00\x00", COUNTERS_SUBACK]
    if role is Role.PUBLISHER:
        answers += [b"\x40\x02" + struct.pack(">H", pid) for pid in draw(st.permutations(PUBLISHED))]
    for answer in answers:
        packets.insert(draw(st.integers(0, len(packets))), answer)
    return CONNACK + b"".join(packets)


def _cut(data: bytes, points: Sequence[int]) -> list[bytes]:
    """``data`` cut at ``points`` (taken modulo its length)."""
    bounds = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


_roles = st.sampled_from(Role)

# -- the properties, in both roles ------------------------------------------------------------


@settings(max_examples=400)
@given(_roles, st.booleans(), st.lists(st.one_of(_packets, st.binary(max_size=12)), max_size=12))
def test_the_parser_is_total(role: Role, after_connack: bool, parts: list[bytes]) -> None:
    """Any bytes, before or after CONNACK, in either role, give outputs or raise MqttProtocolError, nothing else."""
    data = (CONNACK if after_connack else b"") + b"".join(parts)
    _, deliveries, acks, error = _feed(_session(role, receive_maximum=5, max_packet_bytes=200), [data])
    assert error is None or error[0] in (0x81, 0x82, 0x95)
    for delivery in deliveries:
        assert isinstance(delivery.payload, bytes)
        assert role is Role.SUBSCRIBER or not packet_id_of(delivery.token)
    assert not acks or role is Role.PUBLISHER


@settings(max_examples=300)
@given(st.data(), _roles, st.lists(st.integers(min_value=0), max_size=10))
def test_split_points_of_a_valid_stream_do_not_change_the_outputs(
    data: st.DataObject, role: Role, points: list[int]
) -> None:
    """A valid stream cut into reads anywhere gives the same events, deliveries and acknowledgements as in one read."""
    stream = data.draw(_valid_streams(role))
    whole = _feed(_session(role), [stream])
    assert whole[3] is None
    assert isinstance(whole[0][0], Connected)
    assert _feed(_session(role), _cut(stream, points)) == whole
    if role is Role.PUBLISHER:
        assert sorted(a.packet_id for a in whole[2]) == list(PUBLISHED)


@settings(max_examples=300)
@given(
    _roles,
    st.lists(st.one_of(_packets, st.binary(max_size=12)), max_size=12),
    st.lists(st.integers(min_value=0), max_size=8),
)
def test_split_points_do_not_change_what_any_bytes_give(role: Role, parts: list[bytes], points: list[int]) -> None:
    """Arbitrary bytes cut anywhere give the same outputs and protocol error as in one read, in either role."""
    data = CONNACK + b"".join(parts)
    whole = _feed(_session(role, receive_maximum=5, max_packet_bytes=200), [data])
    assert _feed(_session(role, receive_maximum=5, max_packet_bytes=200), _cut(data, points)) == whole


@settings(max_examples=300)
@given(
    _roles,
    st.lists(st.one_of(_packets, st.binary(max_size=40)), max_size=20),
    st.lists(st.integers(min_value=0), max_size=8),
)
def test_a_partial_packet_stays_under_the_maximum_packet_size(
    role: Role, parts: list[bytes], points: list[int]
) -> None:
    """Whatever arrives, the bytes kept between reads stay under the Maximum Packet Size we announced."""
    session = _session(role, receive_maximum=3, max_packet_bytes=64)
    _feed(session, [CONNACK])
    for chunk in _cut(b"".join(parts), points):
        session.receive_data(chunk)
        try:
            while (event := session.next_event()) is not None:
                _react(session, event)
        except MqttProtocolError:
            break
        assert session.pending_bytes < session.max_packet_bytes


@given(_roles, st.integers(min_value=65, max_value=268435455), st.integers(min_value=0, max_value=3))
def test_a_packet_larger_than_the_maximum_is_refused_from_its_header(role: Role, declared: int, kind: int) -> None:
    """A fixed header declaring more than max_packet_bytes is refused (0x95) before any of its body arrives."""
    session = _session(role, max_packet_bytes=64)
    _feed(session, [CONNACK])
    session.receive_data(bytes([(0x30, 0x40, 0x90, 0xD0)[kind]]) + encode_varint(declared))
    with pytest.raises(MqttProtocolError) as info:
        session.next_event()
    assert info.value.reason == 0x95
    assert session.pending_bytes == 0


@given(st.integers(min_value=1, max_value=8), st.lists(st.one_of(st.just(None), st.integers(0, 10)), max_size=40))
def test_receive_maximum_accounting_follows_the_acknowledgements(cap: int, steps: list[int | None]) -> None:
    """In flight = received QoS 1 - acknowledged; arrivals while Receive Maximum await acknowledgement are counted."""
    session = _session(receive_maximum=cap)
    _feed(session, [CONNACK])
    unacked: list[int] = []
    over = 0
    pid = 0
    for step in steps:
        if step is None:  # one QoS 1 message arrives
            pid = pid % 65535 + 1
            over += len(unacked) >= cap
            session.receive_data(_publish(PREFIX + b"x", b"r", qos=1, packet_id=pid))
            assert session.next_event() is None
            unacked += [d.token for d in session.take_deliveries()]
        else:  # ingest acknowledges some of them
            done, unacked = unacked[:step], unacked[step:]
            assert session.acknowledge(done) == b"".join(b"\x40\x02" + struct.pack(">H", t & 0xFFFF) for t in done)
        assert session.in_flight == len(unacked)
        assert session.has_credit == (len(unacked) < cap)
        assert session.statistics().over_receive_maximum == over


@given(st.lists(st.tuples(st.integers(1, 200), st.sampled_from([0, 0x10, 0x87, 0x97])), unique_by=lambda t: t[0]))
def test_every_puback_frees_its_packet_id_once_with_its_reason(answers: list[tuple[int, int]]) -> None:
    """A publisher's PUBACKs come out as (packet id, reason code), each id then free; a second PUBACK is an error."""
    session = _session(Role.PUBLISHER)
    session.receive_data(CONNACK)
    assert session.next_event() == Connected(session_present=False)
    for pid, _ in answers:
        session.publish(b"t", b"p", qos=1, packet_id=pid)
    assert session.outstanding == len(answers)
    session.receive_data(b"".join(b"\x40\x03" + struct.pack(">HB", pid, reason) for pid, reason in answers))
    assert session.next_event() is None
    assert session.take_acknowledgements() == [Acknowledged(pid, reason) for pid, reason in answers]
    assert session.outstanding == 0
    for pid, _ in answers:  # free again
        session.publish(b"t", b"p", qos=1, packet_id=pid)
    if answers:
        session.receive_data((b"\x40\x02" + struct.pack(">H", answers[0][0])) * 2)
        with pytest.raises(MqttProtocolError, match="awaits none"):
            session.next_event()


# -- examples -------------------------------------------------------------------------------


@settings(max_examples=200)
@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=20), st.integers(0, 3))
def test_valid_publishes_always_parse(payloads: list[bytes], cut: int) -> None:
    """Well-formed QoS 1 PUBLISHes parse to exactly their payloads, whatever the tail left for the next read."""
    stream = CONNACK + b"".join(_publish(b"t", p, qos=1, packet_id=i + 1) for i, p in enumerate(payloads))
    session = _session()
    session.receive_data(stream[: len(stream) - cut])
    events = list(iter(session.next_event, None))
    session.receive_data(stream[len(stream) - cut :])
    events += list(iter(session.next_event, None))
    assert events == [Connected(session_present=False)]
    assert [d.payload for d in session.take_deliveries()] == payloads


def test_a_delivery_keeps_the_payload_the_sender_and_the_receipt_request_only() -> None:
    """The topic gives the sender's levels; a receipt request gives reply_to and correlation; the rest is gone."""
    stream = CONNACK + _publish(
        PREFIX + b"fleet-sim/7/usage",
        b"report",
        qos=1,
        packet_id=9,
        properties=b"\x02\x00\x00\x00\x10" + _receipt_request(b"ldp/v1/receipts/c-1", b"\x01\x02"),
    )
    session = Session(Role.SUBSCRIBER, topic_prefix=PREFIX, tag=3)
    session.connect(client_id="c", clean_start=False, keepalive=30)
    events, deliveries, _, error = _feed(session, [stream, _publish(b"other/topic", b"x", qos=0)])
    assert error is None
    assert len(events) == 1
    (first, second) = deliveries
    assert (first.payload, first.sender, first.reply_to, first.correlation) == (
        b"report",
        b"fleet-sim/7",
        b"ldp/v1/receipts/c-1",
        b"\x01\x02",
    )
    assert packet_id_of(first.token) == 9
    assert (second.payload, second.sender, second.reply_to, packet_id_of(second.token)) == (b"x", b"", None, 0)
    assert {(t >> 16) & 0xFF for t in (first.token, second.token)} == {3}


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


@settings(max_examples=500)
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
    _, deliveries, _, error = _feed(_session(), [stream])
    if expected is None:
        assert error is not None
        assert deliveries == []
    else:
        assert error is None
        (delivery,) = deliveries
        assert (delivery.reply_to, delivery.correlation, delivery.payload) == expected


def test_events_come_in_order_and_a_disconnect_ends_the_connection() -> None:
    """CONNACK, SUBACKs, broker messages, DISCONNECT: events in stream order; bytes after DISCONNECT are ignored."""
    stream = (
        b"\x20\x09\x01\x00\x06\x13\x00\x05\x21\x00\x0a"  # session present, Server Keep Alive 5 s, Receive Maximum 10
        + SUBACK
        + b"\x90\x05\x00\x02\x00\x80\x87"
        + _publish(b"$SYS/broker/clients/connected", b"12", qos=0)
        + _publish(b"$SYS/broker/clients/connected", b"twelve", qos=0)
        + PINGRESP
        + b"\xe0\x01\x8b"
        + b"\x30\x00"
    )
    session = _session()
    events, deliveries, _, error = _feed(session, [stream])
    assert error is None
    assert deliveries == []
    assert events == [
        Connected(session_present=True, server_keep_alive=5, receive_maximum=10),
        Subscribed(1, b"\x01"),
        Subscribed(2, b"\x80\x87"),
        BrokerMessage(b"$SYS/broker/clients/connected", b"12"),
        BrokerMessage(b"$SYS/broker/clients/connected", b"twelve"),
        Disconnected(0x8B),
    ]
    assert not session.connected


def test_connack_refusals_say_whether_retrying_can_help() -> None:
    """Bad credentials are a permanent refusal; 'server busy' may pass; a first packet not CONNACK is an error."""
    assert _feed(_session(), [b"\x20\x03\x00\x86\x00"])[0] == [ConnectionRefused(0x86, "bad user name or password")]
    assert _feed(_session(), [b"\x20\x03\x00\x89\x00"])[0] == [ConnectionRefused(0x89, None)]
    assert _feed(_session(), [b"\x20\x03\x01\x00\x00"])[0][0] == Connected(session_present=True)
    assert _feed(_session(), [SUBACK])[3] == (0x82, "expected CONNACK, got packet type 9")
    assert _feed(_session(), [b"\x20\x03\x00\x00\xff"])[3] is not None  # an unparsable CONNACK property
    assert _feed(_session(), [b"\x20\x06\x00\x00\x03\x21\x00\x00"])[3] == (0x82, "CONNACK with Receive Maximum 0")


@pytest.mark.parametrize(
    ("suback", "error"),
    [
        (b"\x90\x04\x00\x07\x00\x01", "SUBACK for packet id 7, which awaits none"),
        (b"\x90\x05\x00\x01\x00\x01\x01", "SUBACK carries 2 reason codes for 1 filters"),
        (b"\x90\x03\x00\x01\x00", "SUBACK carries 0 reason codes for 1 filters"),
        (b"\x40\x02\x00\x01", "unexpected packet type 4 from the broker"),
        (b"\x20\x03\x00\x00\x00", "unexpected packet type 2 from the broker"),
        (b"\x34\x06\x00\x01\x61\x00\x01\x00", "PUBLISH with QoS 2 to a subscriber reading QoS 1 at most"),
    ],
)
def test_answers_the_session_never_asked_for_are_protocol_errors(suback: bytes, error: str) -> None:
    """A SUBACK for no SUBSCRIBE, one with the wrong number of codes, a PUBACK or a second CONNACK to a subscriber."""
    assert _feed(_session(), [CONNACK, suback])[3] in ((0x82, error), (0x81, error))


def test_tokens_of_an_earlier_connection_are_stale() -> None:
    """After a reconnect the old tokens are counted stale and not acknowledged; the new ones are."""
    session = _session()
    old = [d.token for d in _feed(session, [CONNACK + _publish(PREFIX + b"x", b"old", qos=1, packet_id=5)])[1]]
    session.connection_lost()
    session.connect(client_id="collector", clean_start=False, keepalive=30, session_expiry=3600)
    session.receive_data(CONNACK + _publish(PREFIX + b"x", b"old", qos=1, packet_id=5))
    while session.next_event() is not None:
        pass
    new = [d.token for d in session.take_deliveries()]
    assert old != new
    assert session.acknowledge(old) == b""
    assert session.acknowledge(new) == b"\x40\x02\x00\x05"
    session.drop_acks([*new, new[0] & ~0xFFFF])  # a QoS 0 token (packet id 0) is never stale
    stats = session.statistics()
    assert (stats.acked, stats.stale_acks) == (1, 2)


def test_bytes_before_connect_or_after_a_protocol_error_are_ignored() -> None:
    """A session that is not connected takes no bytes: nothing is parsed, nothing is raised."""
    session = Session(Role.SUBSCRIBER, receive_maximum=10, max_packet_bytes=1024)
    session.receive_data(b"\x30\x00")
    assert session.next_event() is None
    session.connect(client_id="c", clean_start=False, keepalive=30, session_expiry=60)
    session.receive_data(CONNACK + b"\x30\x00")
    assert _feed(session, [b""])[3] == (0x81, "PUBLISH shorter than its topic length")
    session.receive_data(b"\x30\x00")
    assert session.next_event() is None
    assert session.pending_bytes == 0


def test_an_mqtt_3_publisher_speaks_without_properties() -> None:
    """At protocol level 4 CONNECT, PUBLISH and SUBSCRIBE carry no properties; CONNACK and PUBACK are two bytes."""
    session = Session(Role.PUBLISHER, version=4)
    connect = session.connect(client_id="p", clean_start=True, keepalive=60)
    assert connect == b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01p"
    session.receive_data(b"\x20\x02\x00\x00")
    assert session.next_event() == Connected(session_present=False)
    assert session.publish(b"t", b"x", qos=1, packet_id=7) == b"\x32\x06\x00\x01t\x00\x07x"
    session.receive_data(b"\x40\x02\x00\x07")
    assert session.next_event() is None
    assert session.take_acknowledgements() == [Acknowledged(7, 0)]
    refused = Session(Role.PUBLISHER, version=4)
    refused.connect(client_id="p", clean_start=True, keepalive=60)
    refused.receive_data(b"\x20\x02\x00\x05")
    assert refused.next_event() == ConnectionRefused(5, "not authorized")


def test_publish_packets_are_framed_as_the_standard_says() -> None:
    """PUBLISH with and without properties, at QoS 0 and 1, DUP flagged: the bytes of §3.3."""
    assert publish_packet(b"a/b", b"xy", qos=0) == b"\x30\x08\x00\x03a/b\x00xy"
    assert publish_packet(b"a", b"", qos=1, packet_id=258, dup=True) == b"\x3a\x06\x00\x01a\x01\x02\x00"
    props = b"\x08\x00\x01r\x09\x00\x01c"
    assert publish_packet(b"a", b"p", qos=1, packet_id=1, properties=props) == (
        b"\x32\x0f\x00\x01a\x00\x01\x08" + props + b"p"
    )
    big = publish_packet(b"t", bytes(200), qos=0)
    assert big[:3] == b"\x30\xcc\x01"
    with pytest.raises(ValueError, match="no properties"):
        publish_packet(b"t", b"", qos=0, version=4, properties=props)


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


@pytest.mark.parametrize("module", sorted(p.name for p in MQTT_PACKAGE.glob("*.py")))
def test_the_protocol_core_does_no_io(module: str) -> None:
    """The MQTT core imports no event loop, socket, TLS or clock: bytes in, values out."""
    tree = ast.parse((MQTT_PACKAGE / module).read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not imported & {"asyncio", "socket", "ssl", "selectors", "time", "logging"}
