"""MQTT packets one at a time: Variable Byte Integers, properties, and each packet a client sends or reads.

Stateless and pure (no I/O, no clock): each function turns values into the bytes of one
packet, or the body of one packet into values. The subset is what the project's clients need
(OASIS MQTT 5.0, 2019): CONNECT/CONNACK, SUBSCRIBE/SUBACK, PUBLISH (QoS 0 and 1), PUBACK,
PINGREQ/PINGRESP, DISCONNECT; CONNECT, SUBSCRIBE and PUBLISH can also be written at protocol
level 4 (MQTT 3.1.1) for the tests' publisher. Every decoder is total: malformed bytes raise
:class:`MqttProtocolError`, never ``IndexError`` or ``ValueError``.

What a sequence of packets means, for either role, is :mod:`protocol.mqtt.session`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from protocol.mqtt.reasons import MALFORMED_PACKET

__all__ = [
    "CONNACK",
    "CONNECT",
    "CORRELATION_DATA",
    "DISCONNECT",
    "DISCONNECT_PACKET",
    "PINGREQ",
    "PINGREQ_PACKET",
    "PINGRESP",
    "PUBACK",
    "PUBLISH",
    "RECEIVE_MAXIMUM",
    "RESPONSE_TOPIC",
    "SERVER_KEEP_ALIVE",
    "SUBACK",
    "SUBSCRIBE",
    "Connack",
    "MqttProtocolError",
    "RequestProperties",
    "acknowledgements",
    "connect_packet",
    "decode_connack",
    "decode_varint",
    "disconnect_packet",
    "encode_varint",
    "frame_publish",
    "parse_properties",
    "puback_packet",
    "publish_packet",
    "receipt_request",
    "split_packets",
    "subscribe_packet",
]

CONNECT, CONNACK, PUBLISH, PUBACK = 1, 2, 3, 4
SUBSCRIBE, SUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 12, 13, 14
"""Control packet types (§2.1.2): the high four bits of a packet's first byte."""

PINGREQ_PACKET: Final = bytes([PINGREQ << 4, 0])
DISCONNECT_PACKET: Final = bytes([DISCONNECT << 4, 0])
"""DISCONNECT with reason Normal disconnection: the broker keeps the session (§3.14.2.1)."""

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
RESPONSE_TOPIC, CORRELATION_DATA, SERVER_KEEP_ALIVE, RECEIVE_MAXIMUM = 0x08, 0x09, 0x13, 0x21
_SESSION_EXPIRY, _MAXIMUM_PACKET_SIZE = 0x11, 0x27

_u16 = struct.Struct(">H").pack
_RESPONSE_TOPIC, _CORRELATION = bytes([RESPONSE_TOPIC]), bytes([CORRELATION_DATA])
_PUBLISH_FIRST: Final = tuple(
    bytes([PUBLISH << 4 | (0x08 if flags & 4 else 0) | (flags & 3) << 1]) for flags in range(8)
)
"""A PUBLISH's first byte by ``qos | 4 * dup`` (§3.3.1)."""
_SHORT_VARINTS: Final = tuple(bytes([n]) for n in range(128))
"""The one-byte Variable Byte Integers: every property length and most packet lengths."""


class MqttProtocolError(Exception):
    """The peer sent bytes that are not valid MQTT, or broke a limit we announced; the connection is dropped.

    Attributes:
        reason: the MQTT 5 DISCONNECT reason code to send before closing (§3.14.2.1):
            0x81 malformed packet, 0x82 protocol error, 0x95 packet too large.
    """

    def __init__(self, message: str, *, reason: int = MALFORMED_PACKET) -> None:
        super().__init__(message)
        self.reason = reason


def encode_varint(value: int) -> bytes:
    """MQTT Variable Byte Integer (§1.5.5), 1 to 4 bytes."""
    if 0 <= value < 128:
        return _SHORT_VARINTS[value]
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
    return _u16(len(data)) + data


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
    """A CONNECT packet (protocol level 5, or 4 for MQTT 3.1.1, which carries no properties)."""
    flags = (0x02 if clean_start else 0) | (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = _str16(b"MQTT") + bytes([version, flags]) + _u16(keepalive)
    if version == 5:
        props = b""
        if session_expiry:
            props += bytes([_SESSION_EXPIRY]) + struct.pack(">I", session_expiry)
        if receive_maximum is not None:
            props += bytes([RECEIVE_MAXIMUM]) + _u16(receive_maximum)
        if max_packet_bytes is not None:
            props += bytes([_MAXIMUM_PACKET_SIZE]) + struct.pack(">I", max_packet_bytes)
        body += encode_varint(len(props)) + props
    body += _str16(client_id.encode())
    if username is not None:
        body += _str16(username.encode())
    if password is not None:
        body += _str16(password)
    return _packet(CONNECT << 4, body)


def subscribe_packet(packet_id: int, filters: Sequence[tuple[str, int]], *, version: int = 5) -> bytes:
    """A SUBSCRIBE packet for ``filters``, each a topic filter and its maximum QoS, with no properties."""
    body = _u16(packet_id)
    if version == 5:
        body += b"\x00"
    for topic_filter, qos in filters:
        body += _str16(topic_filter.encode()) + bytes([qos])
    return _packet((SUBSCRIBE << 4) | 0x02, body)


def receipt_request(response_topic: bytes, correlation: bytes) -> bytes:
    """The properties of a request that wants an answer (§4.10): Response Topic, then Correlation Data."""
    return RequestProperties(response_topic)(correlation)


class RequestProperties:
    """The properties of each request a client sends for an answer on one Response Topic (§4.10).

    The Response Topic's part is built once; each call adds one request's Correlation Data
    (the fleet's publisher makes one per report).
    """

    __slots__ = ("_head",)

    def __init__(self, response_topic: bytes) -> None:
        self._head = b"".join((_RESPONSE_TOPIC, _str16(response_topic), _CORRELATION))

    def __call__(self, correlation: bytes) -> bytes:
        """The property block (without its length) of a request with ``correlation``."""
        if len(correlation) > 0xFFFF:
            raise ValueError("MQTT binary data longer than 65535 bytes")
        return b"".join((self._head, _u16(len(correlation)), correlation))


def publish_packet(
    topic: bytes,
    payload: bytes,
    *,
    qos: int,
    packet_id: int = 0,
    dup: bool = False,
    version: int = 5,
    properties: bytes = b"",
) -> bytes:
    """A PUBLISH packet; ``properties`` is an encoded property block without its length (MQTT 5 only)."""
    return frame_publish(topic, payload, qos, packet_id, dup, version, properties)


def frame_publish(  # noqa: PLR0917  one call per report sent (bench_fleet): positional is a fifth cheaper
    topic: bytes, payload: bytes, qos: int, packet_id: int, dup: bool, version: int, properties: bytes
) -> bytes:
    """:func:`publish_packet` with its arguments in order, for :meth:`protocol.mqtt.session.Session.publish`."""
    length = len(topic)
    if length > 0xFFFF:
        raise ValueError("MQTT string longer than 65535 bytes")
    pid = _u16(packet_id) if qos else b""
    if version == 5:
        size = len(properties)
        head = b"".join(
            (_u16(length), topic, pid, _SHORT_VARINTS[size] if size < 128 else encode_varint(size), properties)
        )
    elif properties:
        raise ValueError("MQTT 3.1.1 has no properties")
    else:
        head = b"".join((_u16(length), topic, pid))
    size = len(head) + len(payload)
    first = _PUBLISH_FIRST[qos | (4 if dup else 0)]
    return b"".join((first, _SHORT_VARINTS[size] if size < 128 else encode_varint(size), head, payload))


def acknowledgements(packet_ids: Sequence[int]) -> bytes:
    """PUBACKs with reason Success and no properties, one per packet id, in one string of bytes.

    Each is ``0x40 0x02 <packet id>``: the form both protocol levels accept (§3.4.2.1).
    """
    return struct.pack(f">{len(packet_ids)}I", *(0x40020000 | p for p in packet_ids))


def puback_packet(packet_id: int, reason: int) -> bytes:
    """A PUBACK with ``reason`` and no properties (§3.4): a refusal, at 0x80 and above."""
    return bytes([PUBACK << 4, 3]) + _u16(packet_id) + bytes([reason])


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
    (User Property) keeps its last value, which is all a client here needs.

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
    """What a CONNACK said: session present, the reason code, and the properties a client must honour.

    Attributes:
        session_present: the broker resumed the session (§3.2.2.1.1).
        reason: 0 when the connection is accepted, else the broker's refusal (§3.2.2.2).
        properties: decoded only when the connection is accepted at protocol level 5.
    """

    session_present: bool
    reason: int = 0
    properties: Mapping[int, int | bytes] = field(default_factory=dict)

    def _integer(self, ident: int) -> int | None:
        value = self.properties.get(ident)
        return value if isinstance(value, int) else None

    @property
    def server_keep_alive(self) -> int | None:
        """The broker's Server Keep Alive (seconds), which replaces ours when present (§3.2.2.3.14)."""
        return self._integer(SERVER_KEEP_ALIVE)

    @property
    def receive_maximum(self) -> int:
        """How many QoS 1 PUBLISHes the broker takes unacknowledged (§3.2.2.3.3; 65,535 when absent)."""
        value = self._integer(RECEIVE_MAXIMUM)
        return 65535 if value is None else value


def decode_connack(body: bytes, *, version: int = 5) -> Connack:
    """Decode a CONNACK body; a refusal is decoded, not raised (see :func:`protocol.mqtt.reasons.permanent_refusal`).

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
