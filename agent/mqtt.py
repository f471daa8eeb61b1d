"""MQTT transport (aiomqtt 2.5): the agent's connections to its broker.

This module and :mod:`agent.aiomqtt_hooks` are the only modules of the agent that import the
MQTT library; this one uses aiomqtt's public API only, the hooks module the two private
handlers the agent needs (docs/design.md, convention 15).

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
the outbox only when this call returns; the collector's de-duplication by report id makes
the at-least-once retries harmless.

Commit receipts (``[broker] receipts = true``) need MQTT 5: such a connection subscribes to
its own receipt topic, ``<receipt_prefix><identity>/<client id>`` (``<receipt_prefix><client
id>`` for an anonymous test broker; QoS 0; the broker ACL lets only this user and client id
read it, docs/wire-format.md), before it publishes anything, and each PUBLISH carries that
Response Topic and the report id as Correlation Data (paho's ``Properties(PacketTypes.PUBLISH)``).
The session is not kept (clean start, no expiry): a receipt sent after the connection ended is
lost, and the report is sent again after its timeout.

The broker's word. Such a connection publishes through
:meth:`agent.aiomqtt_hooks.HookedClient.publish_checked`, which returns the PUBACK's reason
code and cuts a publish short when the broker disconnects: a refusal (0x87 "not authorized"
when the ACL denies the topic) raises :class:`~agent.transport.PublishRefusedError`, and a
CONNACK or DISCONNECT with a "not now" reason code (server busy, unavailable, quota or rate
exceeded: :data:`protocol.mqtt.reasons.BUSY`) raises :class:`~agent.transport.BrokerBusyError`,
so the publisher waits longer before the next try. What checking each PUBACK costs is in
docs/mqtt-client.md ("The agent's client"); a device publishes a few reports a cycle. MQTT
3.1.1 (``receipts = false``) has no refusal in its PUBACK: there, as before, a broker that
drops a publish cannot be detected.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypedDict

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.aiomqtt_hooks import HookedClient
from agent.brokers import BrokerAddress
from agent.config import BrokerConfig, read_password, tls_context
from agent.errors import TransportError
from agent.identity import device_identity
from agent.transport import BrokerBusyError, Connection, PublishRefusedError, ReceiptConnection
from protocol.mqtt.reasons import BUSY, is_failure, name_of
from protocol.randomness import RandomSource
from protocol.receipts import MalformedReceiptError, Receipt, decode_receipts, receipt_topic
from runtime.resources import ResourceShortageError

__all__ = ["MqttTransport", "random_client_id"]

log = logging.getLogger("ldp_agent.mqtt")


def random_client_id(rng: RandomSource) -> str:
    """A fresh 88-bit client identifier (22 hex digits: within MQTT 3.1.1's 23-character limit)."""
    words = rng.draw(2)
    return f"{int(words[0]):016x}{int(words[1]) >> 40:06x}"


def _reason_value(e: BaseException) -> int | None:
    """The MQTT reason code behind ``e``: aiomqtt raises a lost connection from the message
    iterator as a plain MqttError caused by the MqttCodeError that holds the code."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, aiomqtt.MqttCodeError) and seen.rc is not None:
            rc = seen.rc
            return int(rc.value) if isinstance(rc, ReasonCode) else rc
        seen = seen.__cause__
    return None


def _transport_error(what: str, e: aiomqtt.MqttError) -> TransportError:
    """``e`` as the agent's error: BrokerBusyError when the broker said "not now"."""
    if _reason_value(e) in BUSY:
        return BrokerBusyError(f"{what}: the broker is busy ({e})")
    return TransportError(f"{what}: {e}")


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
    def __init__(self, client: HookedClient, timeout: float, response_topic: str) -> None:
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
            code = await self._client.publish_checked(topic, payload, timeout=self._timeout, properties=props)
        except aiomqtt.MqttError as e:
            raise _transport_error(f"publish to {topic} not acknowledged", e) from e
        if is_failure(code):
            raise PublishRefusedError(topic, code, name_of(code))

    async def receipts(self) -> list[Receipt]:
        while True:
            try:
                message = await anext(self._messages)
            except aiomqtt.MqttError as e:
                raise _transport_error("receipt subscription ended", e) from e
            except StopAsyncIteration as e:
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


_CREDENTIALS: dict[
    tuple[bool, Path | None, Path | None, Path | None, Path | None], tuple[ssl.SSLContext | None, str | None]
] = {}
"""The TLS context and the password of each set of files, once read (one per daemon; the fleet's
devices, which share their files, share one)."""


def _credentials(cfg: BrokerConfig, broker: BrokerAddress) -> tuple[ssl.SSLContext | None, str | None]:
    """The TLS context and the password ``cfg`` names, read at the first connection and reused by
    every later one: a reconnect opens no file (runtime/tls.py), so a full open-file table can
    only fail its socket, which is retried.

    Raises:
        ConfigError: a file is missing, unreadable or broken (the operator's to fix: it ends
            the daemon, naming the field and the file).
        TransportError: a file could not be read for want of a system resource (``EMFILE``,
            ...): retried with the publisher's backoff, like a broker that cannot be reached.
    """
    key = (cfg.tls, cfg.ca_file, cfg.cert_file, cfg.key_file, cfg.password_file)
    found = _CREDENTIALS.get(key)
    if found is None:
        try:
            found = _CREDENTIALS[key] = (tls_context(cfg), read_password(cfg))
        except ResourceShortageError as e:
            raise TransportError(f"cannot connect ({broker}): {e}") from e
    return found


class _ClientArgs(TypedDict):
    """The connection arguments the MQTT 5 and 3.1.1 clients share, typed so that each is checked
    against ``aiomqtt.Client``'s parameters where it is unpacked."""

    identifier: str
    username: str | None
    password: str | None
    tls_context: ssl.SSLContext | None
    keepalive: int
    timeout: float
    logger: logging.Logger


class MqttTransport:
    """Connections to one of the configured brokers.

    Args:
        cfg: the ``[broker]`` section.
        rng: the source of client identifiers.
        address: the broker (default: the first of ``cfg``; agent.publisher holds one
            transport per broker, in the device's order).
    """

    def __init__(self, cfg: BrokerConfig, rng: RandomSource, *, address: BrokerAddress | None = None) -> None:
        self._cfg = cfg
        self._rng = rng
        self._broker = address or cfg.endpoints[0]
        # The user name the broker will see (or the certificate's common name): the receipt
        # topic sits under it, where the ACL (%u) lets only this identity read.
        try:
            self._identity = device_identity(cfg)
        except ResourceShortageError as e:
            # Made at the first connection (agent.daemon): retried like one that failed.
            raise TransportError(f"cannot connect ({self._broker}): {e}") from e

    @property
    def address(self) -> str:
        """The broker's ``host:port``."""
        return str(self._broker)

    def _client(self, identifier: str, *, v5: bool) -> aiomqtt.Client:
        cfg = self._cfg
        tls, password = _credentials(cfg, self._broker)
        # The two clients differ only in the protocol version and its clean-start flag.
        common = _ClientArgs(
            identifier=identifier,
            username=cfg.username,
            password=password,
            tls_context=tls,
            keepalive=cfg.keepalive,
            timeout=cfg.publish_timeout,
            logger=log,
        )
        host, port = self._broker.host, self._broker.port
        if v5:
            return HookedClient(host, port, protocol=aiomqtt.ProtocolVersion.V5, clean_start=True, **common)
        return aiomqtt.Client(host, port, clean_session=True, **common)

    @contextlib.asynccontextmanager
    async def connect_receipts(self) -> AsyncIterator[ReceiptConnection]:
        """Connect (MQTT 5) with a fresh identity and subscribe to its own receipt topic first."""
        cfg = self._cfg
        identifier = random_client_id(self._rng)
        topic = receipt_topic(cfg.receipt_prefix, self._identity, identifier)
        client = self._client(identifier, v5=True)
        assert isinstance(client, HookedClient)
        entered = False
        try:
            async with client:
                entered = True
                # Subscribed before the first publish, so no receipt can come before we listen.
                granted = await client.subscribe(topic, qos=0, timeout=cfg.publish_timeout)
                if any(is_failure(code if isinstance(code, int) else code.value) for code in granted):
                    raise TransportError(f"the broker refused the receipt subscription {topic} (check its ACL)")
                yield _MqttReceiptConnection(client, cfg.publish_timeout, topic)
        except aiomqtt.MqttError as e:
            what = "connection lost" if entered else "cannot connect"
            raise _transport_error(f"{what} ({self._broker})", e) from e

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
            raise _transport_error(f"{what} ({self._broker})", e) from e
