"""A scripted MQTT broker on loopback, for feeding the collector's client what no real broker sends.

It accepts any number of connections in a thread of its own. On each, it reads CONNECT,
answers CONNACK (with the reason code and properties a test gives), answers each SUBSCRIBE
with the reason code a test gives for each of its filters (QoS 1 granted by default), then
writes the test's bytes for that connection (``script[i]`` on the ``i``-th connection;
nothing on later ones) and keeps the connection open, answering PINGREQ, until the client
closes it. It records what it saw, so a test can wait for a reconnect or a PINGREQ.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from protocol.mqtt.packets import (
    CONNACK,
    CONNECT,
    PINGREQ,
    PINGRESP,
    SUBACK,
    SUBSCRIBE,
    encode_varint,
    publish_packet,
    split_packets,
)

__all__ = ["FakeBroker", "running_fake_broker"]


@dataclass
class FakeBroker:
    """What the fake broker saw; read it from the test thread."""

    script: Sequence[bytes]
    connack_properties: bytes = b""
    connack_reason: int = 0
    suback_code: int = 1
    hang_up_after_script: bool = False  # close the connection once its script is sent
    port: int = 0
    connections: int = 0
    pings: int = 0
    sent: list[int] = field(default_factory=list)  # bytes of script delivered, per connection
    closed_by_client: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    def wait_for(self, condition: Callable[[FakeBroker], bool], *, timeout: float = 30.0) -> None:
        """Poll ``condition`` until it holds; TimeoutError after ``timeout`` seconds (a hang guard)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if condition(self):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"fake broker: condition not met; saw {self.connections} connections")
            time.sleep(0.01)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        with self.lock:
            index = self.connections
            self.connections += 1
            self.sent.append(0)
        try:
            rest = await self._handshake(reader, writer)
            if rest is None:
                return
            if index < len(self.script):
                await self._send(writer, index, self.script[index])
                if self.hang_up_after_script:
                    return
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                packets, rest = split_packets(rest + data)
                for first, _ in packets:
                    if first >> 4 == PINGREQ:
                        with self.lock:
                            self.pings += 1
                        writer.write(bytes([PINGRESP << 4, 0]))
        except (ConnectionError, OSError):
            pass
        finally:
            with self.lock:
                self.closed_by_client += 1
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes | None:
        """CONNECT, then SUBSCRIBE: answer each; the bytes read past them (None: the client left)."""
        rest = b""
        subscribed = False
        while not subscribed:
            data = await reader.read(65536)
            if not data:
                return None
            packets, rest = split_packets(rest + data)
            for first, body in packets:
                if first >> 4 == CONNECT:
                    props = encode_varint(len(self.connack_properties)) + self.connack_properties
                    head = bytes([0, self.connack_reason])
                    writer.write(bytes([CONNACK << 4]) + encode_varint(2 + len(props)) + head + props)
                elif first >> 4 == SUBSCRIBE:
                    codes = bytes([self.suback_code]) * _filters(body)
                    writer.write(bytes([SUBACK << 4]) + encode_varint(3 + len(codes)) + body[:2] + b"\x00" + codes)
                    subscribed = True
        await writer.drain()
        return rest

    async def _send(self, writer: asyncio.StreamWriter, index: int, data: bytes) -> None:
        # In slices, so a client that refuses a huge packet early stops the flood early.
        step = 1 << 16
        for start in range(0, len(data), step):
            writer.write(data[start : start + step])
            await writer.drain()
            with self.lock:
                self.sent[index] += len(data[start : start + step])


@contextlib.contextmanager
def running_fake_broker(
    script: Sequence[bytes],
    *,
    connack_properties: bytes = b"",
    connack_reason: int = 0,
    suback_code: int = 1,
    hang_up_after_script: bool = False,
) -> Iterator[FakeBroker]:
    """A fake broker on 127.0.0.1 at a free port, serving ``script`` (one entry per connection)."""
    broker = FakeBroker(
        script=script,
        connack_properties=connack_properties,
        connack_reason=connack_reason,
        suback_code=suback_code,
        hang_up_after_script=hang_up_after_script,
    )
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop: asyncio.Event | None = None

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        server = await asyncio.start_server(broker._handle, "127.0.0.1", 0)
        broker.port = server.sockets[0].getsockname()[1]
        started.set()
        async with server:
            await stop.wait()
        # The server accepts nothing more, but a connection it accepted just before (a client
        # reconnecting as the test ends) may still be on its way to a handler (asyncio's
        # accept task, connection_made, the handler's first step): turn the loop until every
        # other task is a handler, so that each connection is closed below instead of being
        # left to the garbage collector, unclosed.
        me = asyncio.current_task()
        for _ in range(1000):
            if all(t in broker._tasks for t in asyncio.all_tasks() if t is not me):
                break
            await asyncio.sleep(0)
        for writer in list(broker._writers):
            writer.close()
        if broker._tasks:
            await asyncio.wait(broker._tasks, timeout=10)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    if not started.wait(10):
        raise TimeoutError("the fake broker did not start")
    try:
        yield broker
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def publish(topic: bytes, payload: bytes, *, qos: int = 1, packet_id: int = 1) -> bytes:
    """A well-formed PUBLISH (no properties)."""
    return publish_packet(topic, payload, qos=qos, packet_id=packet_id)


def _filters(body: bytes) -> int:
    """How many topic filters a SUBSCRIBE body (MQTT 5, as the collector writes it) carries."""
    i = 3 + body[2]  # packet id, property length, properties
    count = 0
    while i + 2 <= len(body):
        i += 2 + struct.unpack_from(">H", body, i)[0] + 1  # the filter and its options
        count += 1
    return count
