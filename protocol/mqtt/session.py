"""One MQTT client's protocol without I/O, in either role: bytes in, deliveries and events out; packets out.

A :class:`Session` holds everything the protocol knows about a client's connections to a
broker and nothing about sockets, tasks or clocks. Its caller (the collector's subscriber
``collector.mqtt.transport``, the fleet's ``fleet.scale_publisher``, the tests' publisher)
writes the bytes that :meth:`~Session.connect`, :meth:`~Session.subscribe`,
:meth:`~Session.publish`, :meth:`~Session.acknowledge`, :meth:`~Session.ping` and
:meth:`~Session.disconnect` return, passes every read to :meth:`~Session.receive_data`, acts
on each event :meth:`~Session.next_event` returns, and takes the PUBLISHes and PUBACKs read
with :meth:`~Session.take_deliveries` and :meth:`~Session.take_acknowledgements`. So the
protocol is tested, and fuzzed, by calling methods with bytes.

The session plays one of two roles (:class:`~protocol.mqtt.states.Role`), and what it allows
in each state is the one table :data:`~protocol.mqtt.states.TRANSITIONS`. Flow control is its
caller's: the session counts what is in flight each way and says so (:attr:`Session.in_flight`,
:attr:`Session.has_credit`, :attr:`Session.outstanding`), but never buffers, waits or drops
a message to honour a limit; when to read, how many PUBLISHes to keep in flight and what to
do with deliveries nobody takes yet are decided by the caller.

What the session enforces (docs/mqtt-client.md, "What the client enforces"):

* **Total on any bytes**: parsing either yields deliveries, acknowledgements and events or
  raises :class:`~protocol.mqtt.packets.MqttProtocolError` carrying the DISCONNECT reason
  code to send; nothing else escapes. What was parsed before the bad packet stays to be taken.
* **The table**: a packet the broker must not send in the session's role and state (a
  CONNACK twice, a PUBACK to a subscriber, a QoS 1 PUBLISH to a publisher) is a protocol
  error (0x82), and so is an answer to a packet id that awaits none.
* **Maximum Packet Size before buffering**: a packet whose fixed header declares more than
  the ``max_packet_bytes`` announced in CONNECT is refused from the header (0x95), so the
  tail kept between reads never exceeds that size.
* **Receive Maximum counted**: QoS 1 PUBLISHes read while ``receive_maximum`` already await
  acknowledgement are counted (``over_receive_maximum``), not refused: Mosquitto 2.0.11
  overruns it by a few once acknowledgements flow (MQTT 5 §4.9).
* **Tokens name a connection** (:mod:`protocol.mqtt.events`): a token of an earlier
  connection is never acknowledged on a later one.
* **Metadata stripped**: a :class:`~protocol.mqtt.events.Delivery` carries only the payload,
  the sender's levels of the topic and a request for an answer; the rest of the topic, the
  flags and every other property end here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from protocol.mqtt.events import (
    MAX_TAGS,
    Acknowledged,
    BrokerMessage,
    Connected,
    ConnectionRefused,
    Delivery,
    Disconnected,
    Event,
    SessionStatistics,
    Subscribed,
)
from protocol.mqtt.packets import (
    CONNACK,
    CORRELATION_DATA,
    DISCONNECT,
    DISCONNECT_PACKET,
    PINGREQ_PACKET,
    PINGRESP,
    PUBACK,
    PUBLISH,
    RESPONSE_TOPIC,
    SUBACK,
    MqttProtocolError,
    acknowledgements,
    connect_packet,
    decode_connack,
    decode_varint,
    disconnect_packet,
    frame_publish,
    parse_properties,
    subscribe_packet,
)
from protocol.mqtt.reasons import NORMAL, PACKET_TOO_LARGE, PROTOCOL_ERROR, permanent_refusal
from protocol.mqtt.states import TRANSITIONS, MqttUsageError, Role, State, Step

__all__ = ["PROTOCOL_MAX_PACKET", "Session"]

PROTOCOL_MAX_PACKET = 268_435_460
"""The largest packet MQTT can frame: a 256 MiB remaining length and its five-byte header."""

_CLOSED, _CONNECTING, _OPEN = State.CLOSED, State.CONNECTING, State.OPEN
_PUBACK = PUBACK << 4
_acknowledged = tuple.__new__
"""Makes an :class:`Acknowledged` from a tuple without the named tuple's own ``__new__``, a
Python function: the receive loop makes one per PUBACK."""


class Session:
    """One client's side of its connections to a broker, one after another, in one role, without I/O.

    One session lives as long as its caller's client: deliveries read on one connection may
    be acknowledged after it dropped (their tokens are then stale, and counted), and the
    counters are totals. Each connection begins with :meth:`connect` and ends with a
    terminal event, a protocol error, :meth:`disconnect` or :meth:`connection_lost`.

    Args:
        our_role: publisher or subscriber (:data:`~protocol.mqtt.states.TRANSITIONS`).
        version: 5 (MQTT 5), or 4 (MQTT 3.1.1: a publisher only, without properties).
        receive_maximum: the Receive Maximum announced in CONNECT (§3.1.2.11.3); None
            announces none (the broker may then send 65,535).
        max_packet_bytes: the Maximum Packet Size announced in CONNECT (§3.1.2.11.4); None
            announces none.
        topic_prefix: a topic prefix whose following levels, up to the last, are a
            delivery's ``sender`` (``b"ldp/v1/reports/"``); None: deliveries carry none.
        tag: the caller's name for this session among several (0 to 255), kept in its tokens.
    """

    def __init__(
        self,
        our_role: Role,
        *,
        version: int = 5,
        receive_maximum: int | None = None,
        max_packet_bytes: int | None = None,
        topic_prefix: bytes | None = None,
        tag: int = 0,
    ) -> None:
        if version not in (4, 5) or (version == 4 and our_role is not Role.PUBLISHER):
            raise ValueError(f"version must be 5, or 4 for a publisher; got {version} for a {our_role.value}")
        if not 0 <= tag < MAX_TAGS:
            raise ValueError(f"tag must be in [0, {MAX_TAGS - 1}]; got {tag}")
        if receive_maximum is not None and not 1 <= receive_maximum <= 65535:
            raise ValueError(f"receive_maximum must be in [1, 65535]; got {receive_maximum}")
        if max_packet_bytes is not None and not 2 <= max_packet_bytes <= PROTOCOL_MAX_PACKET:
            raise ValueError(f"max_packet_bytes must be in [2, {PROTOCOL_MAX_PACKET}]; got {max_packet_bytes}")
        self.our_role = our_role
        self.version = version
        self.tag = tag
        self._announced = (receive_maximum, max_packet_bytes)
        self.receive_maximum = 65535 if receive_maximum is None else receive_maximum
        self.max_packet_bytes = PROTOCOL_MAX_PACKET if max_packet_bytes is None else max_packet_bytes
        self._prefix = topic_prefix
        table = TRANSITIONS[our_role]
        self._table = table
        # The table by state, and what the hot paths (a PUBLISH sent, a PUBLISH or a PUBACK read,
        # once per message) may do in the current state: flags derived from the table whenever
        # the state changes (_enter), so that they ask no dict per message.
        self._steps = {
            state: {step: following for (at, step), following in table.items() if at is state} for state in State
        }
        self._sends_qos0 = self._sends_qos1 = self._reads_pubacks = False
        self._max_read_qos = -1
        self._state = _CLOSED
        self._enter(_CLOSED)
        self._buf = b""
        self._pos = 0  # where the unparsed bytes of _buf begin
        self._connection = 0
        self._in_flight = 0
        self._outgoing: set[int] = set()  # QoS 1 PUBLISHes sent, awaiting PUBACK
        self._subscribing: dict[int, int] = {}  # SUBSCRIBE packet id -> its number of filters
        self._deliveries: list[Delivery] = []
        self._acks: list[Acknowledged] = []
        self._received = 0
        self._acked = 0
        self._stale = 0
        self._over_receive_maximum = 0

    # -- the table -------------------------------------------------------------------------

    @property
    def state(self) -> State:
        """Where the current connection stands."""
        return self._state

    @property
    def connected(self) -> bool:
        """Whether the broker has accepted the current connection and it has not ended."""
        return self._state is _OPEN

    def _enter(self, state: State) -> None:
        """Move to ``state``, and derive from the table what the hot paths may do there."""
        self._state = state
        steps = self._steps[state]
        self._sends_qos0 = Step.SEND_PUBLISH_QOS0 in steps
        self._sends_qos1 = Step.SEND_PUBLISH_QOS1 in steps
        self._reads_pubacks = Step.READ_PUBACK in steps
        self._max_read_qos = 1 if Step.READ_PUBLISH_QOS1 in steps else 0 if Step.READ_PUBLISH_QOS0 in steps else -1

    def _send(self, step: Step, detail: str = "") -> None:
        """Move by a packet the caller sends; refuse one the table does not allow."""
        following = self._steps[self._state].get(step)
        if following is None:
            raise MqttUsageError(self.our_role, self._state, step, detail)
        self._enter(following)

    def _read(self, step: Step, kind: int) -> None:
        """Move by a packet the broker sent; a protocol error when the table does not allow it."""
        following = self._steps[self._state].get(step)
        if following is None:
            raise MqttProtocolError(f"unexpected packet type {kind} from the broker", reason=PROTOCOL_ERROR)
        self._enter(following)

    # -- connection ------------------------------------------------------------------------

    def connect(
        self,
        *,
        client_id: str,
        clean_start: bool,
        keepalive: int,
        session_expiry: int = 0,
        username: str | None = None,
        password: bytes | None = None,
    ) -> bytes:
        """Begin a connection: the CONNECT packet to send first.

        From now on the tokens of earlier connections are stale, and the first packet the
        broker sends must be CONNACK.

        Raises:
            MqttUsageError: the previous connection has not ended.
        """
        self._send(Step.SEND_CONNECT)
        self._new_connection()
        receive_maximum, max_packet_bytes = self._announced
        return connect_packet(
            client_id=client_id,
            clean_start=clean_start,
            keepalive=keepalive,
            version=self.version,
            session_expiry=session_expiry,
            receive_maximum=receive_maximum,
            max_packet_bytes=max_packet_bytes,
            username=username,
            password=password,
        )

    def disconnect(self, reason: int = NORMAL) -> bytes:
        """End the connection politely: the DISCONNECT packet to send before closing.

        Raises:
            MqttUsageError: no connection is open or being opened.
        """
        self._send(Step.SEND_DISCONNECT)
        self._end()
        return DISCONNECT_PACKET if reason == NORMAL else disconnect_packet(reason)

    def connection_lost(self) -> None:
        """The connection ended: its partial packet is gone and its tokens are stale."""
        self._enter(self._steps[self._state][Step.LOST])
        self._end()
        self._new_connection()

    def _new_connection(self) -> None:
        self._connection += 1
        self._buf = b""
        self._pos = 0
        self._in_flight = 0
        self._outgoing.clear()
        self._subscribing.clear()

    def _end(self) -> None:
        self._enter(_CLOSED)
        self._buf = b""
        self._pos = 0

    @property
    def _key(self) -> int:
        """What every token of the current connection holds above its packet id."""
        return (self._connection << 8) | self.tag

    # -- sending ---------------------------------------------------------------------------

    def subscribe(self, packet_id: int, filters: Sequence[tuple[str, int]]) -> bytes:
        """A SUBSCRIBE for ``filters`` (topic filter, maximum QoS), answered by a :class:`Subscribed` event.

        Raises:
            MqttUsageError: not connected, the packet id is in use, or a QoS this role cannot read.
        """
        self._claim(packet_id, Step.SEND_SUBSCRIBE)
        if not filters or any(not 0 <= qos <= self._max_read_qos for _, qos in filters):
            raise MqttUsageError(self.our_role, self._state, Step.SEND_SUBSCRIBE, f"filters {list(filters)!r}")
        self._send(Step.SEND_SUBSCRIBE)
        self._subscribing[packet_id] = len(filters)
        return subscribe_packet(packet_id, filters, version=self.version)

    def publish(
        self,
        topic: bytes,
        payload: bytes,
        *,
        qos: int = 0,
        packet_id: int = 0,
        dup: bool = False,
        properties: bytes = b"",
    ) -> bytes:
        """A PUBLISH; at QoS 1 its packet id is in use until the broker's PUBACK (:meth:`take_acknowledgements`).

        ``properties`` is an encoded property block without its length
        (:func:`~protocol.mqtt.packets.receipt_request`, say).

        Raises:
            MqttUsageError: not connected, QoS 1 in the subscriber's role, a QoS other than
                0 and 1, or a packet id in use.
        """
        outgoing = self._outgoing
        # Both steps leave an open connection open (the table), so the flags stay true.
        if qos == 1 and self._sends_qos1 and 0 < packet_id < 0x10000 and packet_id not in outgoing:
            if packet_id in self._subscribing:
                self._claim(packet_id, Step.SEND_PUBLISH_QOS1)
            outgoing.add(packet_id)
        elif not (qos == 0 and self._sends_qos0):
            self._refuse_publish(qos, packet_id)
        return frame_publish(topic, payload, qos, packet_id, dup, self.version, properties)

    def _refuse_publish(self, qos: int, packet_id: int) -> NoReturn:
        """Raise the caller's mistake in asking for a PUBLISH :meth:`publish` refused."""
        step = Step.SEND_PUBLISH_QOS1 if qos else Step.SEND_PUBLISH_QOS0
        if qos not in (0, 1):
            raise MqttUsageError(self.our_role, self._state, step, f"QoS {qos} is not spoken here")
        self._send(step)  # raises when the table refuses the step; else the packet id is at fault
        raise MqttUsageError(self.our_role, self._state, step, f"packet id {packet_id} is not free")

    def _claim(self, packet_id: int, step: Step) -> None:
        if not 1 <= packet_id <= 65535 or packet_id in self._outgoing or packet_id in self._subscribing:
            raise MqttUsageError(self.our_role, self._state, step, f"packet id {packet_id} is not free")

    def acknowledge(self, tokens: Sequence[int]) -> bytes:
        """The PUBACKs (in one string of bytes) for every token of the current, open connection.

        Tokens of a connection that has ended are counted stale and left out: the broker
        redelivers those messages. A QoS 0 message's token (packet id 0) needs nothing.

        Raises:
            MqttUsageError: the publisher's role, which reads no QoS 1 PUBLISH.
        """
        if Step.SEND_PUBACK not in self._steps[_OPEN]:
            raise MqttUsageError(self.our_role, self._state, Step.SEND_PUBACK)
        if self._state is not _OPEN:
            self.drop_acks(tokens)
            return b""
        current = self._key
        pids = [t & 0xFFFF for t in tokens if t & 0xFFFF and t >> 16 == current]
        self._stale += sum(1 for t in tokens if t & 0xFFFF) - len(pids)
        if not pids:
            return b""
        self._acked += len(pids)
        self._in_flight -= len(pids)
        return acknowledgements(pids)

    def drop_acks(self, tokens: Sequence[int]) -> None:
        """Count ``tokens`` stale without acknowledging them: no connection can carry their PUBACKs."""
        self._stale += sum(1 for t in tokens if t & 0xFFFF)

    def ping(self) -> bytes:
        """A PINGREQ (the broker answers PINGRESP, which makes no event).

        Raises:
            MqttUsageError: not connected.
        """
        self._send(Step.SEND_PINGREQ)
        return PINGREQ_PACKET

    # -- receiving -------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Add the bytes of one read; :meth:`next_event` parses them.

        Bytes after the connection ended (a terminal event, a protocol error) or before
        :meth:`connect` are ignored.
        """
        if self._state is _CLOSED or not data:
            return
        if self._pos:
            self._buf = self._buf[self._pos :]
            self._pos = 0
        self._buf = self._buf + data if self._buf else data

    def next_event(self) -> Event | None:
        """Parse buffered packets up to the next event; None once every complete packet is handled.

        PUBLISHes and PUBACKs parsed on the way wait for :meth:`take_deliveries` and
        :meth:`take_acknowledgements`. Call it until it returns None after each
        :meth:`receive_data`: the events come one at a time so the caller can act on each
        before the packets after it are parsed (subscribe after :class:`Connected`, say). A
        :class:`Disconnected` or :class:`ConnectionRefused` ends the connection.

        Raises:
            MqttProtocolError: the bytes are not valid MQTT, break a limit we announced, or are
                a packet the table refuses; the connection is over (send DISCONNECT with its
                reason, then close).
        """
        if self._state is _CLOSED:
            return None
        try:
            event = self._connack() if self._state is _CONNECTING else self._parse()
        except MqttProtocolError:
            self._end()
            raise
        if self._state is _CLOSED:
            self._end()
        return event

    def take_deliveries(self) -> list[Delivery]:
        """The PUBLISHes read since the last call, oldest first."""
        out, self._deliveries = self._deliveries, []
        return out

    def take_acknowledgements(self) -> list[Acknowledged]:
        """The PUBACKs read since the last call, oldest first; their packet ids are free again."""
        out, self._acks = self._acks, []
        return out

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
        connack = decode_connack(buf[start:end], version=self.version)
        self._pos = end
        if connack.reason:
            self._read(Step.READ_REFUSAL, CONNACK)
            return ConnectionRefused(connack.reason, permanent_refusal(connack.reason, version=self.version))
        if not connack.receive_maximum:
            raise MqttProtocolError("CONNACK with Receive Maximum 0", reason=PROTOCOL_ERROR)
        self._read(Step.READ_CONNACK, CONNACK)
        return Connected(connack.session_present, connack.server_keep_alive, connack.receive_maximum)

    def _parse(self) -> Event | None:  # noqa: PLR0912, PLR0915  the receive hot loop, inlined for speed (bench_collector)
        """Handle complete packets up to the first event; the event, or None at the tail. One loop,
        its state in locals (docs/mqtt-client.md measures it); rarer packets leave it for a method."""
        buf, pos, out, prefix, cap = self._buf, self._pos, self._deliveries, self._prefix, self.receive_maximum
        n, key, max_packet, unacked = len(buf), self._key << 16, self.max_packet_bytes, self._in_flight
        max_qos, v5, pubacks = self._max_read_qos, self.version == 5, self._reads_pubacks
        outgoing, acks = self._outgoing, self._acks
        received = qos1 = 0
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
                    if b0 == _PUBACK and pubacks and length == 2:
                        # A publisher's bulk: a PUBACK with reason Success and no properties (§3.4.2.1).
                        pid = (buf[start] << 8) | buf[start + 1]
                        if pid not in outgoing:
                            raise _unexpected_ack(pid)
                        outgoing.discard(pid)
                        acks.append(_acknowledged(Acknowledged, (pid, 0)))
                        continue
                    event = self._control(b0 >> 4, buf, start, end)
                    if event is not None:
                        break
                    continue
                qos = (b0 >> 1) & 3
                if start + 2 > end or not (topic_len := (buf[start] << 8) | buf[start + 1]):
                    raise _no_topic(start, end)
                i = start + 2 + topic_len
                if qos == 0 and buf[start + 2 : start + 7] == b"$SYS/":
                    pos = end
                    event = _broker_message(buf[start + 2 : i], buf, i, end, v5=v5)
                    break
                if qos == 1 and max_qos >= 1:
                    if i + 2 > end or not (pid := (buf[i] << 8) | buf[i + 1]):
                        raise _no_packet_id(i, end)
                    if unacked + qos1 >= cap:
                        self._over_receive_maximum += 1  # counted, not fatal (module docstring)
                    token = key | pid
                    i += 2
                    qos1 += 1
                elif qos == 0 and max_qos >= 0:
                    token = key
                else:
                    raise _qos_refused(qos, self.our_role.value, max_qos)
                reply_to = correlation = None
                if v5:
                    if i >= end:
                        raise MqttProtocolError("PUBLISH ends before its properties")
                    if buf[i]:
                        # Only a request for an answer carries properties; the common case skips this.
                        reply_to, correlation, i = _receipt_request(buf, i, end)
                    else:
                        i += 1
                sender = _sender(prefix, buf, start + 2, start + 2 + topic_len) if prefix is not None else b""
                received += 1
                out.append(Delivery(buf[i:end], token, reply_to, correlation, sender))
                pos = end
        finally:
            # What was parsed before an error stays to be taken (module docstring).
            self._pos = pos
            self._received += received
            self._in_flight += qos1
        return event

    def _control(self, kind: int, buf: bytes, start: int, end: int) -> Event | None:
        """What a packet other than PUBLISH says; one the table refuses is a protocol error."""
        if kind == PUBACK:
            self._read(Step.READ_PUBACK, kind)
            self._acks.append(self._puback(buf, start, end))
            return None
        if kind == SUBACK:
            self._read(Step.READ_SUBACK, kind)
            return self._suback(buf[start:end])
        if kind == PINGRESP:
            self._read(Step.READ_PINGRESP, kind)
            return None
        if kind == DISCONNECT:
            self._read(Step.READ_DISCONNECT, kind)
            return Disconnected(buf[start] if end > start else 0)
        raise MqttProtocolError(f"unexpected packet type {kind} from the broker", reason=PROTOCOL_ERROR)

    def _puback(self, buf: bytes, start: int, end: int) -> Acknowledged:
        if end - start < 2:
            raise MqttProtocolError("PUBACK shorter than its packet id")
        pid = (buf[start] << 8) | buf[start + 1]
        if pid not in self._outgoing:
            raise _unexpected_ack(pid)
        reason = buf[start + 2] if end - start > 2 else 0
        if end - start > 3:
            parse_properties(buf, start + 3, end)  # read, to refuse a malformed one; nothing in it is used
        self._outgoing.discard(pid)
        return Acknowledged(pid, reason)

    def _suback(self, body: bytes) -> Subscribed:
        if len(body) < 3:
            raise MqttProtocolError("SUBACK too short")
        pid = (body[0] << 8) | body[1]
        filters = self._subscribing.pop(pid, None)
        if filters is None:
            raise MqttProtocolError(f"SUBACK for packet id {pid}, which awaits none", reason=PROTOCOL_ERROR)
        i = parse_properties(body, 2, len(body))[1] if self.version == 5 else 2
        codes = body[i:]
        if len(codes) != filters:
            raise MqttProtocolError(f"SUBACK carries {len(codes)} reason codes for {filters} filters")
        return Subscribed(pid, codes)

    # -- state -----------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """QoS 1 PUBLISHes of this connection read and not yet acknowledged."""
        return self._in_flight

    @property
    def has_credit(self) -> bool:
        """Whether fewer than ``receive_maximum`` QoS 1 PUBLISHes read await acknowledgement."""
        return self._in_flight < self.receive_maximum

    @property
    def outstanding(self) -> int:
        """QoS 1 PUBLISHes of this connection sent and not yet acknowledged by the broker."""
        return len(self._outgoing)

    @property
    def pending_bytes(self) -> int:
        """Bytes received and not yet parsed (at most an incomplete packet once :meth:`next_event` returned None)."""
        return len(self._buf) - self._pos

    def statistics(self) -> SessionStatistics:
        """A snapshot of the counters."""
        return SessionStatistics(
            received=self._received,
            acked=self._acked,
            stale_acks=self._stale,
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


def _qos_refused(qos: int, role: str, max_qos: int) -> MqttProtocolError:
    return MqttProtocolError(f"PUBLISH with QoS {qos} to a {role} reading QoS {max_qos} at most", reason=PROTOCOL_ERROR)


def _unexpected_ack(pid: int) -> MqttProtocolError:
    return MqttProtocolError(f"PUBACK for packet id {pid}, which awaits none", reason=PROTOCOL_ERROR)


def _too_large(size: int, max_packet: int) -> MqttProtocolError:
    return MqttProtocolError(
        f"a packet of {size} bytes exceeds our Maximum Packet Size of {max_packet}", reason=PACKET_TOO_LARGE
    )


def _receipt_request(buf: bytes, i: int, end: int) -> tuple[bytes | None, bytes | None, int]:
    """Response Topic and Correlation Data in the properties at ``i`` (None without both); where the payload starts.

    A request as agents write it (a one-byte property length, then exactly a Response Topic
    and a Correlation Data) is read by hand: it comes with every report, and the general
    parser costs several times as much. Any other block, or one this reading does not
    account for to the byte, goes to :func:`~protocol.mqtt.packets.parse_properties`, which
    then also names its fault.
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
    """The levels of the topic ``buf[start:end]`` between ``prefix`` and the last level,
    ``<prefix><sender>/<last>``; empty when there are none. Read in place: one slice per message."""
    if not buf.startswith(prefix, start, end):
        return b""
    begin = start + len(prefix)
    last = buf.rfind(b"/", begin, end)
    return buf[begin:last] if last >= 0 else b""


def _broker_message(topic: bytes, buf: bytes, i: int, end: int, *, v5: bool) -> BrokerMessage:
    """A QoS 0 PUBLISH on a ``$SYS`` topic: its properties skipped, its payload kept."""
    if v5:
        if i >= end:
            raise MqttProtocolError("PUBLISH ends before its properties")
        _, i = parse_properties(buf, i, end)
    return BrokerMessage(topic, buf[i:end])
