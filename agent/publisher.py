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

Several brokers (``[broker] addresses``). The publisher holds one :class:`~agent.transport.Route`
per broker, in the device's order (:func:`agent.brokers.broker_order`: its primary first). A
round tries them in that order: when connecting fails or a connection is lost, the next broker
is tried at once; only when every broker of the round has failed does the backoff wait (the
same capped, jittered wait as with one broker, counted per round), and the next round starts
again at the primary. A session that ends because the outbox is empty ends the round, so every
round, and every new cycle's reports, start at the primary: a device goes back to its primary
as soon as it serves again, which keeps the fleet spread as the hash spreads it (a device that
stayed on its fallback would leave the fallback with the load of two brokers long after the
primary came back). The price is one failed connection attempt per round while the primary is
down.

A report sent through one broker waits for its receipt on that connection's response topic;
once that connection is gone the receipt cannot arrive. So after a failover the reports whose
last acknowledged send went through another broker are due at once on the new connection
(not after their receipt wait); the collector counts a report id once whichever broker
delivers it. Which broker carried each send is kept in memory: after a restart such reports
wait their receipt wait, as before. Reconnecting to the same broker keeps the receipt wait
(the collector may still be committing the report). The ledger records the broker of each
report's last acknowledged send, and of the connection its receipt came on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.core import Agent
from agent.errors import TransportError
from agent.outbox import Pending
from agent.transport import (
    BrokerBusyError,
    PublishRefusedError,
    ReceiptConnection,
    ReceiptTransport,
    Route,
    Transport,
    address_of,
)
from protocol.randomness import RandomSource, uniform_draws
from runtime.backoff import Backoff, Retry
from runtime.clock import Clock
from runtime.resources import ResourceErrors

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
        transport: connections to the broker, or one route per broker in the device's order
            (the primary first).
        clock: for backoff sleeps.
        rng: for backoff jitter.
        backoff: the retry policy.
        receipts: wait for commit receipts (the transport must be a
            :class:`~agent.transport.ReceiptTransport`); None: a broker acknowledgement is final.
    """

    def __init__(
        self,
        agent: Agent,
        transport: Transport | Sequence[Route],
        *,
        clock: Clock,
        rng: RandomSource,
        backoff: Backoff | None = None,
        receipts: ReceiptPolicy | None = None,
    ) -> None:
        routes = list(transport) if isinstance(transport, Sequence) else [Route(address_of(transport), transport)]
        if not routes:
            raise ValueError("no broker to publish through")
        for route in routes:
            if receipts is not None and not isinstance(route.transport, ReceiptTransport):
                raise TypeError(f"{type(route.transport).__name__} cannot receive commit receipts")
        self._agent = agent
        self._routes = routes
        self._clock = clock
        self._rng = rng
        self._in_use: str | None = None
        # Report id -> the broker that acknowledged its last send (see the module's docstring);
        # kept only with several brokers, where a report can move.
        self._carried_by: dict[bytes, str] = {}
        self._several = len(routes) > 1
        self._retry = Retry(backoff or Backoff(), jitter=_jitter(rng))
        self._resources = ResourceErrors(log)
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
    def brokers(self) -> tuple[str, ...]:
        """The brokers in the order they are tried, the primary first."""
        return tuple(r.broker for r in self._routes)

    @property
    def broker_in_use(self) -> str | None:
        """The broker of the open connection (None while none is open)."""
        return self._in_use

    @property
    def idle(self) -> bool:
        """True while nothing is being published (outbox empty, or waiting out a backoff)."""
        return self._idle.is_set()

    async def drain_once(self, route: Route | None = None) -> int:
        """One connection's worth of publishing (through ``route``; by default the primary).

        Returns:
            The number of reports acknowledged.

        Raises:
            TransportError: if connecting failed or a publish was not acknowledged (what was
                acknowledged before is already out of the outbox).
        """
        pending = self._agent.outbox()
        if not pending:
            return 0
        route = route or self._routes[0]
        acked: list[Pending] = []
        try:
            async with route.transport.connect() as conn:
                self._connections += 1
                self._in_use = route.broker
                for p in pending:
                    await conn.publish(p.topic, p.entry.payload)
                    acked.append(p)
                    _end_if_cancelled()
        finally:
            self._in_use = None
            # Persist acknowledgements even when cancelled (SIGTERM) or after a failure.
            self._agent.acknowledge(acked, broker=route.broker)
            self._acknowledged += len(acked)
        return len(acked)

    async def receipt_session(self, route: Route | None = None) -> int:
        """One connection with commit receipts (through ``route``; by default the primary): send
        what is due, settle what is answered.

        Returns when the outbox is empty. The task that listens for receipts belongs to a task
        group of the connection's: it ends with it.

        Returns:
            The number of reports settled on this connection.

        Raises:
            TransportError: connecting failed, a publish was not acknowledged, or the
                connection ended (what was sent and settled before is already recorded).
        """
        policy = self._receipts
        route = route or self._routes[0]
        transport = route.transport
        if policy is None or not isinstance(transport, ReceiptTransport):
            raise RuntimeError("receipt_session without a receipt policy")
        if not self._agent.outbox():
            return 0
        settled_before = self._settled
        try:
            async with transport.connect_receipts() as conn:
                self._connections += 1
                self._in_use = route.broker
                failed: TransportError | None = None
                async with asyncio.TaskGroup() as tg:
                    listener = tg.create_task(self._listen(conn, route.broker), name="receipts")
                    try:
                        await self._exchange(conn, listener, policy, route.broker)
                    except TransportError as e:
                        # Raised below, outside the group (a group would wrap it in an exception
                        # group), still inside the connection, which sees it as before.
                        failed = e
                    finally:
                        listener.cancel()
                if failed is not None:
                    raise failed
        finally:
            self._in_use = None
        return self._settled - settled_before

    async def _exchange(
        self, conn: ReceiptConnection, listener: asyncio.Task[TransportError], policy: ReceiptPolicy, broker: str
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
            due = self._with_moved(due, broker)
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
                        self._carried(p, broker)
                        continue
                    sent.append(p)
                    self._carried(p, broker)
                    _end_if_cancelled()
            finally:
                # Persist the sends even when cancelled (SIGTERM) or after a failure.
                self._agent.mark_sent(sent, broker=broker)
                self._agent.mark_refused(refused, broker=broker)
                self._acknowledged += len(sent)
                self._refused += len(refused)
            if due:
                continue  # a receipt may have settled everything while we sent
            await self._wait(later)

    def _carried(self, p: Pending, broker: str) -> None:
        """``broker`` acknowledged a send of ``p`` (remembered only with several brokers)."""
        if self._several:
            self._carried_by[p.entry.report_id] = broker

    def _with_moved(self, due: list[Pending], broker: str) -> list[Pending]:
        """``due`` and the reports whose last send another broker acknowledged: their receipts
        were to come on a connection that is gone, so they are sent again through ``broker`` now."""
        if not self._carried_by:
            return due
        waiting = self._agent.outbox()
        known = {p.entry.report_id for p in waiting}
        for report_id in [r for r in self._carried_by if r not in known]:
            del self._carried_by[report_id]  # settled or dropped: forget it
        chosen = {p.entry.report_id for p in due}
        moved = [
            p
            for p in waiting
            if p.entry.report_id not in chosen and self._carried_by.get(p.entry.report_id, broker) != broker
        ]
        if not moved:
            return due
        log.info(
            "%d reports sent through another broker wait for receipts; sending them again through %s",
            len(moved),
            broker,
        )
        return sorted([*due, *moved], key=lambda p: (p.entry.created, p.use_case))

    async def _listen(self, conn: ReceiptConnection, broker: str) -> TransportError:
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
            settled = self._agent.settle(receipts, broker=broker)
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
            try:
                await self._round()
                self._retry.reset()
                self._resources.succeeded("publish")
            except _RoundFailedError as failed:
                delay = self._retry.next_delay(busy=failed.busy)
                # Out of files or memory: not the broker's fault nor the config's; logged once
                # until a round succeeds, and retried like any failure (runtime/resources.py).
                if not self._resources.failed("publish", failed.last):
                    log.warning(
                        "publishing failed (%s); %d reports wait; retrying in %.2f s",
                        failed.last,
                        self._agent.outbox_size,
                        delay,
                    )
                self._idle.set()
                await self._clock.sleep(delay)

    async def _round(self) -> None:
        """One session through the first broker, in the device's order, that serves.

        Raises:
            _RoundFailedError: every broker failed (or the last failure left nothing to send).
        """
        busy = False
        for i, route in enumerate(self._routes):
            delivered = self._acknowledged + self._settled
            try:
                if self._receipts is not None:
                    await self.receipt_session(route)
                else:
                    await self.drain_once(route)
                return
            except TransportError as e:
                self._failures += 1
                if self._acknowledged + self._settled > delivered:
                    self._retry.reset()  # the connection delivered before it broke: the broker serves
                busy = busy or isinstance(e, BrokerBusyError)
                following = self._routes[i + 1] if i + 1 < len(self._routes) else None
                if following is None or not self._agent.outbox():
                    raise _RoundFailedError(e, busy=busy) from e
                log.warning("publishing through %s failed (%s); trying %s", route.broker, e, following.broker)


class _RoundFailedError(Exception):
    """Every broker of a round failed: the publisher waits its backoff.

    Attributes:
        last: the last broker's error.
        busy: a broker of the round said "not now" (the wait grows faster).
    """

    def __init__(self, last: TransportError, *, busy: bool) -> None:
        super().__init__(str(last))
        self.last = last
        self.busy = busy
