"""The seam between ingest and the message broker.

Ingest sees only :class:`Delivery` objects: the payload bytes, an opaque acknowledgement
token and the sender's identity from the topic. Client id, packet flags and arrival time are
dropped by the adapter before a delivery exists (003 §3.2.2: "the batch process removes
metadata"), so nothing downstream can link a report to a connection or a moment. The
sender's identity goes no further than the per-device allowance: the store replaces it by
a keyed hash under a per-period key and forgets both when the period closes
(docs/device-identity.md).

A token is acknowledged with :meth:`Transport.ack` only after the report's contribution and
its report id are committed; an unacknowledged QoS 1 message is redelivered by the broker
after a crash or a reconnect, and the report-id table makes that redelivery harmless. A token
also names the broker that delivered its message (:func:`route_of`), through which the
report's commit receipt goes back: the one place a delivery carries its broker.

Adapters: :mod:`collector.mqtt` (MQTT 5 on asyncio streams, the default) and
:class:`MemoryTransport` below (in-memory, for tests).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from protocol.mqtt.events import MAX_TAGS, Delivery, make_token, packet_id_of, tag_of
from protocol.receipts import Receipt

__all__ = [
    "MAX_ROUTES",
    "BrokerStatistics",
    "Delivery",
    "MemoryTransport",
    "Transport",
    "TransportStatistics",
    "route_of",
]

MAX_ROUTES = MAX_TAGS
"""The most brokers one collector subscribes to: a token keeps its broker's index in 8 bits."""


def route_of(token: int) -> int:
    """The index of the broker whose connection gave out ``token``: the tag of its session
    (``collector.mqtt.brokers`` gives each broker's session its index as its tag), read by
    :func:`protocol.mqtt.events.tag_of`. A delivery carries its broker only here."""
    return tag_of(token)


@dataclass(frozen=True, slots=True)
class BrokerStatistics:
    """One broker connection of a collector, as ``/healthz``, ``status`` and the metrics show it.

    Attributes:
        address: ``host:port`` of the broker.
        connected: whether the session is up and subscribed right now.
        since: when it last became connected or disconnected (Unix time), None before the first attempt ended.
        connects: successful connections so far.
        received: messages received from this broker.
        acked: acknowledgements sent to it.
        receipts_sent: commit receipts published through it.
    """

    address: str
    connected: bool
    since: float | None
    connects: int
    received: int
    acked: int
    receipts_sent: int


@dataclass(frozen=True, slots=True)
class TransportStatistics:
    """A snapshot of a transport's counters.

    Attributes:
        connected: whether a broker session is up right now.
        connects: successful connections so far (the first one included).
        buffered: deliveries received and not yet handed to ingest.
        capacity: the most deliveries the transport will hold before the broker stops sending.
        unacked: deliveries handed out (or buffered) and not yet acknowledged on this connection.
        received: messages received in total.
        acked: acknowledgements sent.
        stale_acks: acknowledgements dropped because their connection had ended (the broker
            redelivers those messages; the report-id table absorbs the repeat).
        dropped: QoS 0 messages dropped because the buffer was full.
        protocol_errors: connections dropped because the broker sent invalid MQTT or broke
            a limit we announced (each followed by a reconnect).
        over_receive_maximum: QoS 1 messages received while Receive Maximum messages already
            awaited acknowledgement (the broker's fault; reading pauses until acks catch up).
        receipts_sent: commit receipts published (``protocol.receipts``).
        receipts_dropped: receipts not sent because no connection was up (the agent resends).
        broker: the broker's own counters from ``$SYS/broker/...`` (the last value of each
            topic in :data:`BROKER_COUNTERS`), empty if the broker sends none; with several
            brokers, each counter summed over them.
        brokers: each broker connection on its own (one entry per configured broker; empty
            for a transport that is no broker session, such as :class:`MemoryTransport`).
    """

    connected: bool
    connects: int
    buffered: int
    capacity: int
    unacked: int
    received: int
    acked: int
    stale_acks: int
    dropped: int
    protocol_errors: int = 0
    over_receive_maximum: int = 0
    receipts_sent: int = 0
    receipts_dropped: int = 0
    broker: Mapping[str, float] = field(default_factory=dict)
    # A factory, not (): the API's JSON Schema (collector.results.json_schema) is plain JSON data.
    brokers: tuple[BrokerStatistics, ...] = field(default_factory=tuple)


class Transport(Protocol):
    """What ingest needs from a message broker connection."""

    async def receive(self, max_count: int) -> list[Delivery]:
        """Wait until at least one delivery is available; return up to ``max_count`` of them."""
        ...

    def ack(self, tokens: Sequence[int]) -> None:
        """Acknowledge deliveries (after their contribution is committed)."""
        ...

    def send_receipts(self, receipts: Mapping[bytes, Sequence[Receipt]], *, route: int = 0) -> None:
        """Publish commit receipts, one message per response topic (after the commit), through
        broker ``route`` (:func:`route_of` the tokens of the reports they answer)."""
        ...

    def statistics(self) -> TransportStatistics:
        """A snapshot of the counters."""
        ...


class MemoryTransport:
    """An in-memory broker session, for tests of ingest without a network.

    Messages are pushed with :meth:`push`; :meth:`reconnect` simulates a dropped connection
    with a persistent session: every unacknowledged message is delivered again, and
    acknowledgements of the old connection's tokens are ignored, as a real broker would.
    """

    def __init__(self, capacity: int = 1 << 16) -> None:
        self.capacity = capacity
        self._queue: collections.deque[Delivery] = collections.deque()
        self._unacked: dict[int, bytes] = {}
        self._senders: dict[int, bytes] = {}
        self._next = 0
        self._ready = asyncio.Event()
        self.acked: list[bytes] = []
        self._received = 0
        self._stale = 0
        self._connects = 1
        self._requests: dict[int, tuple[bytes | None, bytes | None]] = {}
        self.receipts: list[tuple[bytes, Receipt]] = []
        self.receipt_routes: list[int] = []
        """The route each entry of :attr:`receipts` was sent through."""

    def push(
        self, payload: bytes, sender: bytes = b"", *, reply_to: bytes | None = None, correlation: bytes | None = None
    ) -> None:
        """Deliver ``payload`` as a QoS 1 message from device ``sender`` (with a receipt request
        when ``reply_to`` is given)."""
        self._next += 1
        # Unique across reconnects, so a token of an earlier connection is never in _unacked.
        token = make_token(self._next, 0, 1)
        self._unacked[token] = payload
        self._requests[token] = (reply_to, correlation)
        self._senders[token] = sender
        self._queue.append(Delivery(payload, token, reply_to, correlation, sender))
        self._received += 1
        self._ready.set()

    def reconnect(self) -> None:
        """Drop the connection and redeliver every unacknowledged message on a new one."""
        pending = [
            (payload, self._senders.get(token, b""), self._requests.get(token, (None, None)))
            for token, payload in self._unacked.items()
        ]
        self._unacked.clear()
        self._requests.clear()
        self._senders.clear()
        self._queue.clear()
        self._connects += 1
        for payload, sender, (reply_to, correlation) in pending:
            self.push(payload, sender, reply_to=reply_to, correlation=correlation)

    async def receive(self, max_count: int) -> list[Delivery]:
        """Wait for at least one delivery; return up to ``max_count``."""
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        n = min(max_count, len(self._queue))
        return [self._queue.popleft() for _ in range(n)]

    def ack(self, tokens: Sequence[int]) -> None:
        """Acknowledge tokens of the current connection; older ones are ignored."""
        for token in tokens:
            if not packet_id_of(token):
                continue
            payload = self._unacked.pop(token, None)
            if payload is None:
                self._stale += 1
                continue
            self._requests.pop(token, None)
            self._senders.pop(token, None)
            self.acked.append(payload)

    def send_receipts(self, receipts: Mapping[bytes, Sequence[Receipt]], *, route: int = 0) -> None:
        """Record the receipts (topic, receipt) in :attr:`receipts`, and their route."""
        for topic, items in receipts.items():
            self.receipts.extend((topic, r) for r in items)
            self.receipt_routes.extend(route for _ in items)

    @property
    def unacked(self) -> int:
        """Messages delivered and not yet acknowledged."""
        return len(self._unacked)

    def statistics(self) -> TransportStatistics:
        """A snapshot of the counters."""
        return TransportStatistics(
            connected=True,
            connects=self._connects,
            buffered=len(self._queue),
            capacity=self.capacity,
            unacked=len(self._unacked),
            received=self._received,
            acked=len(self.acked),
            stale_acks=self._stale,
            dropped=0,
            receipts_sent=len(self.receipts),
        )
