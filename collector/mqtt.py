"""MQTT 5 on asyncio streams: the collector's subscriber, with acknowledgement after commit.

Why not a general-purpose client: the collector needs exactly one behaviour that common
Python clients make hard or slow. A QoS 1 message must be acknowledged (PUBACK) only after
its contribution is committed to the checkpoint store; aiomqtt acknowledges on receipt,
and paho reads every packet with several one-byte ``recv`` calls under the GIL (about
10,000 messages/s on the reference machine, before any work is done). This module speaks
the small subset of MQTT 5 (OASIS standard, 2019) a subscriber needs - CONNECT/CONNACK,
SUBSCRIBE/SUBACK, PUBLISH (QoS 0 and 1), PUBACK, PINGREQ/PINGRESP, DISCONNECT - and splits
packets from large socket reads in one pass.

Guarantees:

* **Persistent session**: Clean Start is 0 and the Session Expiry Interval is set, so the
  broker keeps our subscription and queues messages while the collector is down; after a
  reconnect it resends unacknowledged messages (MQTT 5 §4.4).
* **Acknowledge after commit**: a delivery's token is ``connection generation << 16 |
  packet id``; :meth:`MqttTransport.ack` sends PUBACK only for tokens of the live
  connection. A token from a connection that has since dropped is ignored: its packet id
  may already name another message on the new connection, and the broker will redeliver
  the original anyway (the report-id table absorbs the repeat).
* **Bounded memory, backpressure**: the CONNECT Receive Maximum caps unacknowledged QoS 1
  messages in flight to us (the broker stops sending until we acknowledge, MQTT 5
  §4.9), and the reader stops reading the socket while ``buffer_bytes`` of payload wait
  for ingest, so TCP pushes back. QoS 0 messages beyond the buffer are dropped and counted.
* **Metadata stripped**: a :class:`~collector.transport.Delivery` carries only the
  payload and the sender's identity (the topic levels between the subscription's prefix and
  the use case, which the broker's ACL ties to the authenticated user); the rest of the
  topic, properties and flags are discarded here.
* **Loss at the broker is visible**: a second, QoS 0 subscription to a few of Mosquitto's
  ``$SYS/broker/...`` counters (:data:`BROKER_COUNTERS`: messages dropped on full queues,
  messages and bytes stored, clients connected) keeps their last values for
  :meth:`MqttTransport.statistics` and the Prometheus metrics; they never reach ingest. The
  ACL lets only the collector credential read them; a broker that refuses the subscription
  costs a log line, nothing more.
* **Reconnect outside the session** with capped, jittered exponential backoff
  (:mod:`runtime.backoff`, reset after a healthy session); a
  refusal that retrying cannot fix (bad credentials, subscription not granted at QoS 1)
  raises :class:`~collector.errors.TransportError` and ends the service; so does a TLS file
  that is gone or broken at a reconnect (a :class:`~collector.errors.ConfigError` naming the
  field and the file).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collector.config import MqttConfig, TlsConfig, read_password
from collector.errors import ConfigError, TransportError
from collector.transport import NO_ACK, Delivery, TransportStatistics
from protocol.receipts import Receipt, encode_receipts
from runtime.backoff import Backoff, Retry
from runtime.errors import SettingFileError
from runtime.tls import client_context

__all__ = [
    "BROKER_COUNTERS",
    "MqttProtocolError",
    "MqttTransport",
    "connect_packet",
    "decode_varint",
    "encode_varint",
    "publish_packet",
    "split_packets",
    "subscribe_packet",
    "tls_context",
]

log = logging.getLogger(__name__)

CONNECT, CONNACK, PUBLISH, PUBACK = 1, 2, 3, 4
SUBSCRIBE, SUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 12, 13, 14

_PINGREQ = b"\xc0\x00"
_RECEIPTS_PER_MESSAGE = 2000  # about 40 KiB of receipts in one PUBLISH
_DISCONNECT_NORMAL = b"\xe0\x00"
_CONNECT_TIMEOUT = 10.0

# CONNACK reason codes after which retrying is pointless (MQTT 5 §3.2.2.2).
_FATAL_CONNACK = {
    0x84: "unsupported protocol version",
    0x85: "client identifier not valid",
    0x86: "bad user name or password",
    0x87: "not authorized",
    0x8C: "bad authentication method",
}
# Protocol version 3.1.1 CONNACK return codes (the publisher speaks it too).
_FATAL_CONNACK_V4 = {
    1: "unacceptable protocol version",
    2: "identifier rejected",
    4: "bad user name or password",
    5: "not authorized",
}


class MqttProtocolError(Exception):
    """The peer sent bytes that are not valid MQTT, or broke a limit we announced; the connection is dropped.

    Attributes:
        reason: the MQTT 5 DISCONNECT reason code we send before closing (§3.14.2.1):
            0x81 malformed packet, 0x82 protocol error, 0x95 packet too large.
    """

    def __init__(self, message: str, *, reason: int = 0x81) -> None:
        super().__init__(message)
        self.reason = reason


_MALFORMED, _PROTOCOL_ERROR, _PACKET_TOO_LARGE = 0x81, 0x82, 0x95


class _ConnectionLostError(Exception):
    """The connection ended (closed by the peer, keepalive expired, server DISCONNECT)."""


_SHORT_READ = 64 * 1024
"""A read shorter than this found the socket nearly empty: the collector is keeping up."""

READ_PAUSE_S = 0.02
"""After a short read, how long the socket is left to fill before the next one.

A collector that keeps up with its stream otherwise wakes for every few segments the broker
writes. Each wake-up (a read, a parse, an ingest pass) has a fixed cost, and on the
reference machine a process that works in short bursts between sleeps is also charged more
CPU per unit of work than one kept busy. Measured with ``benchmarks.bench_collector``
(``live``, three members sharing the stream, 20 records a message): about 1,250 reads per
member for 20,000 messages without the pause, 170 with it, and 21.6-23.8 instead of
27.6-30.0 us of collector CPU a message. 20 ms is small next to the commit interval
(``ingest.commit_interval_s``, 250 ms by default), which bounds when a report is counted
and acknowledged; the service never pauses longer than a quarter of it, so an operator who
shortens the interval for latency shortens the pause too. A busy collector never pauses
(its reads are long).
"""


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


BROKER_COUNTERS: tuple[str, ...] = (
    "$SYS/broker/publish/messages/dropped",
    "$SYS/broker/store/messages/count",
    "$SYS/broker/store/messages/bytes",
    "$SYS/broker/clients/connected",
)
"""Mosquitto's counters the collector follows (published every ``sys_interval`` seconds)."""

_SYS_PACKET_ID = 2  # the SUBSCRIBE of BROKER_COUNTERS (1 is the reports' subscription)


def subscribe_packet(packet_id: int, topic_filter: str, *, qos: int = 1, version: int = 5) -> bytes:
    """A SUBSCRIBE packet for one topic filter."""
    body = struct.pack(">H", packet_id)
    if version == 5:
        body += b"\x00"  # no properties
    body += _str16(topic_filter.encode()) + bytes([qos])
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


def _sys_subscribe_packet() -> bytes:
    """One SUBSCRIBE (packet id 2) for every topic of BROKER_COUNTERS, at QoS 0."""
    body = struct.pack(">H", _SYS_PACKET_ID) + encode_varint(0)
    for topic in BROKER_COUNTERS:
        body += _str16(topic.encode()) + b"\x00"
    return _packet((SUBSCRIBE << 4) | 0x02, body)


def split_packets(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Split complete packets off ``buf``: ``([(first_byte, body), ...], rest)``."""
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


def tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """The TLS context of the broker connection, built from the files ``[mqtt.tls]`` names.

    Called at start-up and again at every reconnect, so a file that is gone or broken later
    stops the collector with the same message instead of a retry loop that names no file.

    Raises:
        ConfigError: naming the config file, the field (``mqtt.tls.ca_file``, ...) and the file.
    """
    try:
        return client_context(ca_file=tls.ca_file, cert_file=tls.cert_file, key_file=tls.key_file)
    except SettingFileError as exc:
        raise ConfigError(tls.source, f"mqtt.tls.{exc.setting}", exc.problem) from None


def _tls_context(config: MqttConfig) -> ssl.SSLContext | None:
    # Built again at every connect: a CA file that vanished since start-up raises the
    # ConfigError naming it (which ends the service) rather than an OSError retried forever.
    return None if config.tls is None else tls_context(config.tls)


# MQTT 5 property identifiers (§2.2.2.2) and the shape of their values, for CONNACK.
_BYTE, _TWO, _FOUR, _VARINT, _STRING, _BINARY, _PAIR = range(7)
_PROPERTY_TYPES = {
    0x01: _BYTE, 0x02: _FOUR, 0x03: _STRING, 0x08: _STRING, 0x09: _BINARY, 0x0B: _VARINT,
    0x11: _FOUR, 0x12: _STRING, 0x13: _TWO, 0x15: _STRING, 0x16: _BINARY, 0x17: _BYTE,
    0x18: _FOUR, 0x19: _BYTE, 0x1A: _STRING, 0x1C: _STRING, 0x1F: _STRING, 0x21: _TWO,
    0x22: _TWO, 0x23: _TWO, 0x24: _BYTE, 0x25: _BYTE, 0x26: _PAIR, 0x27: _FOUR, 0x28: _BYTE,
    0x29: _BYTE, 0x2A: _BYTE,
}  # fmt: skip
SERVER_KEEP_ALIVE, MAXIMUM_PACKET_SIZE, REASON_STRING = 0x13, 0x27, 0x1F
RESPONSE_TOPIC, CORRELATION_DATA = 0x08, 0x09


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
        if kind in (_BYTE, _TWO, _FOUR):
            width = {_BYTE: 1, _TWO: 2, _FOUR: 4}[kind]
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
    """What a CONNACK said: session present, and the properties a subscriber must honour."""

    session_present: bool
    properties: dict[int, int | bytes]

    @property
    def server_keep_alive(self) -> int | None:
        """The broker's Server Keep Alive (seconds), which replaces ours when present (§3.2.2.3.14)."""
        value = self.properties.get(SERVER_KEEP_ALIVE)
        return value if isinstance(value, int) else None


def _check_connack(body: bytes, *, version: int) -> Connack:
    """Validate a CONNACK body and decode its properties (MQTT 5).

    Raises:
        TransportError: a refusal that retrying cannot fix.
        MqttProtocolError: malformed.
        _ConnectionLostError: a refusal worth retrying.
    """
    if len(body) < 2:
        raise MqttProtocolError("CONNACK shorter than 2 bytes")
    if body[0] & 0xFE:
        raise MqttProtocolError("CONNACK acknowledge flags have reserved bits set")
    code = body[1]
    if code:
        table = _FATAL_CONNACK if version == 5 else _FATAL_CONNACK_V4
        if code in table:
            raise TransportError(f"the broker refused the connection: {table[code]} (reason code 0x{code:02x})")
        raise _ConnectionLostError(f"the broker refused the connection for now (reason code 0x{code:02x})")
    properties: dict[int, int | bytes] = {}
    if version == 5 and len(body) > 2:
        properties, stop = parse_properties(body, 2, len(body))
        if stop != len(body):
            raise MqttProtocolError("bytes after the CONNACK properties")
    return Connack(session_present=bool(body[0] & 1), properties=properties)


class MqttTransport:
    """A persistent MQTT 5 QoS 1 subscription whose messages are acknowledged on request.

    Run :meth:`run` as a task (it connects, reconnects and never returns unless the broker
    refuses us for good); call :meth:`receive` and :meth:`ack` from the ingest task.

    Args:
        config: broker address, client id, topic, shared-subscription group, limits.
    """

    def __init__(self, config: MqttConfig, *, read_pause_s: float = READ_PAUSE_S) -> None:
        """``read_pause_s``: how long the socket is left to fill after a short read (see
        :data:`READ_PAUSE_S`; the service passes at most a quarter of its commit interval)."""
        self.config = config
        self._read_pause_s = read_pause_s
        # "ldp/v1/reports/#" -> b"ldp/v1/reports/": what comes after it, up to the last level
        # (the use case), is the sender's identity.
        self._prefix = config.topic[:-1].encode() if config.topic.endswith("/#") else None
        self._password = read_password(config)
        self._buffer: collections.deque[Delivery] = collections.deque()
        self._buffered_bytes = 0
        self._ready = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._subscribed = asyncio.Event()
        self._writer: asyncio.StreamWriter | None = None
        self._generation = 0
        self._unacked = 0
        self._connects = 0
        self._received = 0
        self._acked = 0
        self._stale = 0
        self._dropped = 0
        self._last_rx = 0.0
        self._last_tx = 0.0
        self._broker: dict[str, float] = {}
        self.session_present = False
        self._closing = False
        self._keepalive_s = config.keepalive_s
        self._healthy = False  # this connection was subscribed: the next reconnect starts from the shortest delay
        self._protocol_errors = 0
        self._over_receive_maximum = 0
        self._receipts_sent = 0
        self._receipts_dropped = 0
        self._paused = False
        self._credit = asyncio.Event()  # set whenever fewer than Receive Maximum messages await acknowledgement
        self._credit.set()

    # -- ingest side ---------------------------------------------------------------------

    async def receive(self, max_count: int) -> list[Delivery]:
        """Wait until at least one delivery is buffered; return up to ``max_count``."""
        while not self._buffer:
            self._ready.clear()
            await self._ready.wait()
        buf = self._buffer
        n = min(max_count, len(buf))
        out = [buf.popleft() for _ in range(n)]
        self._buffered_bytes -= sum(len(d.payload) for d in out)
        if self._buffered_bytes <= self.config.buffer_bytes // 2:
            self._drained.set()
        return out

    def ack(self, tokens: Sequence[int]) -> None:
        """Send PUBACK for every token of the live connection; drop the others."""
        writer = self._writer
        current = self._generation
        pids = [t & 0xFFFF for t in tokens if t != NO_ACK and t >> 16 == current]
        stale = sum(1 for t in tokens if t != NO_ACK) - len(pids)
        self._stale += stale
        if not pids:
            return
        if writer is None or writer.is_closing():
            self._stale += len(pids)
            return
        # PUBACK with reason Success and no properties is 0x40 0x02 <packet id> (§3.4.2.1).
        writer.write(struct.pack(f">{len(pids)}I", *(0x40020000 | p for p in pids)))
        self._last_tx = time.monotonic()
        self._acked += len(pids)
        self._unacked -= len(pids)
        if self._unacked < self.config.receive_maximum:
            self._credit.set()

    def send_receipts(self, receipts: Mapping[bytes, Sequence[Receipt]]) -> None:
        """Publish commit receipts at QoS 0, one message per response topic (chunked).

        QoS 0 is enough: a lost receipt only makes the agent resend the identical report,
        which de-duplication counts once and answers again. Receipts for a connection that
        has since dropped are sent on the new one; topics outside ``mqtt.receipt_prefix``
        never reach here (ingest checks them with ``protocol.receipts.valid_response_topic``).
        """
        writer = self._writer
        if writer is None or writer.is_closing():
            self._receipts_dropped += sum(len(v) for v in receipts.values())
            return
        packets: list[bytes] = []
        for topic, items in receipts.items():
            for start in range(0, len(items), _RECEIPTS_PER_MESSAGE):
                chunk = items[start : start + _RECEIPTS_PER_MESSAGE]
                packets.append(publish_packet(topic, encode_receipts(chunk), qos=0))
                self._receipts_sent += len(chunk)
        if packets:
            writer.write(b"".join(packets))
            self._last_tx = time.monotonic()

    def statistics(self) -> TransportStatistics:
        """A snapshot of the counters."""
        return TransportStatistics(
            connected=self._writer is not None and self._subscribed.is_set(),
            connects=self._connects,
            buffered=len(self._buffer),
            capacity=self.config.receive_maximum,
            unacked=max(self._unacked, 0),
            received=self._received,
            acked=self._acked,
            stale_acks=self._stale,
            dropped=self._dropped,
            protocol_errors=self._protocol_errors,
            over_receive_maximum=self._over_receive_maximum,
            receipts_sent=self._receipts_sent,
            receipts_dropped=self._receipts_dropped,
            broker=dict(self._broker),
        )

    async def wait_subscribed(self) -> None:
        """Return once a connection is up and the broker has granted the subscription."""
        await self._subscribed.wait()

    # -- connection side -----------------------------------------------------------------

    async def run(self) -> None:
        """Connect and keep connected, with capped, jittered exponential backoff.

        Raises:
            TransportError: the broker refused us in a way reconnecting cannot fix.
        """
        cfg = self.config
        retry = Retry(Backoff(initial=cfg.reconnect_min_s, cap=cfg.reconnect_max_s))
        while not self._closing:
            self._healthy = False
            try:
                await self._session()
            except MqttProtocolError as exc:
                # The broker broke the protocol or a limit we announced: say which, tell it
                # with a DISCONNECT reason code (MQTT 5 §3.14.2.1), and start a new connection.
                self._protocol_errors += 1
                if not self._closing:
                    log.warning(
                        "protocol error from the broker at %s:%d (reason 0x%02x): %s; reconnecting",
                        cfg.host,
                        cfg.port,
                        exc.reason,
                        exc,
                    )
                    self._disconnect_with(exc.reason)
            except (OSError, EOFError, TimeoutError, _ConnectionLostError) as exc:
                if not self._closing:
                    what = "lost" if self._writer is not None else "failed"
                    log.warning(
                        "broker connection to %s:%d %s: %s", cfg.host, cfg.port, what, exc or type(exc).__name__
                    )
            finally:
                await self._close()
            if self._closing:
                return
            if self._healthy:
                retry.reset()  # a session that worked: the next drop waits from reconnect_min_s again
            # Jitter keeps a fleet of collectors from reconnecting in lock step after a broker restart.
            await asyncio.sleep(retry.next_delay())

    async def close(self) -> None:
        """Disconnect politely (the session and its queue stay on the broker); :meth:`run` returns."""
        self._closing = True
        writer = self._writer
        if writer is not None and not writer.is_closing():
            with contextlib.suppress(OSError):
                writer.write(_DISCONNECT_NORMAL)
                await asyncio.wait_for(writer.drain(), 1.0)
        await self._close()

    def _disconnect_with(self, reason: int) -> None:
        writer = self._writer
        if writer is not None and not writer.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(bytes([DISCONNECT << 4, 2, reason, 0]))

    async def _close(self) -> None:
        writer, self._writer = self._writer, None
        self._subscribed.clear()
        # Tokens handed out on this connection are now stale: bump the generation.
        self._generation += 1
        self._unacked = 0
        self._credit.set()
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _session(self) -> bool:
        cfg = self.config
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(cfg.host, cfg.port, ssl=_tls_context(cfg), limit=1 << 20), _CONNECT_TIMEOUT
        )
        self._writer = writer
        writer.write(
            connect_packet(
                client_id=cfg.client_id,
                clean_start=False,
                keepalive=cfg.keepalive_s,
                session_expiry=cfg.session_expiry_s,
                receive_maximum=cfg.receive_maximum,
                max_packet_bytes=cfg.max_packet_bytes,
                username=cfg.username,
                password=self._password,
            )
        )
        await writer.drain()
        rest = b""
        deadline = time.monotonic() + _CONNECT_TIMEOUT
        while True:
            data = await asyncio.wait_for(reader.read(65536), max(0.01, deadline - time.monotonic()))
            if not data:
                raise _ConnectionLostError("closed before CONNACK")
            packets, rest = split_packets(rest + data)
            if packets:
                break
        first, body = packets[0]
        if first >> 4 != CONNACK:
            raise MqttProtocolError(f"expected CONNACK, got packet type {first >> 4}", reason=_PROTOCOL_ERROR)
        connack = _check_connack(body, version=5)
        self.session_present = connack.session_present
        # §3.2.2.3.14: the broker's Server Keep Alive replaces the value we asked for.
        self._keepalive_s = connack.server_keep_alive or cfg.keepalive_s
        self._connects += 1
        self._generation += 1
        self._unacked = 0
        now = time.monotonic()
        self._last_rx = self._last_tx = now
        # Subscribing again on a resumed session is harmless (it replaces the identical
        # subscription) and covers a session the broker has forgotten.
        writer.write(subscribe_packet(1, cfg.topic_filter, qos=1))
        writer.write(_sys_subscribe_packet())
        log.info(
            "connected to %s:%d as %s (session present: %s); subscribing to %s",
            cfg.host,
            cfg.port,
            cfg.client_id,
            self.session_present,
            cfg.topic_filter,
        )
        leftover = b"".join(_packet(f, b) for f, b in packets[1:]) + rest
        pinger = asyncio.create_task(self._keepalive(writer), name="mqtt-keepalive")
        try:
            await self._read_loop(reader, writer.transport, leftover)
        finally:
            pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pinger
        return True

    async def _keepalive(self, writer: asyncio.StreamWriter) -> None:
        interval = self._keepalive_s
        if interval <= 0:  # keep alive switched off by the broker (§3.1.2.10)
            return
        while True:
            await asyncio.sleep(interval / 4)
            now = time.monotonic()
            if now - self._last_tx >= interval / 2:
                writer.write(_PINGREQ)
                self._last_tx = now
            # Reading is paused while ingest catches up: silence then is ours, not the broker's.
            if not self._paused and now - self._last_rx > interval * 1.5:
                log.warning("no traffic from the broker for %.1f s; reconnecting", now - self._last_rx)
                writer.transport.abort()
                return

    async def _read_loop(self, reader: asyncio.StreamReader, transport: asyncio.BaseTransport, rest: bytes) -> None:
        limit = self.config.buffer_bytes
        cap = self.config.receive_maximum
        while True:
            if rest:
                rest = self._parse(rest)
            self._paused = True
            while self._buffered_bytes > limit:
                self._drained.clear()
                await self._drained.wait()
            while self._unacked >= cap:
                self._credit.clear()
                await self._credit.wait()
            self._paused = False
            data = await reader.read(1 << 18)
            if not data:
                raise _ConnectionLostError("closed by the broker")
            self._last_rx = time.monotonic()
            if (
                len(data) < _SHORT_READ
                and self._read_pause_s > 0
                and isinstance(transport, asyncio.ReadTransport)
                and not transport.is_closing()
            ):
                # We are keeping up: let the next messages gather in the socket, then take
                # them in one read and one pass of ingest (see READ_PAUSE_S).
                transport.pause_reading()
                await asyncio.sleep(self._read_pause_s)
                # Closed meanwhile: a closed TLS transport has no protocol left to resume (it
                # raises); the next read ends the session.
                if not transport.is_closing():
                    transport.resume_reading()
            # A packet is refused as soon as its header says it is larger than the Maximum
            # Packet Size we announced (MQTT 5 §3.1.2.11.4), before its body is buffered, so
            # the tail kept between reads stays below that size plus one read.
            rest = rest + data if rest else data

    def _parse(self, buf: bytes) -> bytes:  # noqa: PLR0912, PLR0915  the receive hot loop, inlined for speed (bench_collector)
        """Handle every complete packet in ``buf``; return the incomplete tail.

        Total on any bytes: a packet that is malformed, larger than our Maximum Packet Size,
        a QoS 1 PUBLISH beyond our Receive Maximum or with packet id 0 raises
        :class:`MqttProtocolError` (never ``IndexError``), and :meth:`run` reconnects.
        """
        out = self._buffer
        prefix = self._prefix
        gen = self._generation << 16
        cap = self.config.receive_maximum
        max_packet = self.config.max_packet_bytes
        n = len(buf)
        pos = 0
        received = 0
        qos1 = 0
        nbytes = 0
        unacked = self._unacked
        try:
            while n - pos >= 2:
                b0 = buf[pos]
                length = buf[pos + 1]
                start = pos + 2
                if length & 0x80:
                    header = decode_varint(buf, pos + 1)
                    if header is None:
                        break
                    length, start = header
                end = start + length
                if end - pos > max_packet:
                    raise MqttProtocolError(
                        f"a packet of {end - pos} bytes exceeds our Maximum Packet Size of {max_packet}",
                        reason=_PACKET_TOO_LARGE,
                    )
                if end > n:
                    break
                kind = b0 >> 4
                if kind == PUBLISH:
                    qos = (b0 >> 1) & 3
                    if start + 2 > end:
                        raise MqttProtocolError("PUBLISH shorter than its topic length")
                    topic_len = (buf[start] << 8) | buf[start + 1]
                    if not topic_len:
                        # We announce no Topic Alias Maximum, so a topic is required (§3.3.2.1).
                        raise MqttProtocolError("PUBLISH without a topic name", reason=_PROTOCOL_ERROR)
                    i = start + 2 + topic_len
                    if qos == 0 and buf[start + 2 : start + 7] == b"$SYS/":
                        self._broker_counter(buf[start + 2 : i], buf, i, end)
                        pos = end
                        continue
                    if qos == 1:
                        if i + 2 > end:
                            raise MqttProtocolError("PUBLISH ends inside its topic or packet id")
                        pid = (buf[i] << 8) | buf[i + 1]
                        if not pid:
                            raise MqttProtocolError("QoS 1 PUBLISH with packet id 0", reason=_PROTOCOL_ERROR)
                        if unacked + qos1 >= cap:
                            # Mosquitto 2.0.11 sends a few beyond our Receive Maximum (MQTT 5
                            # §4.9) once acknowledgements flow, so this is counted, not fatal;
                            # memory stays bounded because _read_loop stops reading the socket
                            # while Receive Maximum messages await acknowledgement.
                            self._over_receive_maximum += 1
                        token = gen | pid
                        i += 2
                        qos1 += 1
                    elif qos == 0:
                        token = NO_ACK
                    else:
                        raise MqttProtocolError(
                            f"PUBLISH with QoS {qos} on a QoS 1 subscription", reason=_PROTOCOL_ERROR
                        )
                    if i >= end:
                        raise MqttProtocolError("PUBLISH ends before its properties")
                    reply_to = correlation = None
                    if buf[i]:
                        # Only a receipt request carries properties; the common case skips this.
                        props, i = parse_properties(buf, i, end)
                        topic, data = props.get(RESPONSE_TOPIC), props.get(CORRELATION_DATA)
                        if isinstance(topic, bytes) and isinstance(data, bytes):
                            reply_to, correlation = topic, data
                    else:
                        i += 1
                    sender = self._sender(buf[start + 2 : start + 2 + topic_len]) if prefix is not None else b""
                    received += 1
                    if token == NO_ACK and len(out) >= cap:
                        self._dropped += 1
                    else:
                        payload = buf[i:end]
                        nbytes += end - i
                        out.append(Delivery(payload, token, reply_to, correlation, sender))
                elif kind == SUBACK:
                    self._handle_suback(buf[start:end])
                elif kind == PINGRESP:
                    pass
                elif kind == DISCONNECT:
                    reason = buf[start] if end > start else 0
                    raise _ConnectionLostError(f"the broker sent DISCONNECT (reason code 0x{reason:02x})")
                else:
                    raise MqttProtocolError(f"unexpected packet type {kind} from the broker", reason=_PROTOCOL_ERROR)
                pos = end
        finally:
            # What was parsed before an error is handed on: those messages are well formed,
            # and their acknowledgements are simply dropped as stale after the reconnect.
            if received:
                self._received += received
                self._unacked += qos1
                self._buffered_bytes += nbytes
                self._ready.set()
        return buf[pos:] if pos else buf

    def _sender(self, topic: bytes) -> bytes:
        """The identity levels of ``<prefix><identity>/<use_case>``; empty when there are none."""
        prefix = self._prefix
        assert prefix is not None
        if not topic.startswith(prefix):
            return b""
        identity, _, _ = topic[len(prefix) :].rpartition(b"/")
        return identity

    def _broker_counter(self, topic: bytes, buf: bytes, i: int, end: int) -> None:
        """Keep the value of a ``$SYS`` counter (a QoS 0 PUBLISH: properties, then ASCII digits)."""
        if i >= end:
            raise MqttProtocolError("PUBLISH ends before its properties")
        _, i = parse_properties(buf, i, end)
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            self._broker[topic.decode()] = float(buf[i:end].decode("ascii"))

    def _handle_suback(self, body: bytes) -> None:
        if len(body) < 3:
            raise MqttProtocolError("SUBACK too short")
        _, i = parse_properties(body, 2, len(body))
        codes = body[i:]
        if (body[0] << 8 | body[1]) == _SYS_PACKET_ID:
            if any(c >= 0x80 for c in codes):
                log.warning("the broker refused its $SYS counters (reason codes %s): no broker metrics", codes.hex())
            return
        if len(codes) != 1:
            raise MqttProtocolError(f"SUBACK carries {len(codes)} reason codes for one filter")
        code = codes[0]
        if code == 1:
            self._subscribed.set()
            self._healthy = True
            return
        if code == 0:
            raise TransportError(
                f"the broker granted {self.config.topic_filter!r} only at QoS 0; "
                "acknowledgement after commit needs QoS 1"
            )
        raise TransportError(
            f"the broker refused the subscription to {self.config.topic_filter!r} (reason code 0x{code:02x})"
        )
