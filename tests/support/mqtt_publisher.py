"""A pipelined QoS 1 publisher on asyncio streams, for tests, benchmarks and load generation.

It publishes a stream of ``(topic, payload)`` pairs as fast as the broker acknowledges them:
up to ``window`` publishes in flight, and after a reconnect it resends every one not yet
acknowledged (flagged DUP), as an agent's outbox does. It speaks MQTT 5 or 3.1.1 through the
project's MQTT core in the publisher's role (:class:`protocol.mqtt.session.Session`). It is
not product code (devices publish with the agent); the benchmarks import it too, running from
the repository root.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from collector.errors import TransportError
from protocol.mqtt.events import ConnectionRefused, Disconnected
from protocol.mqtt.packets import MqttProtocolError
from protocol.mqtt.session import Session
from protocol.mqtt.states import Role, State
from runtime.backoff import Backoff, Retry

__all__ = ["MqttPublisher", "PublishStatistics"]

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT = 10.0


class _ConnectionLostError(Exception):
    """The connection ended (closed by the broker, or refused for now)."""


@dataclass(frozen=True, slots=True)
class PublishStatistics:
    """What a :class:`MqttPublisher` run did."""

    published: int
    resent: int
    connects: int
    seconds: float


class MqttPublisher:
    """Pipelined QoS 1 publishing with resend after reconnect (tests, benchmarks, load).

    Args:
        host: broker address.
        port: broker port.
        client_id: the client id (each connection uses a clean session).
        window: most unacknowledged publishes in flight.
        version: 5 (MQTT 5) or 4 (MQTT 3.1.1).
    """

    def __init__(self, host: str, port: int, *, client_id: str, window: int = 2000, version: int = 5) -> None:
        if version not in (4, 5):
            raise ValueError(f"version must be 4 or 5; got {version}")
        self.host = host
        self.port = port
        self.client_id = client_id
        self.window = min(window, 65535)
        self.version = version

    async def publish_all(
        self, messages: Iterable[tuple[str, bytes]], *, qos: int = 1, deadline_s: float = 600.0
    ) -> PublishStatistics:
        """Publish every ``(topic, payload)``; return once the broker has acknowledged all of them.

        Raises:
            TimeoutError: not all acknowledged within ``deadline_s``.
            TransportError: the broker refused the connection in a way retrying cannot fix.
        """
        start = time.monotonic()
        state = _PublishState(iter(messages), self.window, qos)
        session = Session(Role.PUBLISHER, version=self.version)
        retry = Retry(Backoff(initial=0.05, cap=2.0))
        while not state.finished:
            if time.monotonic() - start > deadline_s:
                raise TimeoutError(f"publishing did not finish in {deadline_s} s")
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), _CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                log.info("publisher cannot connect (%s); retrying", exc or type(exc).__name__)
                await asyncio.sleep(retry.next_delay())
                continue
            try:
                await self._connection(reader, writer, session, state)
            except* (OSError, EOFError, TimeoutError, _ConnectionLostError, MqttProtocolError) as lost:
                # The connection's task group reports the acknowledgement reader's end as a group.
                log.info("publisher connection lost (%s); reconnecting", lost.exceptions[0])
                await asyncio.sleep(retry.next_delay())
            else:
                retry.reset()
            finally:
                session.connection_lost()
                writer.close()
                with contextlib.suppress(OSError, TimeoutError):
                    await asyncio.wait_for(writer.wait_closed(), 1.0)
        return PublishStatistics(state.published, state.resent, state.connects, time.monotonic() - start)

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session: Session, state: _PublishState
    ) -> None:
        writer.write(session.connect(client_id=self.client_id, clean_start=True, keepalive=60))
        event = None
        while event is None:
            data = await asyncio.wait_for(reader.read(4096), _CONNECT_TIMEOUT)
            if not data:
                raise _ConnectionLostError("closed before CONNACK")
            session.receive_data(data)
            event = session.next_event()
        if isinstance(event, ConnectionRefused):
            if event.permanent_cause is not None:
                raise TransportError(
                    f"the broker refused the connection: {event.permanent_cause} (reason code 0x{event.reason:02x})"
                )
            raise _ConnectionLostError(f"the broker refused the connection for now (reason code 0x{event.reason:02x})")
        state.connects += 1
        # A new clean session: resend everything not yet acknowledged, flagged DUP.
        for pid, (topic, payload) in state.inflight.items():
            writer.write(session.publish(topic, payload, qos=1, packet_id=pid, dup=True))
            state.resent += 1
        acked = asyncio.Event()
        # The acknowledgement reader lives as long as this connection; its end (the broker
        # closing) cancels the publishing below and reaches publish_all through the group.
        async with asyncio.TaskGroup() as tasks:
            acks = tasks.create_task(self._read_acks(reader, session, state, acked), name="publisher-acks")
            while not state.finished:
                if not state.free or state.exhausted:
                    acked.clear()
                    await acked.wait()
                    continue
                writer.write(state.next_packets(session))
                await writer.drain()
            if session.state is not State.CLOSED:
                writer.write(session.disconnect())
                await writer.drain()
            acks.cancel()

    @staticmethod
    async def _read_acks(
        reader: asyncio.StreamReader, session: Session, state: _PublishState, acked: asyncio.Event
    ) -> None:
        while True:
            while (event := session.next_event()) is not None:
                if isinstance(event, Disconnected):
                    raise _ConnectionLostError(f"the broker sent DISCONNECT (reason code 0x{event.reason:02x})")
            for ack in session.take_acknowledgements():
                state.release(ack.packet_id)
            acked.set()
            chunk = await reader.read(1 << 16)
            if not chunk:
                raise _ConnectionLostError("closed by the broker")
            session.receive_data(chunk)


class _PublishState:
    """What a publisher run has sent and what still awaits acknowledgement, across reconnects."""

    def __init__(self, items: Iterator[tuple[str, bytes]], window: int, qos: int) -> None:
        self.items = items
        self.qos = qos
        self.inflight: dict[int, tuple[bytes, bytes]] = {}  # packet id -> (topic, payload)
        self.free = collections.deque(range(1, window + 1))
        self.published = self.resent = self.connects = 0
        self.exhausted = False

    @property
    def finished(self) -> bool:
        return self.exhausted and not self.inflight

    def release(self, packet_id: int) -> None:
        if self.inflight.pop(packet_id, None) is not None:
            self.free.append(packet_id)

    def next_packets(self, session: Session) -> bytes:
        out: list[bytes] = []
        while self.free and len(out) < 256:
            item = next(self.items, None)
            if item is None:
                self.exhausted = True
                break
            topic, payload = item[0].encode(), item[1]
            self.published += 1
            if self.qos == 0:
                out.append(session.publish(topic, payload))
                continue
            pid = self.free.popleft()
            self.inflight[pid] = (topic, payload)
            out.append(session.publish(topic, payload, qos=1, packet_id=pid))
        return b"".join(out)
