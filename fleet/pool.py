"""The simulated devices' shared MQTT connections: a small pool of receipt-capable
connections, repaired when they break, through which each device publishes under its own
sub-identity (see :mod:`fleet.sim`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from agent.errors import TransportError
from agent.transport import Connection, PublishRefusedError, ReceiptConnection, ReceiptTransport, Transport
from protocol.receipts import Receipt
from runtime.backoff import Backoff

__all__ = ["MAX_PUBLISH_ATTEMPTS", "ConnectionPool", "DeviceTransport", "Pool"]

log = logging.getLogger("ldp_fleet")

_REPAIR_BACKOFF = Backoff(initial=0.05, cap=2.0)
"""Waits before reopening broken pooled connections (doubling from 50 ms to 2 s)."""


MAX_PUBLISH_ATTEMPTS = 8
"""A device's reports are retried this many times across reconnects before the run fails."""


class Pool(Protocol):
    """What the devices publish through: one :class:`ConnectionPool`, or one per broker
    (:class:`fleet.brokers.BrokerPools`)."""

    async def publish(
        self, topic: str, payload: bytes, *, correlation: bytes | None = None, device: str | None = None
    ) -> None:
        """Publish; return after the broker's acknowledgement (raise TransportError otherwise).
        ``device`` names the publishing device (it picks the broker where there are several)."""
        ...

    async def repair(self, *, attempt: int) -> None:
        """Reopen broken connections (raise TransportError if they cannot be)."""
        ...


@dataclass
class _Pooled:
    number: int
    stack: contextlib.AsyncExitStack | None = None
    connection: Connection | None = None
    receipts: ReceiptConnection | None = None
    listener: asyncio.Task[None] | None = None
    in_flight: int = 0


class ConnectionPool:
    """A few long-lived broker connections shared by every device of a worker.

    Each is opened through an ordinary :class:`agent.transport.Transport` (the agent's MQTT
    adapter with its TLS and authentication), so what reaches the broker is what a device
    sends; a device borrows a connection for one publish at a time. A connection that fails
    is closed and reopened with a capped backoff by the next device that needs it.

    With ``on_receipts``, each connection is opened with a response topic of its own
    (:meth:`agent.transport.ReceiptTransport.connect_receipts`), every publish asks for a
    commit receipt, and a listener per connection (owned by the pool's task group) hands the
    receipts that arrive to ``on_receipts``.

    Args:
        transport: opens connections.
        size: number of connections.
        window: publishes in flight per connection (below aiomqtt's warning threshold of 10).
        on_receipts: called with each receipt message's receipts (None: no receipts asked).
    """

    def __init__(
        self,
        transport: Transport,
        *,
        size: int,
        window: int,
        on_receipts: Callable[[list[Receipt]], None] | None = None,
    ) -> None:
        if on_receipts is not None and not isinstance(transport, ReceiptTransport):
            raise TypeError(f"{type(transport).__name__} cannot receive commit receipts")
        self._transport = transport
        self._slots = [_Pooled(i) for i in range(size)]
        self._free = asyncio.Semaphore(size * window)
        self._window = window
        self._lock = asyncio.Lock()
        self._on_receipts = on_receipts
        self._stack = contextlib.AsyncExitStack()
        self._tasks: asyncio.TaskGroup | None = None
        self.reconnects = 0

    async def __aenter__(self) -> ConnectionPool:
        self._tasks = await self._stack.enter_async_context(asyncio.TaskGroup())
        try:
            for slot in self._slots:
                await self._open(slot)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for slot in self._slots:
            await self._close(slot)
        await self._stack.aclose()

    async def _open(self, slot: _Pooled) -> None:
        stack = contextlib.AsyncExitStack()
        try:
            if self._on_receipts is not None:
                transport: ReceiptTransport = self._transport  # type: ignore[assignment]  # checked in __init__
                conn = await stack.enter_async_context(transport.connect_receipts())
                slot.receipts = conn
                assert self._tasks is not None
                slot.listener = self._tasks.create_task(self._listen(slot, conn), name=f"receipts-{slot.number}")
            else:
                slot.connection = await stack.enter_async_context(self._transport.connect())
        except BaseException:
            await stack.aclose()
            raise
        slot.stack = stack

    async def _listen(self, slot: _Pooled, conn: ReceiptConnection) -> None:
        """Hand over the connection's receipts until it ends (then it is repaired on demand)."""
        assert self._on_receipts is not None
        try:
            while True:
                self._on_receipts(await conn.receipts())
        except TransportError:
            if slot.receipts is conn:
                slot.receipts = None

    async def _close(self, slot: _Pooled) -> None:
        listener, slot.listener = slot.listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        stack, slot.stack, slot.connection, slot.receipts = slot.stack, None, None, None
        if stack is not None:
            # A connection that already broke may fail again while closing: it is gone either way.
            with contextlib.suppress(TransportError):
                await stack.aclose()

    def _live(self, slot: _Pooled) -> bool:
        return (slot.receipts if self._on_receipts is not None else slot.connection) is not None

    async def repair(self, *, attempt: int) -> None:
        """Reopen every broken connection (after a delay that grows with ``attempt``).

        Raises:
            TransportError: if the broker still cannot be reached.
        """
        await asyncio.sleep(_REPAIR_BACKOFF.ceiling(attempt))  # no jitter: the simulator replays exactly
        async with self._lock:
            for slot in self._slots:
                if not self._live(slot):
                    await self._close(slot)
                    await self._open(slot)
                    self.reconnects += 1

    async def publish(
        self, topic: str, payload: bytes, *, correlation: bytes | None = None, device: str | None = None
    ) -> None:
        """Publish on the least busy live connection; return after the broker's acknowledgement.

        With receipts, ``correlation`` (the report id) comes back in the commit receipt;
        ``device`` is not needed here (one broker).

        Raises:
            PublishRefusedError: the broker acknowledged it with a refusal (its ACL denies the
                topic, say); the connection stays in use.
            TransportError: if it was not acknowledged (the connection is marked broken).
        """
        async with self._free:
            live = [s for s in self._slots if self._live(s) and s.in_flight < self._window]
            if not live:
                raise TransportError("no live broker connection in the pool")
            slot = min(live, key=lambda s: s.in_flight)
            slot.in_flight += 1
            try:
                if slot.receipts is not None:
                    await slot.receipts.publish(topic, payload, correlation=correlation or b"")
                else:
                    assert slot.connection is not None
                    await slot.connection.publish(topic, payload)
            except PublishRefusedError:
                raise  # the broker dropped this message only; the connection stays usable
            except TransportError:
                slot.connection = slot.receipts = None
                raise
            finally:
                slot.in_flight -= 1


class DeviceTransport:
    """One device's view of the pool: its publisher "connects" by borrowing pooled connections."""

    def __init__(self, pool: Pool, on_ack: Callable[[bytes], None], *, device: str | None = None) -> None:
        self._pool = pool
        self._on_ack = on_ack
        self._device = device

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Connection]:
        yield _DeviceConnection(self._pool, self._on_ack, self._device)


class _DeviceConnection:
    def __init__(self, pool: Pool, on_ack: Callable[[bytes], None], device: str | None) -> None:
        self._pool = pool
        self._on_ack = on_ack
        self._device = device

    async def publish(self, topic: str, payload: bytes) -> None:
        await self._pool.publish(topic, payload, device=self._device)
        self._on_ack(payload)


# --------------------------------------------------------------------------- the devices
