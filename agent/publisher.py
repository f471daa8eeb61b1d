"""Drains the outbox to the broker: connect on demand, publish, reconnect with backoff.

The publisher opens a connection only when reports wait (each connection has a fresh random
client identity), publishes them oldest first, and after each batch tells the agent which
ones the broker acknowledged; only those leave the outbox. When the broker cannot be
reached or stops acknowledging, it waits a capped, jittered, exponentially growing delay
and tries again with the same stored bytes: a retry never re-randomizes (docs/design.md, convention 11).

With commit receipts (:class:`ReceiptPolicy`) a broker acknowledgement only marks a report
sent: the connection stays open, subscribed to its own receipt topic, and a report leaves
the outbox when the collector's receipt names it (counted or refused). A report without a
receipt after its wait (:func:`agent.outbox.receipt_wait`) is sent again, identical, on the
current connection. The connection closes when the outbox is empty; a broken one is
replaced, with backoff, by one with a new client id and so a new response topic (receipts
sent to the old one are lost; those reports are re-sent when their wait ends).

A send the broker refuses (MQTT 5 PUBACK >= 0x80, :class:`~agent.transport.PublishRefusedError`)
is not a broken connection: the ledger records "refused by the broker: <reason>", the report
waits its receipt wait before the next try (:func:`agent.outbox.mark_refused`), and the
other reports go on.

Reconnecting. The backoff starts again from its first step only after a connection that
delivered something (a report the broker acknowledged, or a receipt that settled one): a
broker that accepts connections and drops them at once is retried with growing waits, never
in a tight loop. A broker that says "not now" (:class:`~agent.transport.BrokerBusyError`:
CONNACK or DISCONNECT 0x88, 0x89, 0x97, 0x9F) makes the wait grow faster
(:meth:`runtime.backoff.Retry.next_delay`); the jitter, drawn from the agent's random source,
spreads a fleet's reconnects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from agent.core import Agent
from agent.errors import TransportError
from agent.outbox import Pending
from agent.transport import BrokerBusyError, PublishRefusedError, ReceiptConnection, ReceiptTransport, Transport
from protocol.randomness import RandomSource, uniform_draws
from runtime.backoff import Backoff, Retry
from runtime.clock import Clock

__all__ = ["Publisher", "PublisherStats", "ReceiptPolicy"]

log = logging.getLogger("ldp_agent.publisher")


def _end_if_cancelled() -> None:
    """Raise the cancellation an acknowledgement's wait dropped, if one did.

    aiomqtt waits for every acknowledgement through ``asyncio.wait_for``, which on Python 3.11
    returns the result and drops the cancellation when both arrive in the same turn of the event
    loop. The task still counts the request (``Task.cancelling()``), so it is raised here, after
    each publish and before each wait: otherwise SIGTERM's cancellation could be lost and the
    publisher wait for work while the daemon waits for it (tests/agent/test_publisher_cancel.py).
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _jitter(rng: RandomSource) -> Callable[[], float]:
    """Backoff jitter from the agent's random source, so tests with a seeded one replay exactly."""
    return lambda: uniform_draws(rng, 1_000_000, 1)[0] / 1_000_000


@dataclass(frozen=True, kw_only=True)
class ReceiptPolicy:
    """Waiting for commit receipts.

    Attributes:
        timeout: seconds after a send before a report without a receipt is sent again
            (doubling per send, jittered; :func:`agent.outbox.receipt_wait`).
        cap: the longest such wait.
    """

    timeout: float = 120.0
    cap: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 < self.timeout <= self.cap:
            raise ValueError(f"receipt timeout must be positive and at most the cap; got {self.timeout}, {self.cap}")


@dataclass(frozen=True, slots=True)
class PublisherStats:
    """A snapshot of the publisher's counters.

    Attributes:
        acknowledged: sends the broker acknowledged (resends included).
        failures: connections that failed or broke.
        connections: connections opened.
        settled: reports a commit receipt answered (counted or refused).
        refused_by_broker: sends the broker refused (PUBACK reason code >= 0x80).
    """

    acknowledged: int
    failures: int
    connections: int
    settled: int = 0
    refused_by_broker: int = 0


class Publisher:
    """Publishes the agent's outbox through a transport.

    Args:
        agent: the agent whose outbox is drained.
        transport: connections to the broker.
        clock: for backoff sleeps.
        rng: for backoff jitter.
        backoff: the retry policy.
        receipts: wait for commit receipts (the transport must be a
            :class:`~agent.transport.ReceiptTransport`); None: a broker acknowledgement is final.
    """

    def __init__(
        self,
        agent: Agent,
        transport: Transport,
        *,
        clock: Clock,
        rng: RandomSource,
        backoff: Backoff | None = None,
        receipts: ReceiptPolicy | None = None,
    ) -> None:
        if receipts is not None and not isinstance(transport, ReceiptTransport):
            raise TypeError(f"{type(transport).__name__} cannot receive commit receipts")
        self._agent = agent
        self._transport = transport
        self._clock = clock
        self._rng = rng
        self._receipt_transport = transport if isinstance(transport, ReceiptTransport) else None
        self._retry = Retry(backoff or Backoff(), jitter=_jitter(rng))
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._acknowledged = 0
        self._failures = 0
        self._connections = 0
        self._settled = 0
        self._refused = 0
        self._receipts = receipts

    def kick(self) -> None:
        """Reports were added to the outbox: publish them."""
        self._wake.set()
        self._idle.clear()

    def statistics(self) -> PublisherStats:
        """A frozen snapshot of the counters."""
        return PublisherStats(
            acknowledged=self._acknowledged,
            failures=self._failures,
            connections=self._connections,
            settled=self._settled,
            refused_by_broker=self._refused,
        )

    @property
    def idle(self) -> bool:
        """True while nothing is being published (outbox empty, or waiting out a backoff)."""
        return self._idle.is_set()

    async def drain_once(self) -> int:
        """One connection's worth of publishing.

        Returns:
            The number of reports acknowledged.

        Raises:
            TransportError: if connecting failed or a publish was not acknowledged (what was
                acknowledged before is already out of the outbox).
        """
        pending = self._agent.outbox()
        if not pending:
            return 0
        acked: list[Pending] = []
        try:
            async with self._transport.connect() as conn:
                self._connections += 1
                for p in pending:
                    await conn.publish(p.topic, p.entry.payload)
                    acked.append(p)
                    _end_if_cancelled()
        finally:
            # Persist acknowledgements even when cancelled (SIGTERM) or after a failure.
            self._agent.acknowledge(acked)
            self._acknowledged += len(acked)
        return len(acked)

    async def receipt_session(self) -> int:
        """One connection with commit receipts: send what is due, settle what is answered.

        Returns when the outbox is empty. The task that listens for receipts belongs to a task
        group of the connection's: it ends with it.

        Returns:
            The number of reports settled on this connection.

        Raises:
            TransportError: connecting failed, a publish was not acknowledged, or the
                connection ended (what was sent and settled before is already recorded).
        """
        policy = self._receipts
        transport = self._receipt_transport
        if policy is None or transport is None:
            raise RuntimeError("receipt_session without a receipt policy")
        if not self._agent.outbox():
            return 0
        settled_before = self._settled
        async with transport.connect_receipts() as conn:
            self._connections += 1
            failed: TransportError | None = None
            async with asyncio.TaskGroup() as tg:
                listener = tg.create_task(self._listen(conn), name="receipts")
                try:
                    await self._exchange(conn, listener, policy)
                except TransportError as e:
                    # Raised below, outside the group (a group would wrap it in an exception
                    # group), still inside the connection, which sees it as before.
                    failed = e
                finally:
                    listener.cancel()
            if failed is not None:
                raise failed
        return self._settled - settled_before

    async def _exchange(
        self, conn: ReceiptConnection, listener: asyncio.Task[TransportError], policy: ReceiptPolicy
    ) -> None:
        """Send what is due and wait for receipts, until nothing waits.

        Raises:
            TransportError: a publish was not acknowledged, or the connection ended.
        """
        while True:
            _end_if_cancelled()  # connecting may have dropped it
            self._wake.clear()
            if listener.done():
                raise listener.result()  # the connection ended
            due, later = self._agent.due(self._clock.time(), policy.timeout, policy.cap)
            if not due and later is None:
                return
            resends = sum(1 for p in due if p.entry.attempts)
            if resends:
                log.info("%d reports had no commit receipt in time; sending them again", resends)
            sent: list[Pending] = []
            refused: list[tuple[Pending, str]] = []
            try:
                for p in due:
                    try:
                        await conn.publish(p.topic, p.entry.payload, correlation=p.entry.report_id)
                    except PublishRefusedError as e:
                        refused.append((p, e.reason))
                        continue
                    sent.append(p)
                    _end_if_cancelled()
            finally:
                # Persist the sends even when cancelled (SIGTERM) or after a failure.
                self._agent.mark_sent(sent)
                self._agent.mark_refused(refused)
                self._acknowledged += len(sent)
                self._refused += len(refused)
            if due:
                continue  # a receipt may have settled everything while we sent
            await self._wait(later)

    async def _listen(self, conn: ReceiptConnection) -> TransportError:
        """Settle receipts as they arrive, until the connection ends.

        Returns:
            The error that ended the connection (the session raises it; a task of a group that
            raised would cancel the session at once, in the middle of a send).
        """
        while True:
            try:
                receipts = await conn.receipts()
            except TransportError as e:
                self._wake.set()
                return e
            settled = self._agent.settle(receipts)
            if settled:
                self._settled += settled
                self._wake.set()

    async def _wait(self, until: float | None) -> None:
        """Until a receipt or a new report arrives, the connection ends, or ``until``.

        Each of them sets the wake event: a receipt and the connection's end in :meth:`_listen`,
        a new report in :meth:`kick`, and ``until`` the alarm task this wait owns.
        """
        async with asyncio.TaskGroup() as tg:
            alarm = None if until is None else tg.create_task(self._alarm(until), name="receipt-wait")
            await self._wake.wait()
            if alarm is not None:
                alarm.cancel()

    async def _alarm(self, until: float) -> None:
        await self._clock.sleep_until(until)
        self._wake.set()

    async def run(self) -> None:
        """Publish whenever kicked, until cancelled."""
        while True:
            _end_if_cancelled()
            if not self._agent.outbox():
                self._idle.set()
                await self._wake.wait()
            self._wake.clear()
            self._idle.clear()
            delivered = self._acknowledged + self._settled
            try:
                if self._receipts is not None:
                    await self.receipt_session()
                else:
                    await self.drain_once()
                self._retry.reset()
            except TransportError as e:
                self._failures += 1
                if self._acknowledged + self._settled > delivered:
                    self._retry.reset()  # the connection delivered before it broke: the broker serves
                delay = self._retry.next_delay(busy=isinstance(e, BrokerBusyError))
                log.warning(
                    "publishing failed (%s); %d reports wait; retrying in %.2f s", e, self._agent.outbox_size, delay
                )
                self._idle.set()
                await self._clock.sleep(delay)
