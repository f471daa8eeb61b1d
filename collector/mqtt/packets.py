"""MQTT 5 packets, one at a time: Variable Byte Integers, properties, and the packets a subscriber sends or reads.

Stateless and pure (no I/O, no clock): each function turns values into the bytes of one
packet, or the body of one packet into values. The subset is what the collector's
subscriber needs (OASIS MQTT 5.0, 2019): CONNECT/CONNACK, SUBSCRIBE/SUBACK, PUBLISH (QoS 0
and 1), PUBACK, PINGREQ/PINGRESP, DISCONNECT; CONNECT and PUBLISH can also be written at
protocol level 4 (MQTT 3.1.1) for test publishers. Every decoder is total: malformed bytes
raise :class:`MqttProtocolError`, never ``IndexError`` or ``ValueError``.

The stateful side (splitting a byte stream into packets, Receive Maximum, the deliveries
waiting for ingest) is :mod:`collector.mqtt.codec`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "BROKER_COUNTERS",
    "CONNACK",
    "CONNECT",
    "CORRELATION_DATA",
    "COUNTERS_PACKET_ID",
    "DISCONNECT",
    "DISCONNECT_PACKET",
    "MALFORMED_PACKET",
    "PACKET_TOO_LARGE",
    "PINGREQ",
    "PINGREQ_PACKET",
    "PINGRESP",
    "PROTOCOL_ERROR",
    "PUBACK",
    "PUBLISH",
    "REPORTS_PACKET_ID",
    "RESPONSE_TOPIC",
    "SERVER_KEEP_ALIVE",
    "SUBACK",
    "SUBSCRIBE",
    "Connack",
    "MqttProtocolError",
    "connect_packet",
    "counters_subscribe_packet",
    "decode_connack",
    "decode_varint",
    "disconnect_packet",
    "encode_varint",
    "parse_properties",
    "permanent_refusal",
    "publish_packet",
    "split_packets",
    "subscribe_packet",
]

CONNECT, CONNACK, PUBLISH, PUBACK = 1, 2, 3, 4
SUBSCRIBE, SUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 12, 13, 14

MALFORMED_PACKET, PROTOCOL_ERROR, PACKET_TOO_LARGE = 0x81, 0x82, 0x95
"""The DISCONNECT reason codes this client sends when the broker breaks the protocol (§3.14.2.1)."""

PINGREQ_PACKET = b"\xc0\x00"
DISCONNECT_PACKET = b"\xe0\x00"
"""DISCONNECT with reason Normal disconnection: the broker keeps the session (§3.14.2.1)."""

REPORTS_PACKET_ID = 1
"""The packet id of the SUBSCRIBE to the reports."""
COUNTERS_PACKET_ID = 2
"""The packet id of the SUBSCRIBE to :data:`BROKER_COUNTERS`."""

BROKER_COUNTERS: tuple[str, ...] = (
    "$SYS/broker/publish/messages/dropped",
    "$SYS/broker/store/messages/count",
    "$SYS/broker/store/messages/bytes",
    "$SYS/broker/clients/connected",
)
"""Mosquitto's counters the collector follows (published every ``sys_interval`` seconds)."""

# CONNACK reason codes after which retrying is pointless (MQTT 5 §3.2.2.2).
_PERMANENT_REFUSALS = {
    0x84: "unsupported protocol version",
    0x85: "client identifier not valid",
    0x86: "bad user name or password",
    0x87: "not authorized",
    0x8C: "bad authentication method",
}
# Protocol version 3.1.1 CONNACK return codes (test publishers speak it too).
_PERMANENT_REFUSALS_V4 = {
    1: "unacceptable protocol version",
    2: "identifier rejected",
    4: "bad user name or password",
    5: "not authorized",
}

# MQTT 5 property identifiers (§2.2.2.2) and the shape of their values.
_BYTE, _TWO, _FOUR, _VARINT, _STRING, _BINARY, _PAIR = range(7)
_PROPERTY_TYPES = {
    0x01: _BYTE, 0x02: _FOUR, 0x03: _STRING, 0x08: _STRING, 0x09: _BINARY, 0x0B: _VARINT,
    0x11: _FOUR, 0x12: _STRING, 0x13: _TWO, 0x15: _STRING, 0x16: _BINARY, 0x17: _BYTE,
    0x18: _FOUR, 0x19: _BYTE, 0x1A: _STRING, 0x1C: _STRING, 0x1F: _STRING, 0x21: _TWO,
    0x22: _TWO, 0x23: _TWO, 0x24: _BYTE, 0x25: _BYTE, 0x26: _PAIR, 0x27: _FOUR, 0x28: _BYTE,
    0x29: _BYTE, 0x2A: _BYTE,
}  # fmt: skip
_WIDTHS = {_BYTE: 1, _TWO: 2, _FOUR: 4}
SERVER_KEEP_ALIVE = 0x13
RESPONSE_TOPIC, CORRELATION_DATA = 0x08, 0x09


class MqttProtocolError(Exception):
    """The peer sent bytes that are not valid MQTT, or broke a limit we announced; the connection is dropped.

    Attributes:
        reason: the MQTT 5 DISCONNECT reason code we send before closing (§3.14.2.1):
            0x81 malformed packet, 0x82 protocol error, 0x95 packet too large.
    """

    def __init__(self, message: str, *, reason: int = MALFORMED_PACKET) -> None:
        super().__init__(message)
        self.reason = reason


def encode_varint(value: int) -> bytes:
    """MQTT Variable Byte Integer (§1.5.5), 1 to 4 bytes."""
    if not 0 <= value <= 268435455:
        raise ValueError(f"variable byte integer out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def decode_varint(buf: bytes, pos: int, end: int | None = None) -> tuple[int, int] | None:
    """Decode a Variable Byte Integer at ``pos``: ``(value, next_pos)``, or None if incomplete.

    Bytes at or past ``end`` (default: the end of ``buf``) are not read.

    Raises:
        MqttProtocolError: more than four bytes.
    """
    stop = len(buf) if end is None else min(end, len(buf))
    value = 0
    shift = 0
    for i in range(4):
        if pos + i >= stop:
            return None
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise MqttProtocolError("variable byte integer longer than 4 bytes")


def _str16(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("MQTT string longer than 65535 bytes")
    return struct.pack(">H", len(data)) + data


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + encode_varint(len(body)) + body


def connect_packet(
    *,
    client_id: str,
    clean_start: bool,
    keepalive: int,
    version: int = 5,
    session_expiry: int = 0,
    receive_maximum: int | None = None,
    max_packet_bytes: int | None = None,
    username: str | None = None,
    password: bytes | None = None,
) -> bytes:
    """A CONNECT packet (protocol level 5, or 4 for MQTT 3.1.1)."""
    flags = (0x02 if clean_start else 0) | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = _str16(b"MQTT") + bytes([version, flags]) + struct.pack(">H", keepalive)
    if version == 5:
        props = b""
        if session_expiry:
            props += b"\x11" + struct.pack(">I", session_expiry)
        if receive_maximum is not None:
            props += b"\x21" + struct.pack(">H", receive_maximum)
        if max_packet_bytes is not None:
            props += b"\x27" + struct.pack(">I", max_packet_bytes)
        body += encode_varint(len(props)) + props
    body += _str16(client_id.encode())
    if username is not None:
        body += _str16(username.encode())
    if password is not None:
        body += _str16(password)
    return _packet(CONNECT << 4, body)


def subscribe_packet(packet_id: int, topic_filter: str, *, qos: int = 1, version: int = 5) -> bytes:
    """A SUBSCRIBE packet for one topic filter."""
    body = struct.pack(">H", packet_id)
    if version == 5:
        body += b"\x00"  # no properties
    body += _str16(topic_filter.encode()) + bytes([qos])
    return _packet((SUBSCRIBE << 4) | 0x02, body)


def counters_subscribe_packet() -> bytes:
    """One SUBSCRIBE (packet id :data:`COUNTERS_PACKET_ID`) for every topic of :data:`BROKER_COUNTERS`, at QoS 0."""
    body = struct.pack(">H", COUNTERS_PACKET_ID) + encode_varint(0)
    for topic in BROKER_COUNTERS:
        body += _str16(topic.encode()) + b"\x00"
    return _packet((SUBSCRIBE << 4) | 0x02, body)


def publish_packet(
    topic: bytes, payload: bytes, *, qos: int, packet_id: int = 0, dup: bool = False, version: int = 5
) -> bytes:
    """A PUBLISH packet."""
    body = _str16(topic)
    if qos:
        body += struct.pack(">H", packet_id)
    if version == 5:
        body += b"\x00"
    body += payload
    return _packet((PUBLISH << 4) | (0x08 if dup else 0) | (qos << 1), body)


def disconnect_packet(reason: int) -> bytes:
    """DISCONNECT with ``reason`` and no properties (§3.14)."""
    return bytes([DISCONNECT << 4, 2, reason, 0])


def split_packets(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Split complete packets off ``buf``: ``([(first_byte, body), ...], rest)``.

    Raises:
        MqttProtocolError: a remaining length of more than four bytes.
    """
    out: list[tuple[int, bytes]] = []
    pos = 0
    while True:
        header = decode_varint(buf, pos + 1) if len(buf) - pos >= 2 else None
        if header is None:
            break
        length, start = header
        end = start + length
        if end > len(buf):
            break
        out.append((buf[pos], buf[start:end]))
        pos = end
    return out, buf[pos:]


def parse_properties(buf: bytes, pos: int, end: int) -> tuple[dict[int, int | bytes], int]:
    """Decode an MQTT 5 property block at ``pos`` that must end by ``end``: ``(properties, next_pos)``.

    Integers decode to ``int``, strings and binary data to ``bytes``; a repeated property
    (User Property) keeps its last value, which is all a subscriber needs.

    Raises:
        MqttProtocolError: truncated, overlong, or an unknown property identifier.
    """
    header = decode_varint(buf, pos, end)
    if header is None:
        raise MqttProtocolError("truncated property length")
    length, i = header
    stop = i + length
    if stop > end:
        raise MqttProtocolError("properties longer than the packet")
    out: dict[int, int | bytes] = {}
    while i < stop:
        ident = buf[i]
        kind = _PROPERTY_TYPES.get(ident)
        i += 1
        if kind is None:
            raise MqttProtocolError(f"unknown property identifier 0x{ident:02x}")
        if kind in _WIDTHS:
            width = _WIDTHS[kind]
            if i + width > stop:
                raise MqttProtocolError(f"property 0x{ident:02x} truncated")
            out[ident] = int.from_bytes(buf[i : i + width], "big")
            i += width
        elif kind == _VARINT:
            value = decode_varint(buf, i, stop)
            if value is None:
                raise MqttProtocolError(f"property 0x{ident:02x} truncated")
            out[ident], i = value
        else:
            for _ in range(2 if kind == _PAIR else 1):
                if i + 2 > stop:
                    raise MqttProtocolError(f"property 0x{ident:02x} truncated")
                n = (buf[i] << 8) | buf[i + 1]
                if i + 2 + n > stop:
                    raise MqttProtocolError(f"property 0x{ident:02x} longer than its block")
                out[ident] = bytes(buf[i + 2 : i + 2 + n])
                i += 2 + n
    return out, stop


@dataclass(frozen=True, slots=True)
class Connack:
    """What a CONNACK said: session present, the reason code, and the properties a subscriber must honour.

    Attributes:
        session_present: the broker resumed the session (§3.2.2.1.1).
        reason: 0 when the connection is accepted, else the broker's refusal (§3.2.2.2).
        properties: decoded only when the connection is accepted at protocol level 5.
    """

    session_present: bool
    reason: int = 0
    properties: Mapping[int, int | bytes] = field(default_factory=dict)

    @property
    def server_keep_alive(self) -> int | None:
        """The broker's Server Keep Alive (seconds), which replaces ours when present (§3.2.2.3.14)."""
        value = self.properties.get(SERVER_KEEP_ALIVE)
        return value if isinstance(value, int) else None


def decode_connack(body: bytes, *, version: int = 5) -> Connack:
    """Decode a CONNACK body; a refusal is decoded, not raised (see :func:`permanent_refusal`).

    Raises:
        MqttProtocolError: malformed (short, reserved flags set, unparsable properties).
    """
    if len(body) < 2:
        raise MqttProtocolError("CONNACK shorter than 2 bytes")
    if body[0] & 0xFE:
        raise MqttProtocolError("CONNACK acknowledge flags have reserved bits set")
    code = body[1]
    properties: dict[int, int | bytes] = {}
    if not code and version == 5 and len(body) > 2:
        properties, stop = parse_properties(body, 2, len(body))
        if stop != len(body):
            raise MqttProtocolError("bytes after the CONNACK properties")
    return Connack(session_present=bool(body[0] & 1), reason=code, properties=properties)


def permanent_refusal(reason: int, *, version: int = 5) -> str | None:
    """What a CONNACK refusal means when retrying cannot fix it (bad credentials, ...); None when it may pass."""
    return (_PERMANENT_REFUSALS if version == 5 else _PERMANENT_REFUSALS_V4).get(reason)
