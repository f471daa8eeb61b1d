"""The collector's MQTT 5 subscriber as a protocol core without I/O: bytes in, deliveries and events out.

:class:`SubscriberCodec` holds everything the subscriber protocol knows about a session and
nothing about sockets, tasks or clocks: the caller
(:mod:`collector.mqtt.transport`) sends the bytes that :meth:`~SubscriberCodec.connect`,
:meth:`~SubscriberCodec.subscribe` and :meth:`~SubscriberCodec.acknowledge` return, passes
every read to :meth:`~SubscriberCodec.receive_data`, acts on each :data:`Event` that
:meth:`~SubscriberCodec.next_event` returns, and hands the buffered deliveries to ingest with
:meth:`~SubscriberCodec.take`. So the protocol is tested, and fuzzed, by calling methods
with bytes; only the transport knows about the network.

What the codec enforces (docs/mqtt-client.md, "What the client enforces"):

* **Total on any bytes**: parsing either yields deliveries and events or raises
  :class:`MqttProtocolError` carrying the DISCONNECT reason code to send; nothing else
  escapes. Deliveries parsed before the bad packet stay buffered: they are well formed, and
  their acknowledgements are simply dropped as stale after the reconnect.
* **Maximum Packet Size before buffering**: a packet whose fixed header declares more than
  ``max_packet_bytes`` is refused from the header (0x95), so the tail kept between reads
  never exceeds that size.
* **Receive Maximum accounted**: :attr:`~SubscriberCodec.in_flight` counts QoS 1 messages
  not yet acknowledged; the transport stops reading while it reaches ``receive_maximum``. A
  broker that overruns it is counted (``over_receive_maximum``), not refused: Mosquitto
  2.0.11 does so by a few messages once acknowledgements flow (MQTT 5 §4.9).
* **QoS 0 cannot flood the buffer**: a QoS 0 message that finds ``receive_maximum``
  deliveries buffered is dropped and counted.
* **Tokens name a connection**: a delivery's token is ``(connection generation << 8 |
  route) << 16 | packet id``; a token of an earlier connection is never acknowledged on a
  later one, where its packet id may already name another message. The route names the
  broker among several a collector subscribes to (``collector.transport.route_of``), so one
  list of tokens can be split back to the connections that delivered them.
* **Metadata stripped**: a :class:`~collector.transport.Delivery` carries only the payload,
  the sender's identity (the topic levels between the subscription's prefix and the use
  case) and a receipt request; the rest of the topic, the flags and other properties end here.
"""

from __future__ import annotations

import collections
import contextlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from collector.mqtt.packets import (
    CONNACK,
    CORRELATION_DATA,
    COUNTERS_PACKET_ID,
    DISCONNECT,
    PACKET_TOO_LARGE,
    PINGRESP,
    PROTOCOL_ERROR,
    PUBLISH,
    REPORTS_PACKET_ID,
    RESPONSE_TOPIC,
    SUBACK,
    MqttProtocolError,
    connect_packet,
    counters_subscribe_packet,
    decode_connack,
    decode_varint,
    parse_properties,
    permanent_refusal,
    subscribe_packet,
)
from collector.transport import MAX_ROUTES, NO_ACK, Delivery

__all__ = [
    "BrokerCounter",
    "CodecStatistics",
    "Connected",
    "ConnectionRefused",
    "CountersRefused",
    "Disconnected",
    "Event",
    "MqttProtocolError",
    "Subscribed",
    "SubscriberCodec",
    "SubscriptionRefused",
]


@dataclass(frozen=True, slots=True)
class Connected:
    """The broker accepted the connection (CONNACK with reason 0).

    Attributes:
        session_present: the broker resumed our session (its subscription and queue).
        server_keep_alive: the broker's Server Keep Alive, which replaces ours (§3.2.2.3.14).
    """

    session_present: bool
    server_keep_alive: int | None


@dataclass(frozen=True, slots=True)
class ConnectionRefused:
    """The broker refused the connection (CONNACK with a reason code); the connection is over.

    Attributes:
        reason: the CONNACK reason code (§3.2.2.2).
        permanent_cause: what the refusal means when retrying cannot fix it (bad
            credentials, ...); None when it may pass (server busy, ...).
    """

    reason: int
    permanent_cause: str | None


@dataclass(frozen=True, slots=True)
class Subscribed:
    """The broker granted the reports' subscription at QoS 1."""


@dataclass(frozen=True, slots=True)
class SubscriptionRefused:
    """The broker granted the reports' subscription only at QoS 0 (reason 0) or refused it; the connection is over.

    Attributes:
        reason: the SUBACK reason code.
    """

    reason: int


@dataclass(frozen=True, slots=True)
class CountersRefused:
    """The broker refused the subscription to its ``$SYS`` counters (a log line, nothing more).

    Attributes:
        reasons: the SUBACK reason codes, one per counter.
    """

    reasons: bytes


@dataclass(frozen=True, slots=True)
class BrokerCounter:
    """A new value of one of the broker's ``$SYS`` counters (:data:`~collector.mqtt.packets.BROKER_COUNTERS`)."""

    topic: str
    value: float


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The broker sent DISCONNECT; the connection is over.

    Attributes:
        reason: its reason code (0 when it carried none).
    """

    reason: int


Event = (
    Connected | ConnectionRefused | Subscribed | SubscriptionRefused | CountersRefused | BrokerCounter | Disconnected
)
"""What :meth:`SubscriberCodec.next_event` reports besides deliveries."""


@dataclass(frozen=True, slots=True)
class CodecStatistics:
    """A snapshot of a codec's counters (totals over every connection).

    Attributes:
        received: PUBLISH packets to the reports' subscription, QoS 0 ones dropped included.
        acked: PUBACKs returned by :meth:`SubscriberCodec.acknowledge`.
        stale_acks: tokens not acknowledged because their connection had ended.
        dropped: QoS 0 messages dropped because ``receive_maximum`` deliveries were buffered.
        over_receive_maximum: QoS 1 messages received while ``receive_maximum`` already
            awaited acknowledgement.
    """

    received: int
    acked: int
    stale_acks: int
    dropped: int
    over_receive_maximum: int


_CLOSED, _AWAITING_CONNACK, _OPEN = range(3)


class SubscriberCodec:
    """The subscriber side of a persistent MQTT 5 session, across its connections, without I/O.

    One codec lives as long as the transport: deliveries buffered on one connection stay
    buffered for ingest after it drops (their tokens go stale), and the counters are totals.
    Each connection begins with :meth:`connect` and ends with :meth:`connection_lost`.

    Args:
        receive_maximum: the Receive Maximum announced in CONNECT (§3.1.2.11.3).
        max_packet_bytes: the Maximum Packet Size announced in CONNECT (§3.1.2.11.4).
        topic_prefix: the reports' topic without its trailing ``#`` (``b"ldp/v1/reports/"``):
            the levels after it, up to the last one (the use case), are the sender's
            identity. None: deliveries carry no sender.
        route: the broker's index among those the collector subscribes to, carried in every
            delivery and token.
    """

    def __init__(
        self, *, receive_maximum: int, max_packet_bytes: int, topic_prefix: bytes | None = None, route: int = 0
    ) -> None:
        if not 0 <= route < MAX_ROUTES:
            raise ValueError(f"route must be in [0, {MAX_ROUTES - 1}]; got {route}")
        if not 1 <= receive_maximum <= 65535:
            raise ValueError(f"receive_maximum must be in [1, 65535]; got {receive_maximum}")
        if max_packet_bytes < 2:
            raise ValueError(f"max_packet_bytes must be at least 2; got {max_packet_bytes}")
        self.receive_maximum = receive_maximum
        self.max_packet_bytes = max_packet_bytes
        self._prefix = topic_prefix
        self.route = route
        self._state = _CLOSED
        self._buf = b""
        self._pos = 0  # where the unparsed bytes of _buf begin
        self._generation = 0
        self._in_flight = 0
        self._queue: collections.deque[Delivery] = collections.deque()
        self._buffered_bytes = 0
        self._received = 0
        self._acked = 0
        self._stale = 0
        self._dropped = 0
        self._over_receive_maximum = 0

    # -- connection ------------------------------------------------------------------------

    def connect(
        self,
        *,
        client_id: str,
        keepalive: int,
        session_expiry: int,
        username: str | None = None,
        password: bytes | None = None,
    ) -> bytes:
        """Begin a connection: the CONNECT packet to send first (Clean Start 0, a persistent session).

        From now on the tokens of earlier connections are stale, and the first packet the
        broker sends must be CONNACK.
        """
        self._new_generation()
        self._state = _AWAITING_CONNACK
        return connect_packet(
            client_id=client_id,
            clean_start=False,
            keepalive=keepalive,
            session_expiry=session_expiry,
            receive_maximum=self.receive_maximum,
            max_packet_bytes=self.max_packet_bytes,
            username=username,
            password=password,
        )

    def subscribe(self, topic_filter: str) -> bytes:
        """The SUBSCRIBE packets: ``topic_filter`` at QoS 1, then the broker's counters at QoS 0.

        Subscribing again on a resumed session is harmless (it replaces the identical
        subscription) and covers a session the broker has forgotten.
        """
        return subscribe_packet(REPORTS_PACKET_ID, topic_filter, qos=1) + counters_subscribe_packet()

    def connection_lost(self) -> None:
        """The connection ended: its partial packet is gone and its tokens are stale."""
        self._end()
        self._new_generation()

    def _new_generation(self) -> None:
        self._generation += 1
        self._buf = b""
        self._pos = 0
        self._in_flight = 0

    @property
    def _connection_key(self) -> int:
        """What every token of the current connection holds above its packet id."""
        return (self._generation << 8) | self.route

    @property
    def connected(self) -> bool:
        """Whether the broker has accepted the current connection and it has not ended."""
        return self._state == _OPEN

    # -- receiving -------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Add the bytes of one read; :meth:`next_event` parses them.

        Bytes after the connection ended (a terminal event, a protocol error) or before
        :meth:`connect` are ignored.
        """
        if self._state == _CLOSED or not data:
            return
        if self._pos:
            self._buf = self._buf[self._pos :]
            self._pos = 0
        self._buf = self._buf + data if self._buf else data

    def next_event(self) -> Event | None:
        """Parse buffered packets up to the next event; None once every complete packet is handled.

        Deliveries parsed on the way are buffered for :meth:`take`. Call it until it returns
        None after each :meth:`receive_data`: the events come one at a time so the caller
        can act on each before the packets after it are parsed (send SUBSCRIBE after
        :class:`Connected`, say). A :class:`Disconnected`, :class:`ConnectionRefused` or
        :class:`SubscriptionRefused` ends the connection.

        Raises:
            MqttProtocolError: the bytes are not valid MQTT, or break a limit we announced;
                the connection is over (send DISCONNECT with its reason, then close).
        """
        if self._state == _CLOSED:
            return None
        try:
            event = self._connack() if self._state == _AWAITING_CONNACK else self._parse()
        except MqttProtocolError:
            self._end()
            raise
        if isinstance(event, Disconnected | ConnectionRefused | SubscriptionRefused):
            self._end()
        return event

    def _end(self) -> None:
        self._state = _CLOSED
        self._buf = b""
        self._pos = 0

    def _connack(self) -> Connected | ConnectionRefused | None:
        """The CONNACK that must come first, or None while it is incomplete."""
        buf = self._buf
        header = decode_varint(buf, 1) if len(buf) >= 2 else None
        if header is None:
            return None
        length, start = header
        end = start + length
        if end > self.max_packet_bytes:
            raise _too_large(end, self.max_packet_bytes)
        if end > len(buf):
            return None
        if buf[0] >> 4 != CONNACK:
            raise MqttProtocolError(f"expected CONNACK, got packet type {buf[0] >> 4}", reason=PROTOCOL_ERROR)
        connack = decode_connack(buf[start:end])
        if connack.reason:
            return ConnectionRefused(connack.reason, permanent_refusal(connack.reason))
        self._state = _OPEN
        self._pos = end
        return Connected(connack.session_present, connack.server_keep_alive)

    def _parse(self) -> Event | None:  # noqa: PLR0912, PLR0915  the receive hot loop, inlined for speed (bench_collector)
        """Handle complete packets up to the first event; the event, or None at the tail.

        Runs once per message received: one loop, its state in locals (docs/mqtt-client.md
        measures it per packet); only rare packets leave it for a function.
        """
        buf, pos, out, prefix, cap = self._buf, self._pos, self._queue, self._prefix, self.receive_maximum
        n, gen, max_packet, unacked = len(buf), self._connection_key << 16, self.max_packet_bytes, self._in_flight
        route = self.route
        received = qos1 = nbytes = 0
        event: Event | None = None
        try:
            while n - pos >= 2:
                b0 = buf[pos]
                length = buf[pos + 1]
                start = pos + 2
                if length & 0x80:
                    if n - pos > 2 and buf[pos + 2] < 0x80:  # two bytes: most reports (128 B to 16 KiB)
                        length, start = (length & 0x7F) | (buf[pos + 2] << 7), pos + 3
                    elif (header := decode_varint(buf, pos + 1)) is not None:
                        length, start = header
                    else:
                        break
                end = start + length
                if end - pos > max_packet:
                    raise _too_large(end - pos, max_packet)
                if end > n:
                    break
                if b0 >> 4 != PUBLISH:
                    pos = end
                    event = _control(b0 >> 4, buf[start:end])
                    if event is not None:
                        break
                    continue
                qos = (b0 >> 1) & 3
                if start + 2 > end or not (topic_len := (buf[start] << 8) | buf[start + 1]):
                    raise _no_topic(start, end)
                i = start + 2 + topic_len
                if qos == 0 and buf[start + 2 : start + 7] == b"$SYS/":
                    pos = end
                    event = _broker_counter(buf[start + 2 : i], buf, i, end)
                    if event is not None:
                        break
                    continue
                if qos == 1:
                    if i + 2 > end or not (pid := (buf[i] << 8) | buf[i + 1]):
                        raise _no_packet_id(i, end)
                    if unacked + qos1 >= cap:
                        self._over_receive_maximum += 1  # counted, not fatal (module docstring)
                    token = gen | pid
                    i += 2
                    qos1 += 1
                elif qos == 0:
                    token = NO_ACK
                else:
                    raise MqttProtocolError(f"PUBLISH with QoS {qos} on a QoS 1 subscription", reason=PROTOCOL_ERROR)
                if i >= end:
                    raise MqttProtocolError("PUBLISH ends before its properties")
                reply_to = correlation = None
                if buf[i]:
                    # Only a receipt request carries properties; the common case skips this.
                    reply_to, correlation, i = _receipt_request(buf, i, end)
                else:
                    i += 1
                sender = _sender(prefix, buf, start + 2, start + 2 + topic_len) if prefix is not None else b""
                received += 1
                if token == NO_ACK and len(out) >= cap:
                    self._dropped += 1
                else:
                    nbytes += end - i
                    out.append(Delivery(buf[i:end], token, reply_to, correlation, sender, route))
                pos = end
        finally:
            # What was parsed before an error stays buffered (module docstring).
            self._pos = pos
            if received:
                self._received += received
                self._in_flight += qos1
                self._buffered_bytes += nbytes
        return event

    # -- handing on and acknowledging ------------------------------------------------------

    def take(self, max_count: int) -> list[Delivery]:
        """Remove and return up to ``max_count`` buffered deliveries, oldest first."""
        queue = self._queue
        out = [queue.popleft() for _ in range(min(max_count, len(queue)))]
        self._buffered_bytes -= sum(len(d.payload) for d in out)
        return out

    def acknowledge(self, tokens: Sequence[int]) -> bytes:
        """The PUBACKs (in one string of bytes) for every token of the current connection.

        Tokens of earlier connections are counted stale and left out: the broker redelivers
        those messages, and the report-id table absorbs the repeat. ``NO_ACK`` is skipped.
        """
        current = self._connection_key
        pids = [t & 0xFFFF for t in tokens if t != NO_ACK and t >> 16 == current]
        self._stale += sum(1 for t in tokens if t != NO_ACK) - len(pids)
        if not pids:
            return b""
        self._acked += len(pids)
        self._in_flight -= len(pids)
        # PUBACK with reason Success and no properties is 0x40 0x02 <packet id> (§3.4.2.1).
        return struct.pack(f">{len(pids)}I", *(0x40020000 | p for p in pids))

    def drop_acks(self, tokens: Sequence[int]) -> None:
        """Count ``tokens`` stale without acknowledging them: no connection can carry their PUBACKs."""
        self._stale += sum(1 for t in tokens if t != NO_ACK)

    # -- state -----------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Deliveries waiting for :meth:`take`."""
        return len(self._queue)

    @property
    def buffered_bytes(self) -> int:
        """Payload bytes of the deliveries waiting for :meth:`take`."""
        return self._buffered_bytes

    @property
    def in_flight(self) -> int:
        """QoS 1 messages of this connection received and not yet acknowledged."""
        return self._in_flight

    @property
    def has_credit(self) -> bool:
        """Whether fewer than ``receive_maximum`` QoS 1 messages await acknowledgement."""
        return self._in_flight < self.receive_maximum

    @property
    def pending_bytes(self) -> int:
        """Bytes received and not yet parsed (at most an incomplete packet once :meth:`next_event` returned None)."""
        return len(self._buf) - self._pos

    def statistics(self) -> CodecStatistics:
        """A snapshot of the counters."""
        return CodecStatistics(
            received=self._received,
            acked=self._acked,
            stale_acks=self._stale,
            dropped=self._dropped,
            over_receive_maximum=self._over_receive_maximum,
        )


def _no_topic(start: int, end: int) -> MqttProtocolError:
    if start + 2 > end:
        return MqttProtocolError("PUBLISH shorter than its topic length")
    # We announce no Topic Alias Maximum, so a topic is required (§3.3.2.1).
    return MqttProtocolError("PUBLISH without a topic name", reason=PROTOCOL_ERROR)


def _no_packet_id(i: int, end: int) -> MqttProtocolError:
    if i + 2 > end:
        return MqttProtocolError("PUBLISH ends inside its topic or packet id")
    return MqttProtocolError("QoS 1 PUBLISH with packet id 0", reason=PROTOCOL_ERROR)


def _too_large(size: int, max_packet: int) -> MqttProtocolError:
    return MqttProtocolError(
        f"a packet of {size} bytes exceeds our Maximum Packet Size of {max_packet}", reason=PACKET_TOO_LARGE
    )


def _control(kind: int, body: bytes) -> Event | None:
    """What a packet other than PUBLISH says (SUBACK, PINGRESP, DISCONNECT); any other is a protocol error."""
    if kind == SUBACK:
        return _suback(body)
    if kind == PINGRESP:
        return None
    if kind == DISCONNECT:
        return Disconnected(body[0] if body else 0)
    raise MqttProtocolError(f"unexpected packet type {kind} from the broker", reason=PROTOCOL_ERROR)


def _receipt_request(buf: bytes, i: int, end: int) -> tuple[bytes | None, bytes | None, int]:
    """Response Topic and Correlation Data in the properties at ``i`` (None without both); where the payload starts.

    A receipt request as agents write it (a one-byte property length, then exactly a Response
    Topic and a Correlation Data) is read by hand: it comes with every report, and the
    general parser costs several times as much. Any other block, or one this reading does
    not account for to the byte, goes to :func:`parse_properties`, which then also names
    its fault.
    """
    length = buf[i]
    stop = i + 1 + length
    if length < 0x80 and i + 4 <= stop <= end and buf[i + 1] == RESPONSE_TOPIC:
        topic_end = i + 4 + ((buf[i + 2] << 8) | buf[i + 3])
        if topic_end + 3 <= stop and buf[topic_end] == CORRELATION_DATA:
            data_end = topic_end + 3 + ((buf[topic_end + 1] << 8) | buf[topic_end + 2])
            if data_end == stop:
                return buf[i + 4 : topic_end], buf[topic_end + 3 : data_end], stop
    props, i = parse_properties(buf, i, end)
    topic, data = props.get(RESPONSE_TOPIC), props.get(CORRELATION_DATA)
    if isinstance(topic, bytes) and isinstance(data, bytes):
        return topic, data, i
    return None, None, i


def _sender(prefix: bytes, buf: bytes, start: int, end: int) -> bytes:
    """The identity levels of the topic ``buf[start:end]``, ``<prefix><identity>/<use_case>``;
    empty when there are none. Read in place: one slice per message, the identity's."""
    if not buf.startswith(prefix, start, end):
        return b""
    begin = start + len(prefix)
    last = buf.rfind(b"/", begin, end)
    return buf[begin:last] if last >= 0 else b""


def _broker_counter(topic: bytes, buf: bytes, i: int, end: int) -> BrokerCounter | None:
    """The value of a ``$SYS`` counter (a QoS 0 PUBLISH: properties, then ASCII digits); None if not a number."""
    if i >= end:
        raise MqttProtocolError("PUBLISH ends before its properties")
    _, i = parse_properties(buf, i, end)
    with contextlib.suppress(ValueError):  # UnicodeDecodeError is a ValueError
        return BrokerCounter(topic.decode(), float(buf[i:end].decode("ascii")))
    return None


def _suback(body: bytes) -> Subscribed | SubscriptionRefused | CountersRefused | None:
    """What a SUBACK says about one of our two subscriptions (:meth:`SubscriberCodec.subscribe`)."""
    if len(body) < 3:
        raise MqttProtocolError("SUBACK too short")
    _, i = parse_properties(body, 2, len(body))
    codes = body[i:]
    if (body[0] << 8 | body[1]) == COUNTERS_PACKET_ID:
        return CountersRefused(codes) if any(c >= 0x80 for c in codes) else None
    if len(codes) != 1:
        raise MqttProtocolError(f"SUBACK carries {len(codes)} reason codes for one filter")
    return Subscribed() if codes[0] == 1 else SubscriptionRefused(codes[0])
