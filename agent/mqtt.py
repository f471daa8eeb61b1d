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
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import aiomqtt

from agent.config import BrokerConfig, read_password, tls_context
from agent.errors import TransportError
from agent.transport import Connection
from protocol.randomness import RandomSource

__all__ = ["MqttTransport", "random_client_id"]

log = logging.getLogger("ldp_agent.mqtt")


def random_client_id(rng: RandomSource) -> str:
    """A fresh 88-bit client identifier (22 hex digits: within MQTT 3.1.1's 23-character limit)."""
    words = rng.words(2)
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


class MqttTransport:
    """Connections to the configured broker.

    Args:
        cfg: the ``[broker]`` section.
        rng: the source of client identifiers.
    """

    def __init__(self, cfg: BrokerConfig, rng: RandomSource) -> None:
        self._cfg = cfg
        self._rng = rng

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Connection]:
        """Connect with a fresh identity; the connection closes when the block ends."""
        cfg = self._cfg
        # A CA, key or password file gone since start-up is the operator's to fix: ConfigError
        # (naming the field and the file) ends the daemon instead of a retry loop.
        tls = tls_context(cfg)
        client = aiomqtt.Client(
            cfg.host,
            cfg.port,
            identifier=random_client_id(self._rng),
            username=cfg.username,
            password=read_password(cfg),
            tls_context=tls,
            keepalive=cfg.keepalive,
            clean_session=True,
            timeout=cfg.publish_timeout,
            logger=log,
        )
        entered = False
        try:
            async with client:
                entered = True
                yield _MqttConnection(client, cfg.publish_timeout)
        except aiomqtt.MqttError as e:
            what = "connection lost" if entered else "cannot connect"
            raise TransportError(f"{what} ({cfg.host}:{cfg.port}): {e}") from e
