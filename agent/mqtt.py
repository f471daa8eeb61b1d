"""MQTT transport (aiomqtt 2.5): the only module of the agent that imports the MQTT library.

Each connection uses a fresh random client identifier (no link between one device's
connections), a clean session, QoS 1, and TLS with username/password or a client
certificate. Reconnection and backoff live outside the client, in :mod:`agent.publisher`.

Acknowledgement. aiomqtt 2.5's ``Client.publish`` hands the message to paho-mqtt and, unless
paho reports it published at once, waits on an event that its ``on_publish`` callback sets.
paho-mqtt 2.x calls ``on_publish`` for a QoS 1 message only from its PUBACK handler
(``_handle_pubackcomp``); for QoS 0 it fires when the packet is written. So for QoS 1 the
awaited call returns only after the broker's PUBACK, and raises ``MqttError`` ("Operation
timed out", or a code error when the connection is gone) otherwise; the 2.5.1 changelog
made timeouts raise ``MqttError`` rather than ``asyncio.TimeoutError``. A report leaves
the outbox only when this call returns. A PUBACK carries no refusal in MQTT 3.1.1 (the
protocol version used here), so a broker that silently drops an unauthorized publish
cannot be detected by any client; the collector's de-duplication by report id makes the
at-least-once retries harmless.

Commit receipts (``[broker] receipts = true``) need MQTT 5: such a connection subscribes to
``<receipt_prefix><client id>`` (QoS 0; the broker ACL lets only this client id read it)
before it publishes anything, and each PUBLISH carries that Response Topic and the report id
as Correlation Data (paho's ``Properties(PacketTypes.PUBLISH)``). The session is not kept
(clean start, no expiry): a receipt sent after the connection ended is lost, and the report
is sent again after its timeout. An MQTT 5 PUBACK may carry a refusal (0x87 "not
authorized"), but aiomqtt 2.5's ``_on_publish`` drops the reason code; with receipts that
costs nothing in correctness: a refused message gets no receipt, so the report stays in the
outbox and is resent with backoff (and dropped at ``outbox_max_age_days``, as any report).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.config import BrokerConfig, read_password, tls_context
from agent.errors import TransportError
from agent.transport import Connection, ReceiptConnection
from protocol.randomness import RandomSource
from protocol.receipts import MalformedReceiptError, Receipt, decode_receipts

__all__ = ["MqttTransport", "random_client_id"]

log = logging.getLogger("ldp_agent.mqtt")


def random_client_id(rng: RandomSource) -> str:
    """A fresh 88-bit client identifier (22 hex digits: within MQTT 3.1.1's 23-character limit)."""
    words = rng.draw(2)
    return f"{int(words[0]):016x}{int(words[1]) >> 40:06x}"


class _MqttConnection:
    def __init__(self, client: aiomqtt.Client, timeout: float) -> None:
        self._client = client
        self._timeout = timeout

    async def publish(self, topic: str, payload: bytes) -> None:
        try:
            await self._client.publish(topic, payload, qos=1, retain=False, timeout=self._timeout)
        except aiomqtt.MqttError as e:
            raise TransportError(f"publish to {topic} not acknowledged: {e}") from e


class _MqttReceiptConnection:
    def __init__(self, client: aiomqtt.Client, timeout: float, response_topic: str) -> None:
        self._client = client
        self._timeout = timeout
        self._topic = response_topic
        self._messages = aiter(client.messages)

    @property
    def response_topic(self) -> str:
        return self._topic

    async def publish(self, topic: str, payload: bytes, *, correlation: bytes) -> None:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = self._topic
        props.CorrelationData = correlation
        try:
            await self._client.publish(topic, payload, qos=1, retain=False, properties=props, timeout=self._timeout)
        except aiomqtt.MqttError as e:
            raise TransportError(f"publish to {topic} not acknowledged: {e}") from e

    async def receipts(self) -> list[Receipt]:
        while True:
            try:
                message = await anext(self._messages)
            except (aiomqtt.MqttError, StopAsyncIteration) as e:
                raise TransportError(f"receipt subscription ended: {e}") from e
            payload = message.payload
            if not isinstance(payload, bytes | bytearray):
                continue
            try:
                return decode_receipts(bytes(payload))
            except MalformedReceiptError as e:
                # Only the collector may write here (broker ACL); still, a bad message is
                # skipped, never trusted: the reports it names stay and are re-sent.
                log.warning("ignored a malformed receipt message: %s", e.reason)


class MqttTransport:
    """Connections to the configured broker.

    Args:
        cfg: the ``[broker]`` section.
        rng: the source of client identifiers.
    """

    def __init__(self, cfg: BrokerConfig, rng: RandomSource) -> None:
        self._cfg = cfg
        self._rng = rng

    def _client(self, identifier: str, *, v5: bool) -> aiomqtt.Client:
        cfg = self._cfg
        # A CA, key or password file gone since start-up is the operator's to fix: ConfigError
        # (naming the field and the file) ends the daemon instead of a retry loop.
        tls = tls_context(cfg)
        if v5:
            return aiomqtt.Client(
                cfg.host,
                cfg.port,
                identifier=identifier,
                username=cfg.username,
                password=read_password(cfg),
                tls_context=tls,
                keepalive=cfg.keepalive,
                protocol=aiomqtt.ProtocolVersion.V5,
                clean_start=True,
                timeout=cfg.publish_timeout,
                logger=log,
            )
        return aiomqtt.Client(
            cfg.host,
            cfg.port,
            identifier=identifier,
            username=cfg.username,
            password=read_password(cfg),
            tls_context=tls,
            keepalive=cfg.keepalive,
            clean_session=True,
            timeout=cfg.publish_timeout,
            logger=log,
        )

    @contextlib.asynccontextmanager
    async def connect_receipts(self) -> AsyncIterator[ReceiptConnection]:
        """Connect (MQTT 5) with a fresh identity and subscribe to its own receipt topic first."""
        cfg = self._cfg
        identifier = random_client_id(self._rng)
        topic = cfg.receipt_prefix + identifier
        client = self._client(identifier, v5=True)
        entered = False
        try:
            async with client:
                entered = True
                # Subscribed before the first publish, so no receipt can come before we listen.
                granted = await client.subscribe(topic, qos=0, timeout=cfg.publish_timeout)
                if any((code if isinstance(code, int) else code.value) >= 0x80 for code in granted):
                    raise TransportError(f"the broker refused the receipt subscription {topic} (check its ACL)")
                yield _MqttReceiptConnection(client, cfg.publish_timeout, topic)
        except aiomqtt.MqttError as e:
            what = "connection lost" if entered else "cannot connect"
            raise TransportError(f"{what} ({cfg.host}:{cfg.port}): {e}") from e

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Connection]:
        """Connect with a fresh identity; the connection closes when the block ends."""
        cfg = self._cfg
        client = self._client(random_client_id(self._rng), v5=False)
        entered = False
        try:
            async with client:
                entered = True
                yield _MqttConnection(client, cfg.publish_timeout)
        except aiomqtt.MqttError as e:
            what = "connection lost" if entered else "cannot connect"
            raise TransportError(f"{what} ({cfg.host}:{cfg.port}): {e}") from e
