"""The publishing seam: a small transport protocol and an in-memory implementation.

The publisher only needs "open a connection" and "publish these bytes and return once the
broker has acknowledged them". :mod:`agent.mqtt` implements it over MQTT (the only module
that imports the MQTT library); :class:`MemoryTransport` implements it in memory, so unit
tests and the fleet simulator can run the whole agent without a broker.

With commit receipts (``protocol.receipts``) a connection also has a response topic of its
own, publishes each report with it and the report id as correlation data, and hands over
the receipts that arrive there (:class:`ReceiptTransport`, :class:`ReceiptConnection`).

Two kinds of "no" from the broker are told apart from a lost connection, because the
publisher answers them differently (docs/wire-format.md, "What the broker says"):
:class:`PublishRefusedError` (an MQTT 5 PUBACK with a reason code of 0x80 or more: this one
message was refused, the connection goes on) and :class:`BrokerBusyError` (the broker asked
clients to come back later: the next connection waits longer).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from agent.errors import TransportError
from protocol.receipts import Receipt

__all__ = [
    "Addressed",
    "BrokerBusyError",
    "Connection",
    "MemoryTransport",
    "PublishRefusedError",
    "Published",
    "ReceiptConnection",
    "ReceiptTransport",
    "Route",
    "Transport",
    "address_of",
]


class PublishRefusedError(TransportError):
    """The broker acknowledged a publish with a refusal (MQTT 5 PUBACK reason code >= 0x80).

    The connection stays usable; only this message was dropped by the broker.

    Attributes:
        code: the PUBACK reason code (0x87: not authorized, say).
        reason: its name in lower case ("not authorized").
    """

    def __init__(self, topic: str, code: int, reason: str) -> None:
        super().__init__(f"the broker refused the publish to {topic}: {reason} (reason code 0x{code:02x})")
        self.code = code
        self.reason = reason


class BrokerBusyError(TransportError):
    """The broker refused or ended the connection with a "not now" reason code (:data:`protocol.mqtt.reasons.BUSY`).

    It lengthens the wait before the next connection (:meth:`runtime.backoff.Retry.next_delay`).
    """


class Connection(Protocol):
    """One open connection to the broker."""

    async def publish(self, topic: str, payload: bytes) -> None:
        """Publish at least once; return only after the broker acknowledged.

        Raises:
            TransportError: if the broker did not acknowledge (the caller retries the same bytes).
        """
        ...


class Transport(Protocol):
    """Opens connections to the broker."""

    def connect(self) -> AbstractAsyncContextManager[Connection]:
        """An async context manager holding one connection (a fresh client identity each time).

        Raises:
            TransportError: if the connection cannot be made.
        """
        ...


class ReceiptConnection(Protocol):
    """One connection subscribed to its own receipt topic."""

    @property
    def response_topic(self) -> str:
        """``<receipt_prefix><identity>/<client id>``: where this connection's receipts arrive."""
        ...

    async def publish(self, topic: str, payload: bytes, *, correlation: bytes) -> None:
        """Publish asking for a receipt; return after the broker acknowledged.

        Raises:
            PublishRefusedError: the broker acknowledged with a refusal (the connection goes on).
            TransportError: the broker did not acknowledge.
        """
        ...

    async def receipts(self) -> list[Receipt]:
        """Wait for the next receipt message.

        Raises:
            TransportError: the connection ended (receipts of its reports cannot arrive any more).
        """
        ...


@runtime_checkable
class ReceiptTransport(Protocol):
    """Opens connections that receive commit receipts."""

    def connect_receipts(self) -> AbstractAsyncContextManager[ReceiptConnection]:
        """A connection with a fresh client identity, already subscribed to its receipt topic.

        Raises:
            TransportError: if the connection cannot be made.
        """
        ...


@runtime_checkable
class Addressed(Protocol):
    """A transport that names the broker it connects to (``host:port``)."""

    @property
    def address(self) -> str:
        """The broker's address, as the ledger and ``ldp-agent status`` show it."""
        ...


@dataclass(frozen=True, slots=True)
class Route:
    """One of the brokers the publisher may use, in the device's order (agent.brokers).

    Attributes:
        broker: its address (``host:port``), recorded in the ledger with each report it carried.
        transport: connections to it.
    """

    broker: str
    transport: Transport


def address_of(transport: Transport) -> str:
    """The broker a transport connects to ("" when it does not say: an in-memory one without a name)."""
    return transport.address if isinstance(transport, Addressed) else ""


@dataclass(frozen=True, slots=True)
class Published:
    """One message an in-memory broker acknowledged.

    Attributes:
        topic: where it was published.
        payload: its bytes.
        connection: the number of the connection that sent it.
        response_topic: the receipt topic it asked to be answered on (None: no receipt asked).
        correlation: the correlation data it carried.
    """

    topic: str
    payload: bytes
    connection: int
    response_topic: str | None = None
    correlation: bytes | None = None


@dataclass
class MemoryTransport:
    """An in-memory broker for tests and simulations.

    Attributes:
        online: when False, connecting fails as if the broker were down.
        drop_acks: when True, messages are received but never acknowledged (the publish fails
            after being delivered, like a PUBACK lost on the way back).
        fail_after: if set, the connection breaks after this many acknowledged messages.
        published: every acknowledged (or, with ``drop_acks``, delivered) message, in order.
        connections: how many connections were opened.
        answer: with receipts, called for each message asking for one; returns the receipt
            to send back at once, or None for none (the test answers later with :meth:`reply`,
            or never: a lost report).
        refuse: with receipts, called with each message's topic; returns the reason the broker
            refuses it (a PUBACK reason code >= 0x80, as an ACL would), or None to accept it.
        address: the name the ledger records for this broker ("": none).
    """

    online: bool = True
    drop_acks: bool = False
    fail_after: int | None = None
    published: list[Published] = field(default_factory=list)
    connections: int = 0
    answer: Callable[[Published], Receipt | None] | None = None
    refuse: Callable[[str], str | None] | None = None
    address: str = ""
    _open: dict[str, asyncio.Queue[list[Receipt] | None]] = field(default_factory=dict, init=False, repr=False)

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Connection]:
        """Open an in-memory connection."""
        if not self.online:
            raise TransportError("in-memory broker is offline")
        self.connections += 1
        yield _MemoryConnection(self, self.connections)

    @contextlib.asynccontextmanager
    async def connect_receipts(self) -> AsyncIterator[ReceiptConnection]:
        """Open an in-memory connection with its own receipt topic."""
        if not self.online:
            raise TransportError("in-memory broker is offline")
        self.connections += 1
        topic = f"receipts/{self.connections}"
        queue: asyncio.Queue[list[Receipt] | None] = asyncio.Queue()
        self._open[topic] = queue
        try:
            yield _MemoryReceiptConnection(self, self.connections, topic, queue)
        finally:
            del self._open[topic]

    def reply(self, response_topic: str, receipts: list[Receipt]) -> bool:
        """Send a receipt message; False when that connection is gone (the receipt is lost)."""
        queue = self._open.get(response_topic)
        if queue is None:
            return False
        queue.put_nowait(list(receipts))
        return True

    def disconnect(self) -> None:
        """Break every open receipt connection (as a broker restart would)."""
        for queue in self._open.values():
            queue.put_nowait(None)


class _MemoryConnection:
    def __init__(self, transport: MemoryTransport, number: int) -> None:
        self._t = transport
        self._number = number

    async def publish(self, topic: str, payload: bytes) -> None:
        t = self._t
        if not t.online:
            raise TransportError("in-memory broker went offline")
        if t.fail_after is not None:
            if t.fail_after <= 0:
                raise TransportError("in-memory connection broke")
            t.fail_after -= 1
        t.published.append(Published(topic, bytes(payload), self._number))
        if t.drop_acks:
            raise TransportError("in-memory broker did not acknowledge")


class _MemoryReceiptConnection:
    def __init__(
        self, transport: MemoryTransport, number: int, topic: str, queue: asyncio.Queue[list[Receipt] | None]
    ) -> None:
        self._t = transport
        self._number = number
        self._topic = topic
        self._queue = queue
        self._broken = False

    @property
    def response_topic(self) -> str:
        return self._topic

    async def publish(self, topic: str, payload: bytes, *, correlation: bytes) -> None:
        t = self._t
        if not t.online or self._broken:
            raise TransportError("in-memory broker went offline")
        if t.fail_after is not None:
            if t.fail_after <= 0:
                raise TransportError("in-memory connection broke")
            t.fail_after -= 1
        if t.refuse is not None and (reason := t.refuse(topic)) is not None:
            raise PublishRefusedError(topic, 0x87, reason)
        message = Published(topic, bytes(payload), self._number, self._topic, bytes(correlation))
        t.published.append(message)
        if t.drop_acks:
            raise TransportError("in-memory broker did not acknowledge")
        if t.answer is not None and (receipt := t.answer(message)) is not None:
            self._queue.put_nowait([receipt])

    async def receipts(self) -> list[Receipt]:
        item = await self._queue.get()
        if item is None:
            self._broken = True
            raise TransportError("in-memory connection broke")
        return item
