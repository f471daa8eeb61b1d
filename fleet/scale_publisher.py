"""The scale mode's broker connections: pipelined MQTT 5 publishing with commit receipts.

The agent's MQTT transport (aiomqtt on paho) awaits each publish on its own and costs about
200 µs of CPU per report in the simulator's process (benchmarks/bench_fleet.py's scale row,
measured through it): more than everything else the scale mode does per report together. A
:class:`ReceiptPublisher` speaks the same protocol a device does, with the packets of
:mod:`collector.mqtt.packets`: one long-lived connection per publisher, authenticated as the
simulator's broker user (TLS and passwords from the same :class:`agent.config.BrokerConfig`),
subscribed first to its own receipt topic (``<receipt prefix><identity>/<client id>``,
protocol/receipts.py), then up to ``window`` QoS 1 PUBLISHes in flight, each with that
Response Topic and the report id as Correlation Data, written in batches and acknowledged
by PUBACK. Receipts arrive as QoS 0 PUBLISHes on the receipt topic.

A connection that ends fails the publisher with :class:`agent.errors.TransportError`; what it
had in flight is not acknowledged, so the caller can send it again (the collector drops a
second copy of a report id, docs/design.md §6.2).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import struct
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from agent.config import BrokerConfig, read_password, tls_context
from agent.errors import TransportError
from collector.mqtt.packets import (
    CONNACK,
    PUBACK,
    PUBLISH,
    SUBACK,
    MqttProtocolError,
    connect_packet,
    decode_connack,
    encode_varint,
    parse_properties,
    split_packets,
    subscribe_packet,
)
from protocol.receipts import MalformedReceiptError, Receipt, decode_receipts, receipt_topic

__all__ = ["Outgoing", "ReceiptPublisher"]

_CONNECT_TIMEOUT: Final = 30.0
_BATCH: Final = 256
"""PUBLISHes written at once before yielding to the acknowledgement reader."""
_SUBSCRIBE_ID: Final = 65535
"""The packet id of the receipt subscription (publishes use 1..window)."""


class Outgoing(Protocol):
    """What a publisher sends: a topic, the encoded report, and its id (the correlation data)."""

    @property
    def topic(self) -> str: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def report_id(self) -> bytes: ...


_u16 = struct.Struct(">H").pack
_SHORT_VARINTS: Final = tuple(encode_varint(n) for n in range(128))
"""The one-byte Variable Byte Integers: every property length and most packet lengths here."""


def _str16(data: bytes) -> bytes:
    return _u16(len(data)) + data


def _varint(value: int) -> bytes:
    return _SHORT_VARINTS[value] if value < 128 else encode_varint(value)


class ReceiptPublisher:
    """One pipelined MQTT 5 connection that publishes reports and hands over their receipts.

    Args:
        broker: where and how to connect (host, port, TLS, user name and password file).
        client_id: this connection's client id (its receipt topic names it).
        identity: the broker identity (the user name) the receipt topic is under; None anonymous.
        window: PUBLISHes in flight (at most 65,534).
        on_receipts: called with the receipts of each receipt message; None: no receipts asked.
    """

    def __init__(
        self,
        broker: BrokerConfig,
        *,
        client_id: str,
        identity: str | None,
        window: int,
        on_receipts: Callable[[list[Receipt]], None] | None,
    ) -> None:
        self._broker = broker
        self._client_id = client_id
        self._window = max(1, min(window, _SUBSCRIBE_ID - 1))
        self._on_receipts = on_receipts
        topic = receipt_topic(broker.receipt_prefix, identity, client_id)
        # The Response Topic property (0x08); the Correlation Data (0x09) follows per report.
        self._response = b"\x08" + _str16(topic.encode()) if on_receipts is not None else b""
        self._topic = topic
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._free: collections.deque[int] = collections.deque(range(1, self._window + 1))
        # Each PUBLISH in flight by packet id, with what to call at its PUBACK.
        self._inflight: dict[int, tuple[Outgoing, Callable[[Outgoing, int], None]]] = {}
        self._wake = asyncio.Event()
        self._subscribed = asyncio.Event()
        self._error: BaseException | None = None

    async def __aenter__(self) -> ReceiptPublisher:
        try:
            await asyncio.wait_for(self._open(), _CONNECT_TIMEOUT)
        except (OSError, TimeoutError, MqttProtocolError) as e:
            await self.__aexit__(None, None, None)
            raise TransportError(f"cannot connect to the broker: {e or type(e).__name__}") from None
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TransportError, OSError):
                await self._reader_task
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(self._writer.wait_closed(), 1.0)

    async def _open(self) -> None:
        b = self._broker
        context = tls_context(b)
        reader, writer = await asyncio.open_connection(
            b.host, b.port, ssl=context, server_hostname=b.host if context is not None else None
        )
        self._writer = writer
        password = read_password(b)
        writer.write(
            connect_packet(
                client_id=self._client_id,
                clean_start=True,
                keepalive=600,
                username=b.username,
                password=password.encode() if password is not None else None,
            )
        )
        rest = b""
        packets: list[tuple[int, bytes]] = []
        while not packets:
            data = await reader.read(4096)
            if not data:
                raise TransportError("the broker closed the connection before its CONNACK")
            packets, rest = split_packets(rest + data)
        first, body = packets[0]
        if first >> 4 != CONNACK:
            raise MqttProtocolError("expected CONNACK")
        reason = decode_connack(body).reason
        if reason:
            raise TransportError(f"the broker refused the connection (reason code 0x{reason:02x}: not authorised?)")
        self._reader_task = asyncio.create_task(self._read(reader, rest), name=f"scale-acks-{self._client_id}")
        if self._on_receipts is not None:
            writer.write(subscribe_packet(_SUBSCRIBE_ID, self._topic, qos=0))
            await self._until(self._subscribed)

    async def _until(self, event: asyncio.Event) -> None:
        """Wait for ``event`` unless the connection ends first."""
        assert self._reader_task is not None
        waiter = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({waiter, self._reader_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        self._check()

    def _check(self) -> None:
        if self._error is not None:
            raise TransportError(f"the broker connection ended: {self._error}") from None

    async def _read(self, reader: asyncio.StreamReader, rest: bytes) -> None:
        try:
            tail = rest
            while True:
                packets, tail = split_packets(tail)
                for first, body in packets:
                    self._packet(first, body)
                self._wake.set()
                chunk = await reader.read(1 << 16)
                if not chunk:
                    raise TransportError("closed by the broker")
                tail += chunk
        except (OSError, TransportError, MqttProtocolError, MalformedReceiptError) as e:
            self._error = e
            self._wake.set()
            self._subscribed.set()

    def _packet(self, first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == PUBACK:
            pid = (body[0] << 8) | body[1]
            sent = self._inflight.pop(pid, None)
            if sent is not None:
                self._free.append(pid)
                item, on_ack = sent
                on_ack(item, body[2] if len(body) > 2 else 0)
        elif kind == PUBLISH and self._on_receipts is not None:
            self._receipt(first, body)
        elif kind == SUBACK:
            if len(body) < 4 or body[-1] >= 0x80:
                raise TransportError("the broker refused the receipt subscription")
            self._subscribed.set()

    def _receipt(self, first: int, body: bytes) -> None:
        assert self._on_receipts is not None
        pos = 2 + ((body[0] << 8) | body[1])
        if (first >> 1) & 0x03:
            pos += 2  # a packet id: receipts come at QoS 0, as subscribed, but a QoS 1 copy is read too
        _, pos = parse_properties(body, pos, len(body))
        self._on_receipts(decode_receipts(body[pos:]))

    def _encode(self, item: Outgoing, pid: int) -> bytes:
        if self._response:
            rid = item.report_id
            props = b"".join((self._response, b"\x09", _u16(len(rid)), rid))
        else:
            props = b""
        topic = item.topic.encode()
        head = b"".join((_u16(len(topic)), topic, _u16(pid), _varint(len(props)), props))
        payload = item.payload
        return b"".join((b"\x32", _varint(len(head) + len(payload)), head, payload))  # PUBLISH, QoS 1

    async def publish_all(self, items: Sequence[Outgoing], on_ack: Callable[[Outgoing, int], None]) -> None:
        """Publish ``items``; ``on_ack(item, reason code)`` at each PUBACK; return when all are acknowledged.

        Raises:
            TransportError: the connection ended (items not acknowledged were not passed to ``on_ack``).
        """
        await self.write_all(items, on_ack)
        await self.settled()

    async def write_all(self, items: Sequence[Outgoing], on_ack: Callable[[Outgoing, int], None]) -> None:
        """Write ``items`` as PUBLISHes, each once a packet id of the window is free; return when
        all are written, their PUBACKs (``on_ack(item, reason code)`` each) still to come.

        Raises:
            TransportError: the connection ended.
        """
        writer = self._writer
        assert writer is not None
        pending = iter(items)
        exhausted = False
        while not exhausted:
            self._check()
            if not self._free:
                self._wake.clear()
                await self._until(self._wake)
                continue
            out: list[bytes] = []
            while self._free and len(out) < _BATCH:
                item = next(pending, None)
                if item is None:
                    exhausted = True
                    break
                pid = self._free.popleft()
                self._inflight[pid] = (item, on_ack)
                out.append(self._encode(item, pid))
            try:
                writer.write(b"".join(out))
                await writer.drain()
            except OSError as e:
                raise TransportError(f"the broker connection ended: {e}") from None

    async def settled(self) -> None:
        """Wait until every PUBLISH written has its PUBACK.

        Raises:
            TransportError: the connection ended first.
        """
        while self._inflight:
            self._check()
            self._wake.clear()
            await self._until(self._wake)
        self._check()
