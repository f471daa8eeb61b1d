"""A pipelined QoS 1 publisher on asyncio streams, for tests, benchmarks and load generation.

It publishes a stream of ``(topic, payload)`` pairs as fast as the broker acknowledges them:
up to ``window`` publishes in flight, and after a reconnect it resends every one not yet
acknowledged (flagged DUP), as an agent's outbox does. It speaks MQTT 5 or 3.1.1 with the
packets of :mod:`collector.mqtt.packets`. It is not product code (devices publish with the
agent); the benchmarks import it too, running from the repository root.
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
from collector.mqtt.packets import (
    CONNACK,
    DISCONNECT_PACKET,
    PUBACK,
    MqttProtocolError,
    connect_packet,
    decode_connack,
    permanent_refusal,
    publish_packet,
    split_packets,
)
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
                await self._session(reader, writer, state)
            except* (OSError, EOFError, TimeoutError, _ConnectionLostError, MqttProtocolError) as lost:
                # The session's task group reports the acknowledgement reader's end as a group.
                log.info("publisher connection lost (%s); reconnecting", lost.exceptions[0])
                await asyncio.sleep(retry.next_delay())
            else:
                retry.reset()
            finally:
                writer.close()
                with contextlib.suppress(OSError, TimeoutError):
                    await asyncio.wait_for(writer.wait_closed(), 1.0)
        return PublishStatistics(state.published, state.resent, state.connects, time.monotonic() - start)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _PublishState) -> None:
        writer.write(connect_packet(client_id=self.client_id, clean_start=True, keepalive=60, version=self.version))
        rest = b""
        while True:
            data = await asyncio.wait_for(reader.read(4096), _CONNECT_TIMEOUT)
            if not data:
                raise _ConnectionLostError("closed before CONNACK")
            packets, rest = split_packets(rest + data)
            if packets:
                break
        if packets[0][0] >> 4 != CONNACK:
            raise MqttProtocolError("expected CONNACK")
        self._check_accepted(packets[0][1])
        state.connects += 1
        # A new clean session: resend everything not yet acknowledged, flagged DUP.
        for packet in state.inflight.values():
            writer.write(bytes([packet[0] | 0x08]) + packet[1:])
            state.resent += 1
        acked = asyncio.Event()
        # The acknowledgement reader lives as long as this connection; its end (the broker
        # closing) cancels the publishing below and reaches publish_all through the group.
        async with asyncio.TaskGroup() as tasks:
            acks = tasks.create_task(self._read_acks(reader, state, acked), name="publisher-acks")
            while not state.finished:
                if not state.free or state.exhausted:
                    acked.clear()
                    await acked.wait()
                    continue
                writer.write(state.next_packets(self.version))
                await writer.drain()
            writer.write(DISCONNECT_PACKET)
            await writer.drain()
            acks.cancel()

    def _check_accepted(self, body: bytes) -> None:
        connack = decode_connack(body, version=self.version)
        if not connack.reason:
            return
        cause = permanent_refusal(connack.reason, version=self.version)
        if cause is not None:
            raise TransportError(f"the broker refused the connection: {cause} (reason code 0x{connack.reason:02x})")
        raise _ConnectionLostError(f"the broker refused the connection for now (reason code 0x{connack.reason:02x})")

    @staticmethod
    async def _read_acks(reader: asyncio.StreamReader, state: _PublishState, acked: asyncio.Event) -> None:
        tail = b""
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                raise _ConnectionLostError("closed by the broker")
            packets, tail = split_packets(tail + chunk)
            for first, body in packets:
                if first >> 4 == PUBACK:
                    if len(body) < 2:
                        raise MqttProtocolError("PUBACK shorter than its packet id")
                    state.release((body[0] << 8) | body[1])
            acked.set()


class _PublishState:
    """What a publisher run has sent and what still awaits acknowledgement, across reconnects."""

    def __init__(self, items: Iterator[tuple[str, bytes]], window: int, qos: int) -> None:
        self.items = items
        self.qos = qos
        self.inflight: dict[int, bytes] = {}  # packet id -> encoded PUBLISH (without DUP)
        self.free = collections.deque(range(1, window + 1))
        self.published = self.resent = self.connects = 0
        self.exhausted = False

    @property
    def finished(self) -> bool:
        return self.exhausted and not self.inflight

    def release(self, packet_id: int) -> None:
        if self.inflight.pop(packet_id, None) is not None:
            self.free.append(packet_id)

    def next_packets(self, version: int) -> bytes:
        out: list[bytes] = []
        while self.free and len(out) < 256:
            item = next(self.items, None)
            if item is None:
                self.exhausted = True
                break
            topic, payload = item
            self.published += 1
            if self.qos == 0:
                out.append(publish_packet(topic.encode(), payload, qos=0, version=version))
                continue
            pid = self.free.popleft()
            packet = publish_packet(topic.encode(), payload, qos=1, packet_id=pid, version=version)
            self.inflight[pid] = packet
            out.append(packet)
        return b"".join(out)
