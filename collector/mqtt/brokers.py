"""Several brokers, one transport: a session on each broker feeding one ingest.

A fleet spread over several independent brokers (each device pinned to one and failing over
to the next) is drained by collectors that subscribe to every broker: each member of a group
holds one :class:`~collector.mqtt.MqttTransport` per broker, each in the shared group on its
broker, and ingest sees them as one :class:`~collector.transport.Transport`.

What stays per connection:

* **Acknowledgements.** A token carries the index of the broker that gave it out
  (:func:`collector.transport.route_of`); :meth:`BrokerSet.ack` splits a commit's tokens and
  sends each PUBACK on the connection that delivered the message, after the commit, as with
  one broker.
* **Receipts.** Ingest groups a commit's receipts by the route of the reports they answer
  and :meth:`BrokerSet.send_receipts` publishes them through that broker: the one the device
  is connected to, whose ACL lets it read its receipt topic.
* **Exactly once across brokers.** Nothing here de-duplicates: a report delivered through two
  brokers (a device that failed over before its receipt came) carries one report id, and the
  store refuses an id it holds, so the second delivery is counted as a duplicate and answered
  "counted" like the first (collector/ingest.py, step 6).

A broker that is down costs only its own session: the others go on delivering, and its
session reconnects with its own backoff (``/healthz`` says "degraded", docs/deploy.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from collector.config import MqttConfig
from collector.mqtt.transport import READ_PAUSE_S, BrokerConnector, MqttTransport
from collector.transport import BrokerStatistics, Delivery, TransportStatistics, route_of
from protocol.mqtt.events import packet_id_of
from protocol.receipts import Receipt
from runtime.resources import ResourceErrors

__all__ = ["BrokerSet"]


class BrokerSet:
    """One MQTT session per broker of ``config.brokers``, seen by ingest as one transport.

    Run :meth:`run` as a task (it runs every session and returns when all have ended); call
    :meth:`receive`, :meth:`ack` and :meth:`send_receipts` from the ingest task.

    Args:
        config: the ``[mqtt]`` section; ``config.brokers`` gives one config per broker.
        read_pause_s: passed to each session (:data:`collector.mqtt.READ_PAUSE_S`).
        open_connection: opens each connection (tests pass their own; by default each session
            builds its TLS context once, here).
        sleep: waits out each reconnect delay.
        resources: counts the connections that failed for want of a system resource.
    """

    def __init__(
        self,
        config: MqttConfig,
        *,
        read_pause_s: float = READ_PAUSE_S,
        open_connection: BrokerConnector | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        resources: ResourceErrors | None = None,
    ) -> None:
        self.config = config
        self._ready = asyncio.Event()
        self.sessions = tuple(
            MqttTransport(
                broker,
                read_pause_s=read_pause_s,
                open_connection=open_connection,
                sleep=sleep,
                route=route,
                ready=self._ready,
                resources=resources,
            )
            for route, broker in enumerate(config.brokers)
        )
        self._next = 0  # the session a receive starts with, so no broker's messages starve

    # -- ingest side ---------------------------------------------------------------------

    async def receive(self, max_count: int) -> list[Delivery]:
        """Wait until any session has deliveries; return up to ``max_count``, taken in turn."""
        sessions = self.sessions
        if len(sessions) == 1:
            return await sessions[0].receive(max_count)
        while not any(s.buffered for s in sessions):
            self._ready.clear()
            await self._ready.wait()
        out: list[Delivery] = []
        n = len(sessions)
        start = self._next
        self._next = (start + 1) % n
        for k in range(n):
            room = max_count - len(out)
            if room <= 0:
                break
            out.extend(sessions[(start + k) % n].take(room))
        return out

    def ack(self, tokens: Sequence[int]) -> None:
        """Send each PUBACK on the connection that delivered its message."""
        sessions = self.sessions
        if len(sessions) == 1:
            sessions[0].ack(tokens)
            return
        by_route: dict[int, list[int]] = {}
        for token in tokens:
            if packet_id_of(token):  # a QoS 0 message needs no acknowledgement
                by_route.setdefault(route_of(token), []).append(token)
        for route, group in by_route.items():
            sessions[route].ack(group)

    def send_receipts(self, receipts: Mapping[bytes, Sequence[Receipt]], *, route: int = 0) -> None:
        """Publish receipts through broker ``route``, the one that delivered their reports
        (:func:`~collector.transport.route_of` their tokens)."""
        self.sessions[route].send_receipts(receipts)

    def statistics(self) -> TransportStatistics:
        """The sessions' counters summed, with each broker's own under ``brokers``.

        ``connected`` is true only while every broker's session is up.
        """
        parts = [s.statistics() for s in self.sessions]
        if len(parts) == 1:
            return parts[0]
        counters: dict[str, float] = {}
        for p in parts:
            for topic, value in p.broker.items():
                counters[topic] = counters.get(topic, 0.0) + value
        return TransportStatistics(
            connected=all(p.connected for p in parts),
            connects=sum(p.connects for p in parts),
            buffered=sum(p.buffered for p in parts),
            capacity=sum(p.capacity for p in parts),
            unacked=sum(p.unacked for p in parts),
            received=sum(p.received for p in parts),
            acked=sum(p.acked for p in parts),
            stale_acks=sum(p.stale_acks for p in parts),
            dropped=sum(p.dropped for p in parts),
            protocol_errors=sum(p.protocol_errors for p in parts),
            over_receive_maximum=sum(p.over_receive_maximum for p in parts),
            receipts_sent=sum(p.receipts_sent for p in parts),
            receipts_dropped=sum(p.receipts_dropped for p in parts),
            broker=counters,
            brokers=tuple(b for p in parts for b in p.brokers),
        )

    def broker_statistics(self) -> tuple[BrokerStatistics, ...]:
        """Each broker's connection, in the order of ``mqtt.addresses``."""
        return tuple(s.broker_statistics() for s in self.sessions)

    # -- connection side -----------------------------------------------------------------

    async def run(self) -> None:
        """Run every session until all have ended (:meth:`close`).

        Raises:
            collector.errors.TransportError: a broker refused us for good (the other
                sessions are ended with it: a config that one broker refuses is wrong).
        """
        if len(self.sessions) == 1:
            await self.sessions[0].run()
            return
        try:
            async with asyncio.TaskGroup() as tasks:
                for session in self.sessions:
                    tasks.create_task(session.run(), name=f"mqtt-{session.address}")
        except ExceptionGroup as group:
            # Raised as itself, as with one broker: the CLI maps TransportError to its exit status.
            raise group.exceptions[0] from None

    async def wait_subscribed(self) -> None:
        """Return once every broker has granted the subscription."""
        for session in self.sessions:
            await session.wait_subscribed()

    async def wait_serving(self) -> None:
        """Return once any broker has granted the subscription (the member is serving then)."""
        waits = [asyncio.create_task(s.wait_subscribed(), name=f"mqtt-serving-{s.address}") for s in self.sessions]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # The waits end here, whatever ends this one: no task outlives its owner (docs/design.md, convention 12).
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def close(self) -> None:
        """Disconnect every session politely; :meth:`run` returns."""
        await asyncio.gather(*(s.close() for s in self.sessions))
