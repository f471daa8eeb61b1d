"""The publishing seam: a small transport protocol and an in-memory implementation.

The publisher only needs "open a connection" and "publish these bytes and return once the
broker has acknowledged them". :mod:`agent.mqtt` implements it over MQTT (the only module
that imports the MQTT library); :class:`MemoryTransport` implements it in memory, so unit
tests and the fleet simulator can run the whole agent without a broker.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

from agent.errors import TransportError

__all__ = ["Connection", "MemoryTransport", "Published", "Transport"]


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


@dataclass(frozen=True, slots=True)
class Published:
    """One message an in-memory broker acknowledged."""

    topic: str
    payload: bytes
    connection: int


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
    """

    online: bool = True
    drop_acks: bool = False
    fail_after: int | None = None
    published: list[Published] = field(default_factory=list)
    connections: int = 0

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Connection]:
        """Open an in-memory connection."""
        if not self.online:
            raise TransportError("in-memory broker is offline")
        self.connections += 1
        yield _MemoryConnection(self, self.connections)


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
