"""The scale mode's broker connections: pipelined MQTT 5 publishing with commit receipts.

The agent's MQTT transport (aiomqtt on paho) awaits each publish on its own, and its cost
per report in the simulator's process is more than everything else the scale mode does per
report together (the README's "Scale mode" compares the two). A :class:`ReceiptPublisher` speaks the
same protocol a device does through the project's MQTT core in the publisher's role
(:class:`protocol.mqtt.session.Session`): one long-lived connection per publisher,
authenticated as the simulator's broker user (TLS and passwords from the same
:class:`agent.config.BrokerConfig`), subscribed first to its own receipt topic
(``<receipt prefix><identity>/<client id>``, protocol/receipts.py), then up to ``window``
QoS 1 PUBLISHes in flight, each with that Response Topic and the report id as Correlation
Data, written in batches and acknowledged by PUBACK. Receipts arrive as QoS 0 PUBLISHes on the
receipt topic.

A connection that ends fails the publisher with :class:`agent.errors.TransportError`; what it
had in flight is not acknowledged, so the caller can send it again (the collector drops a
second copy of a report id, docs/design.md §6.2). The task that reads the broker's packets
belongs to the publisher's own task group, open while the publisher is (docs/design.md,
convention 12).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from agent.config import BrokerConfig, read_password, tls_context
from agent.errors import TransportError
from protocol.mqtt.events import ConnectionRefused, Disconnected, Event, Subscribed
from protocol.mqtt.packets import MqttProtocolError, RequestProperties, publish_packet
from protocol.mqtt.reasons import is_failure
from protocol.mqtt.session import Session
from protocol.mqtt.states import Role
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
        self._topic = receipt_topic(broker.receipt_prefix, identity, client_id)
        # The receipt request each report carries: Response Topic, and its id as Correlation Data.
        self._request = RequestProperties(self._topic.encode()) if on_receipts is not None else None
        self._session = Session(Role.PUBLISHER)
        self._stack: contextlib.AsyncExitStack | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader: asyncio.Task[None] | None = None
        self._free: collections.deque[int] = collections.deque(range(1, self._window + 1))
        # Each PUBLISH in flight by packet id, with what to call at its PUBACK.
        self._inflight: dict[int, tuple[Outgoing, Callable[[Outgoing, int], None]]] = {}
        self._wake = asyncio.Event()
        self._subscribed = asyncio.Event()
        self._error: BaseException | None = None

    async def __aenter__(self) -> ReceiptPublisher:
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            # The reader task's owner; _stop (run first on the way out) cancels the reader, and
            # leaving the group then waits for it, so no task outlives the publisher.
            tasks = await stack.enter_async_context(asyncio.TaskGroup())
            stack.push_async_callback(self._stop)
            async with asyncio.timeout(_CONNECT_TIMEOUT):
                await self._open(tasks)
        except BaseException as e:
            # Closed without the exception: a task group handed one would wrap it in a group.
            await stack.aclose()
            if isinstance(e, OSError | TimeoutError | MqttProtocolError):
                raise TransportError(f"cannot connect to the broker: {e or type(e).__name__}") from None
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def _stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(self._writer.wait_closed(), 1.0)

    async def _open(self, tasks: asyncio.TaskGroup) -> None:
        b = self._broker
        context = tls_context(b)
        reader, writer = await asyncio.open_connection(
            b.host, b.port, ssl=context, server_hostname=b.host if context is not None else None
        )
        self._writer = writer
        password = read_password(b)
        session = self._session
        writer.write(
            session.connect(
                client_id=self._client_id,
                clean_start=True,
                keepalive=600,
                username=b.username,
                password=password.encode() if password is not None else None,
            )
        )
        event = None
        while event is None:
            data = await reader.read(4096)
            if not data:
                raise TransportError("the broker closed the connection before its CONNACK")
            session.receive_data(data)
            event = session.next_event()
        if isinstance(event, ConnectionRefused):
            raise TransportError(
                f"the broker refused the connection (reason code 0x{event.reason:02x}: not authorised?)"
            )
        self._reader = tasks.create_task(self._read(reader), name=f"scale-acks-{self._client_id}")
        if self._on_receipts is not None:
            writer.write(session.subscribe(_SUBSCRIBE_ID, [(self._topic, 0)]))
            await self._subscribed.wait()
            self._check()

    def _check(self) -> None:
        if self._error is not None:
            raise TransportError(f"the broker connection ended: {self._error}") from None

    async def _read(self, reader: asyncio.StreamReader) -> None:
        """Hand over the broker's PUBACKs and receipts as they come, until the connection ends.

        An expected end (closed, broken, refused) is kept for the writers to raise; the events
        are set whatever ends the reader, so that no writer waits for ever.
        """
        session = self._session
        try:
            while True:
                try:
                    while (event := session.next_event()) is not None:
                        self._on_event(event)
                finally:
                    # What came before a bad packet or a DISCONNECT is handed over.
                    self._hand_over()
                self._wake.set()
                chunk = await reader.read(1 << 16)
                if not chunk:
                    raise TransportError("closed by the broker")
                session.receive_data(chunk)
        except (OSError, TransportError, MqttProtocolError, MalformedReceiptError) as e:
            self._error = e
        finally:
            self._wake.set()
            self._subscribed.set()

    def _on_event(self, event: Event) -> None:
        if isinstance(event, Subscribed):
            if any(is_failure(code) for code in event.reasons):
                raise TransportError("the broker refused the receipt subscription")
            self._subscribed.set()
        elif isinstance(event, Disconnected):
            raise TransportError(f"the broker sent DISCONNECT (reason code 0x{event.reason:02x})")

    def _hand_over(self) -> None:
        """Call each PUBACK's ``on_ack`` (its packet id is free again), then pass the receipts on."""
        session = self._session
        inflight, free = self._inflight, self._free
        for pid, reason in session.take_acknowledgements():
            item, on_ack = inflight.pop(pid)
            free.append(pid)
            on_ack(item, reason)
        deliveries = session.take_deliveries()
        if self._on_receipts is not None:
            for delivery in deliveries:
                self._on_receipts(decode_receipts(delivery.payload))

    def _properties(self, item: Outgoing) -> bytes:
        """The receipt request of ``item`` (Response Topic and its report id), or none."""
        return self._request(item.report_id) if self._request is not None else b""

    def _encode(self, item: Outgoing, pid: int) -> bytes:
        """The PUBLISH that carries ``item`` under packet id ``pid``: what :meth:`write_all` writes
        through the session (tests/fleet/test_scale_bytes.py pins these bytes)."""
        return publish_packet(
            item.topic.encode(), item.payload, qos=1, packet_id=pid, properties=self._properties(item)
        )

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
        # Looked up once: the loop below runs once per report.
        publish, request, free, inflight = self._session.publish, self._request, self._free, self._inflight
        pending = iter(items)
        exhausted = False
        while not exhausted:
            self._check()
            if not self._free:
                self._wake.clear()
                await self._wake.wait()
                continue
            out: list[bytes] = []
            while free and len(out) < _BATCH:
                item = next(pending, None)
                if item is None:
                    exhausted = True
                    break
                pid = free.popleft()
                inflight[pid] = (item, on_ack)
                props = request(item.report_id) if request is not None else b""
                out.append(publish(item.topic.encode(), item.payload, qos=1, packet_id=pid, properties=props))
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
            await self._wake.wait()
        self._check()
