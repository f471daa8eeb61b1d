"""Drains the outbox to the broker: connect on demand, publish, reconnect with backoff.

The publisher opens a connection only when reports wait (each connection has a fresh random
client identity), publishes them oldest first, and after each batch tells the agent which
ones the broker acknowledged; only those leave the outbox. When the broker cannot be
reached or stops acknowledging, it waits a capped, jittered, exponentially growing delay
and tries again with the same stored bytes: a retry never re-randomizes (STYLE rule 10).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from agent.clock import Clock
from agent.core import Agent, Pending
from agent.errors import TransportError
from agent.transport import Transport
from protocol.randomness import RandomSource, uniform_ints

__all__ = ["Backoff", "Publisher", "PublisherStats"]

log = logging.getLogger("ldp_agent.publisher")


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Capped exponential backoff with jitter ("equal jitter": half fixed, half random).

    Attributes:
        initial: the first delay's ceiling, in seconds.
        cap: the largest delay, in seconds.
    """

    initial: float = 1.0
    cap: float = 300.0

    def delay(self, attempt: int, rng: RandomSource) -> float:
        """The delay before retry number ``attempt`` (0-based)."""
        ceiling = min(self.cap, self.initial * 2.0 ** min(attempt, 62))
        fraction = int(uniform_ints(rng, 1_000_000, 1)[0]) / 1_000_000
        return ceiling / 2 + fraction * ceiling / 2


@dataclass(frozen=True, slots=True)
class PublisherStats:
    """A snapshot of the publisher's counters."""

    acknowledged: int
    failures: int
    connections: int


class Publisher:
    """Publishes the agent's outbox through a transport.

    Args:
        agent: the agent whose outbox is drained.
        transport: connections to the broker.
        clock: for backoff sleeps.
        rng: for backoff jitter.
        backoff: the retry policy.
    """

    def __init__(
        self, agent: Agent, transport: Transport, *, clock: Clock, rng: RandomSource, backoff: Backoff | None = None
    ) -> None:
        self._agent = agent
        self._transport = transport
        self._clock = clock
        self._rng = rng
        self._backoff = backoff or Backoff()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._acknowledged = 0
        self._failures = 0
        self._connections = 0

    def kick(self) -> None:
        """Reports were added to the outbox: publish them."""
        self._wake.set()
        self._idle.clear()

    def statistics(self) -> PublisherStats:
        """A frozen snapshot of the counters."""
        return PublisherStats(acknowledged=self._acknowledged, failures=self._failures, connections=self._connections)

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
        finally:
            # Persist acknowledgements even when cancelled (SIGTERM) or after a failure.
            self._agent.acknowledge(acked)
            self._acknowledged += len(acked)
        return len(acked)

    async def run(self) -> None:
        """Publish whenever kicked, until cancelled."""
        attempt = 0
        while True:
            if not self._agent.outbox():
                self._idle.set()
                await self._wake.wait()
            self._wake.clear()
            self._idle.clear()
            try:
                await self.drain_once()
                attempt = 0
            except TransportError as e:
                self._failures += 1
                delay = self._backoff.delay(attempt, self._rng)
                attempt += 1
                log.warning(
                    "publishing failed (%s); %d reports wait; retrying in %.2f s", e, self._agent.outbox_size, delay
                )
                self._idle.set()
                await self._clock.sleep(delay)
