"""MQTT 5 on asyncio streams: the collector's subscriber, with acknowledgement after commit.

Why not a general-purpose client: the collector needs exactly one behaviour that common
Python clients make hard or slow. A QoS 1 message must be acknowledged (PUBACK) only after
its contribution is committed to the checkpoint store; aiomqtt acknowledges on receipt,
and paho reads every packet with several small ``recv`` calls under the GIL
(docs/mqtt-client.md compares them). The protocol itself - packets, limits, what a read
means - is the project's MQTT core, :class:`protocol.mqtt.session.Session` in the
subscriber's role; this module moves its bytes over a socket, acts on its events and keeps
the deliveries for ingest (:mod:`collector.mqtt.inbox`).

Guarantees:

* **Persistent session**: Clean Start is 0 and the Session Expiry Interval is set, so the
  broker keeps our subscription and queues messages while the collector is down; after a
  reconnect it resends unacknowledged messages (MQTT 5 §4.4).
* **Acknowledge after commit**: :meth:`MqttTransport.ack` sends PUBACK only for tokens of
  the live connection. A token from a connection that has since dropped is ignored: its
  packet id may already name another message on the new connection, and the broker will
  redeliver the original anyway (the report-id table absorbs the repeat).
* **Bounded memory, backpressure**: the CONNECT Receive Maximum caps unacknowledged QoS 1
  messages in flight to us (the broker stops sending until we acknowledge, MQTT 5 §4.9);
  the reader stops reading the socket while that many await acknowledgement, or while
  ``buffer_bytes`` of payload wait for ingest, so TCP pushes back. QoS 0 messages beyond
  the buffer are dropped and counted.
* **Metadata stripped**: a :class:`~collector.transport.Delivery` carries only the
  payload, the sender's identity and a receipt request (see :mod:`protocol.mqtt.session`).
* **Loss at the broker is visible**: a second, QoS 0 subscription to a few of Mosquitto's
  ``$SYS/broker/...`` counters (:data:`~collector.mqtt.subscriptions.BROKER_COUNTERS`: messages
  dropped on full queues, messages and bytes stored, clients connected) keeps their last
  values for :meth:`MqttTransport.statistics` and the Prometheus metrics; they never reach
  ingest. The ACL lets only the collector credential read them; a broker that refuses the
  subscription costs a log line, nothing more.
* **Reconnect outside the session** with capped, jittered exponential backoff
  (:mod:`runtime.backoff`). The backoff starts again from ``reconnect_min_s`` only after a
  session that served: one that received a report, or stayed up for a keep-alive interval.
  A broker that grants the subscription and then sends DISCONNECT at once is not serving,
  and resetting then made the collector reconnect in a tight loop. A broker that says it
  is busy (CONNACK or DISCONNECT 0x88, 0x89, 0x97, 0x9F: :data:`protocol.mqtt.reasons.BUSY`) makes
  the waits grow faster; the jitter keeps collectors from coming back in step. A refusal
  that retrying cannot fix (bad credentials, subscription not granted at QoS 1) raises
  :class:`~collector.errors.TransportError` and ends the service.
* **A reconnect opens no file**: the TLS context is built once, when the session is made at
  start-up (:func:`broker_connector`; a TLS file that cannot be used then is a
  :class:`~collector.errors.ConfigError` naming the field and the file), and every connection
  reuses it. A connection that fails for want of a system resource (``EMFILE`` when a flood
  of HTTP clients has filled the open-file table, ``ENFILE``, ``ENOMEM``, ``ENOBUFS``) is
  retried with the same backoff, counted (``ldp_collector_resource_errors_total``) and logged
  once until a connection succeeds (:mod:`runtime.resources`).
* **Every task has an owner**: :meth:`MqttTransport.run` is run by its caller's task group;
  the keep-alive of a connection is a task of that connection's own group, ended with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from collector.config import MqttConfig, read_password
from collector.errors import TransportError
from collector.mqtt.inbox import Inbox
from collector.mqtt.subscriptions import (
    COUNTERS_PACKET_ID,
    broker_counter,
    counters_refused,
    reports_granted,
    subscribe,
)
from collector.mqtt.tls import broker_tls_context
from collector.transport import BrokerStatistics, Delivery, TransportStatistics
from protocol.mqtt.events import BrokerMessage, Connected, ConnectionRefused, Disconnected, Event, Subscribed
from protocol.mqtt.packets import MqttProtocolError, disconnect_packet
from protocol.mqtt.reasons import BUSY
from protocol.mqtt.session import Session
from protocol.mqtt.states import Role, State
from protocol.receipts import Receipt, encode_receipts
from runtime.backoff import Backoff, Retry
from runtime.resources import ResourceErrors

__all__ = [
    "READ_PAUSE_S",
    "BrokerConnector",
    "MqttTransport",
    "broker_connector",
    "open_broker_connection",
]

log = logging.getLogger(__name__)

_RECEIPTS_PER_MESSAGE = 2000  # about 40 KiB of receipts in one PUBLISH
_CONNECT_TIMEOUT = 10.0

_SHORT_READ = 64 * 1024
"""A read shorter than this found the socket nearly empty: the collector is keeping up."""

READ_PAUSE_S = 0.02
"""After a short read, how long the socket is left to fill before the next one.

A collector that keeps up with its stream otherwise wakes for every few segments the broker
writes. Each wake-up (a read, a parse, an ingest pass) has a fixed cost, and a process that
works in short bursts between sleeps is also charged more CPU per unit of work than one kept
busy; docs/mqtt-client.md ("Reading in gulps") gives the reads and the CPU per message with
and without the pause. 20 ms is small next to the commit interval
(``ingest.commit_interval_s``, 250 ms by default), which bounds when a report is counted and
acknowledged; the service never pauses longer than a quarter of it, so an operator who
shortens the interval for latency shortens the pause too. A busy collector never pauses (its
reads are long).
"""

BrokerConnector = Callable[[MqttConfig], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
"""Opens one connection to the broker a config names (tests pass their own streams)."""


def broker_connector(config: MqttConfig) -> BrokerConnector:
    """Opens connections to the broker ``config`` names, over TLS when ``[mqtt.tls]`` is set,
    with a TLS context built here, once: every connection reuses it and reads no file.

    Raises:
        ConfigError: a TLS file is missing, unreadable or broken.
        runtime.resources.ResourceShortageError: a TLS file could not be read for want of a
            system resource.
    """
    context = broker_tls_context(config)

    async def open_connection(cfg: MqttConfig) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(cfg.host, cfg.port, ssl=context, limit=1 << 20)

    return open_connection


async def open_broker_connection(config: MqttConfig) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """One TCP connection to the broker ``config`` names, over TLS when ``[mqtt.tls]`` is set
    (a context of its own: a session keeps one, :func:`broker_connector`).

    Raises:
        ConfigError: a TLS file is missing, unreadable or broken.
        OSError: the broker cannot be reached.
    """
    return await broker_connector(config)(config)


class _ConnectionLostError(Exception):
    """The connection ended (closed by the peer, keepalive expired, server DISCONNECT)."""


class MqttTransport:
    """A persistent MQTT 5 QoS 1 subscription whose messages are acknowledged on request.

    Run :meth:`run` as a task (it connects, reconnects and never returns unless the broker
    refuses us for good); call :meth:`receive` and :meth:`ack` from the ingest task.

    Args:
        config: broker address, client id, topic, shared-subscription group, limits.
        read_pause_s: how long the socket is left to fill after a short read (see
            :data:`READ_PAUSE_S`; the service passes at most a quarter of its commit interval).
        open_connection: opens each connection (default: :func:`broker_connector`'s, whose TLS
            context is built here, at start-up).
        sleep: waits out each reconnect delay (default: :func:`asyncio.sleep`; tests record
            the delays through it).
        route: this broker's index among the collector's brokers (``collector.mqtt.brokers``),
            the tag of its session: carried in every token it gives out
            (:func:`collector.transport.route_of`).
        ready: set whenever deliveries arrive (default: an event of its own); the brokers of
            one collector share one, so ingest waits on all of them at once.
        resources: counts the connections that failed for want of a system resource (default:
            a counter of its own; the service shares its own, exported as metrics).

    Raises:
        ConfigError: a TLS file or the password file cannot be used.
    """

    def __init__(
        self,
        config: MqttConfig,
        *,
        read_pause_s: float = READ_PAUSE_S,
        open_connection: BrokerConnector | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        route: int = 0,
        ready: asyncio.Event | None = None,
        resources: ResourceErrors | None = None,
    ) -> None:
        self.config = config
        self._sleep = sleep
        self._read_pause_s = read_pause_s
        self._open_connection = open_connection or broker_connector(config)
        self._resources = resources or ResourceErrors(log)
        self._password = read_password(config)
        # "ldp/v1/reports/#" -> b"ldp/v1/reports/": what comes after it, up to the last level
        # (the use case), is the sender's identity.
        prefix = config.topic[:-1].encode() if config.topic.endswith("/#") else None
        self._session = Session(
            Role.SUBSCRIBER,
            receive_maximum=config.receive_maximum,
            max_packet_bytes=config.max_packet_bytes,
            topic_prefix=prefix,
            tag=route,
        )
        self._inbox = Inbox(config.receive_maximum)
        self._ready = ready if ready is not None else asyncio.Event()
        self._since: float | None = None  # when the connection last came up or went down (Unix time)
        self._drained = asyncio.Event()
        self._drained.set()
        self._subscribed = asyncio.Event()
        self._writer: asyncio.StreamWriter | None = None
        self._connects = 0
        self._last_rx = 0.0
        self._last_tx = 0.0
        self._broker: dict[str, float] = {}
        self.session_present = False
        self._closing = False
        self._keepalive_s = config.keepalive_s
        self._session_start: tuple[float, int] | None = None  # (monotonic time, reports received) at CONNACK
        self._busy = False  # the broker ended this connection saying "not now"
        self._protocol_errors = 0
        self._receipts_sent = 0
        self._receipts_dropped = 0
        self._paused = False
        self._credit = asyncio.Event()  # set whenever fewer than Receive Maximum messages await acknowledgement
        self._credit.set()

    # -- ingest side ---------------------------------------------------------------------

    async def receive(self, max_count: int) -> list[Delivery]:
        """Wait until at least one delivery is buffered; return up to ``max_count``."""
        inbox = self._inbox
        while not inbox:
            self._ready.clear()
            await self._ready.wait()
        return self.take(max_count)

    def take(self, max_count: int) -> list[Delivery]:
        """Up to ``max_count`` buffered deliveries, at once (none when nothing is buffered)."""
        inbox = self._inbox
        out = inbox.take(max_count)
        if inbox.buffered_bytes <= self.config.buffer_bytes // 2:
            self._drained.set()
        return out

    @property
    def buffered(self) -> int:
        """Deliveries received and not yet taken."""
        return len(self._inbox)

    def ack(self, tokens: Sequence[int]) -> None:
        """Send PUBACK for every token of the live connection; drop the others."""
        writer = self._writer
        session = self._session
        if writer is None or writer.is_closing():
            session.drop_acks(tokens)
            return
        data = session.acknowledge(tokens)
        if not data:
            return
        writer.write(data)
        self._last_tx = time.monotonic()
        if session.has_credit:
            self._credit.set()

    def send_receipts(self, receipts: Mapping[bytes, Sequence[Receipt]]) -> None:
        """Publish commit receipts at QoS 0 through this broker, one message per response topic
        (chunked); :meth:`collector.mqtt.BrokerSet.send_receipts` chooses the broker.

        QoS 0 is enough: a lost receipt only makes the agent resend the identical report,
        which de-duplication counts once and answers again. Receipts for a connection that
        has since dropped are sent on the new one; topics outside ``mqtt.receipt_prefix``
        never reach here (ingest checks them with ``protocol.receipts.valid_response_topic``).
        """
        writer = self._writer
        session = self._session
        if writer is None or writer.is_closing() or not session.connected:
            self._receipts_dropped += sum(len(v) for v in receipts.values())
            return
        packets: list[bytes] = []
        for topic, items in receipts.items():
            for start in range(0, len(items), _RECEIPTS_PER_MESSAGE):
                chunk = items[start : start + _RECEIPTS_PER_MESSAGE]
                packets.append(session.publish(topic, encode_receipts(chunk)))
                self._receipts_sent += len(chunk)
        if packets:
            writer.write(b"".join(packets))
            self._last_tx = time.monotonic()

    def statistics(self) -> TransportStatistics:
        """A snapshot of the counters."""
        session = self._session
        counts = session.statistics()
        return TransportStatistics(
            connected=self._writer is not None and self._subscribed.is_set(),
            connects=self._connects,
            buffered=len(self._inbox),
            capacity=self.config.receive_maximum,
            unacked=max(session.in_flight, 0),
            received=counts.received,
            acked=counts.acked,
            stale_acks=counts.stale_acks,
            dropped=self._inbox.dropped,
            protocol_errors=self._protocol_errors,
            over_receive_maximum=counts.over_receive_maximum,
            receipts_sent=self._receipts_sent,
            receipts_dropped=self._receipts_dropped,
            broker=dict(self._broker),
            brokers=(self.broker_statistics(),),
        )

    def broker_statistics(self) -> BrokerStatistics:
        """This broker's connection, for ``/healthz``, ``status`` and the metrics."""
        counts = self._session.statistics()
        return BrokerStatistics(
            address=self.address,
            connected=self._writer is not None and self._subscribed.is_set(),
            since=self._since,
            connects=self._connects,
            received=counts.received,
            acked=counts.acked,
            receipts_sent=self._receipts_sent,
        )

    @property
    def address(self) -> str:
        """``host:port`` of the broker (an IPv6 host in brackets)."""
        host = self.config.host
        return f"[{host}]:{self.config.port}" if ":" in host else f"{host}:{self.config.port}"

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
            self._session_start = None
            self._busy = False
            try:
                await self._connection()
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
                # Out of files or memory (a flood of HTTP clients, say): counted and logged once
                # until a connection succeeds, and retried like any other failure.
                operation = "mqtt-connect" if self._session_start is None else "mqtt-session"
                if not self._closing and not self._resources.failed(operation, exc):
                    what = "lost" if self._writer is not None else "failed"
                    log.warning(
                        "broker connection to %s:%d %s: %s", cfg.host, cfg.port, what, exc or type(exc).__name__
                    )
            finally:
                await self._close()
            if self._closing:
                return
            if self._served():
                retry.reset()  # a session that worked: the next drop waits from reconnect_min_s again
            # Jitter keeps a fleet of collectors from reconnecting in lock step after a broker restart.
            await self._sleep(retry.next_delay(busy=self._busy))

    def _served(self) -> bool:
        """Whether the session that just ended served: it received a report, or it stayed
        up a keep-alive interval (a quiet broker that keeps us is serving too)."""
        if self._session_start is None:
            return False
        started, received = self._session_start
        if self._session.statistics().received > received:
            return True
        return time.monotonic() - started >= self.config.keepalive_s

    async def close(self) -> None:
        """Disconnect politely (the session and its queue stay on the broker); :meth:`run` returns."""
        self._closing = True
        writer = self._writer
        if writer is not None and not writer.is_closing() and self._session.state is not State.CLOSED:
            with contextlib.suppress(OSError):
                writer.write(self._session.disconnect())
                await asyncio.wait_for(writer.drain(), 1.0)
        await self._close()

    def _disconnect_with(self, reason: int) -> None:
        """Tell the broker why we end the connection (MQTT 5 §3.14.2.1); the session ended it already."""
        writer = self._writer
        if writer is not None and not writer.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(disconnect_packet(reason))

    async def _close(self) -> None:
        writer, self._writer = self._writer, None
        if self._subscribed.is_set() or self._since is None:
            self._since = time.time()
        self._subscribed.clear()
        # Tokens handed out on this connection are now stale.
        self._session.connection_lost()
        self._credit.set()
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _connection(self) -> None:
        """One connection, from CONNECT until it ends; it always ends by an exception."""
        reader, writer = await self._connect()
        # The keep-alive lives exactly as long as this connection: this group owns it. The
        # read loop's exception is raised again outside the group, unwrapped, so that run()
        # can tell a protocol error from a lost connection (a group would wrap it in an
        # ExceptionGroup); an exception of the keep-alive itself propagates as the group's.
        ended: Exception | None = None
        async with asyncio.TaskGroup() as tasks:
            pinger = tasks.create_task(self._keepalive(writer), name="mqtt-keepalive")
            try:
                await self._read_loop(reader, writer.transport)
            except Exception as exc:
                ended = exc
            finally:
                pinger.cancel()
        if ended is not None:
            raise ended

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Open a connection, send CONNECT, wait for CONNACK, subscribe."""
        cfg = self.config
        session = self._session
        reader, writer = await asyncio.wait_for(self._open_connection(cfg), _CONNECT_TIMEOUT)
        self._writer = writer
        if self._closing:
            # close() ran while the connection was being opened, when there was no writer
            # for it to close: this connection must not start a session (run()'s finally
            # closes it), or run() would keep it alive and never return.
            raise _ConnectionLostError("closed while connecting")
        # Clean Start 0 and a Session Expiry: a persistent session (module docstring).
        writer.write(
            session.connect(
                client_id=cfg.client_id,
                clean_start=False,
                keepalive=cfg.keepalive_s,
                session_expiry=cfg.session_expiry_s,
                username=cfg.username,
                password=self._password,
            )
        )
        await writer.drain()
        deadline = time.monotonic() + _CONNECT_TIMEOUT
        event: Event | None = None
        while event is None:
            data = await asyncio.wait_for(reader.read(65536), max(0.01, deadline - time.monotonic()))
            if not data:
                raise _ConnectionLostError("closed before CONNACK")
            session.receive_data(data)
            event = session.next_event()
        self._on_event(event)
        writer.write(subscribe(session, cfg.topic_filter))
        log.info(
            "connected to %s:%d as %s (session present: %s); subscribing to %s",
            cfg.host,
            cfg.port,
            cfg.client_id,
            self.session_present,
            cfg.topic_filter,
        )
        return reader, writer

    def _on_event(self, event: Event) -> None:
        """Act on one event of the session; raise when it ends the connection."""
        match event:
            case Connected():
                self.session_present = event.session_present
                # §3.2.2.3.14: the broker's Server Keep Alive replaces the value we asked for.
                self._keepalive_s = event.server_keep_alive or self.config.keepalive_s
                self._connects += 1
                self._last_rx = self._last_tx = time.monotonic()
                self._session_start = (self._last_rx, self._session.statistics().received)
                self._resources.succeeded("mqtt-connect")
                self._resources.succeeded("mqtt-session")
            case ConnectionRefused():
                if event.permanent_cause is not None:
                    raise TransportError(
                        f"the broker refused the connection: {event.permanent_cause} (reason code 0x{event.reason:02x})"
                    )
                self._busy = event.reason in BUSY
                raise _ConnectionLostError(
                    f"the broker refused the connection for now (reason code 0x{event.reason:02x})"
                )
            case Subscribed() if event.packet_id == COUNTERS_PACKET_ID:
                if counters_refused(event):
                    log.warning(
                        "the broker refused its $SYS counters (reason codes %s): no broker metrics",
                        event.reasons.hex(),
                    )
            case Subscribed():
                self._on_reports_subscribed(event)
            case BrokerMessage():
                counter = broker_counter(event)
                if counter is not None:
                    self._broker[counter[0]] = counter[1]
            case Disconnected():
                self._busy = event.reason in BUSY
                raise _ConnectionLostError(f"the broker sent DISCONNECT (reason code 0x{event.reason:02x})")

    def _on_reports_subscribed(self, event: Subscribed) -> None:
        """The reports' SUBACK: serving from now on, or a refusal that ends the transport."""
        refused = reports_granted(event)
        if refused == 0:
            raise TransportError(
                f"the broker granted {self.config.topic_filter!r} only at QoS 0; "
                "acknowledgement after commit needs QoS 1"
            )
        if refused is not None:
            raise TransportError(
                f"the broker refused the subscription to {self.config.topic_filter!r} (reason code 0x{refused:02x})"
            )
        if not self._subscribed.is_set():
            self._since = time.time()
        self._subscribed.set()

    def _handle_received(self) -> None:
        """Parse what the session holds, acting on each event; wake ingest for the deliveries."""
        session = self._session
        try:
            while (event := session.next_event()) is not None:
                self._on_event(event)
        finally:
            # Deliveries parsed before an error are handed on: they are well formed.
            deliveries = session.take_deliveries()
            if deliveries:
                self._inbox.add(deliveries)
                self._ready.set()

    async def _keepalive(self, writer: asyncio.StreamWriter) -> None:
        interval = self._keepalive_s
        if interval <= 0:  # keep alive switched off by the broker (§3.1.2.10)
            return
        while True:
            await asyncio.sleep(interval / 4)
            if writer.transport.is_closing():
                # The connection died while the read loop waits for ingest to drain or to give
                # credit back (it reads nothing then, so it cannot see the loss): wake it, so
                # the session ends and run() reconnects, instead of pinging a dead socket forever.
                self._drained.set()
                self._credit.set()
                return
            now = time.monotonic()
            if now - self._last_tx >= interval / 2 and self._session.connected:
                writer.write(self._session.ping())
                self._last_tx = now
            # Reading is paused while ingest catches up: silence then is ours, not the broker's.
            if not self._paused and now - self._last_rx > interval * 1.5:
                log.warning("no traffic from the broker for %.1f s; reconnecting", now - self._last_rx)
                writer.transport.abort()
                return

    async def _read_loop(self, reader: asyncio.StreamReader, transport: asyncio.BaseTransport) -> None:
        limit = self.config.buffer_bytes
        session, inbox = self._session, self._inbox
        while True:
            self._handle_received()
            self._paused = True
            while inbox.buffered_bytes > limit and not transport.is_closing():
                self._drained.clear()
                await self._drained.wait()
            while not session.has_credit and not transport.is_closing():
                self._credit.clear()
                await self._credit.wait()
            # Closed meanwhile: the read below returns what is left, then the end or the error.
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
            session.receive_data(data)
