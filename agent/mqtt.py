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
import ssl
from collections.abc import AsyncIterator

import aiomqtt

from agent.config import BrokerConfig
from agent.errors import TransportError
from agent.transport import Connection
from protocol.randomness import RandomSource

__all__ = ["MqttTransport", "random_client_id"]

log = logging.getLogger("ldp_agent.mqtt")


def random_client_id(rng: RandomSource) -> str:
    """A fresh 88-bit client identifier (22 hex digits: within MQTT 3.1.1's 23-character limit)."""
    words = rng.words(2)
    return f"{int(words[0]):016x}{int(words[1]) >> 40:06x}"


def _tls_context(cfg: BrokerConfig) -> ssl.SSLContext | None:
    if not cfg.tls:
        return None
    ctx = ssl.create_default_context(cafile=str(cfg.ca_file) if cfg.ca_file else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cfg.cert_file is not None and cfg.key_file is not None:
        ctx.load_cert_chain(certfile=str(cfg.cert_file), keyfile=str(cfg.key_file))
    return ctx


def _password(cfg: BrokerConfig) -> str | None:
    if cfg.password_file is None:
        return None
    try:
        return cfg.password_file.read_text(encoding="utf-8").splitlines()[0]
    except (OSError, IndexError, UnicodeDecodeError) as e:
        raise TransportError(f"cannot read broker password file {cfg.password_file}: {e}") from None


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
        try:
            tls = _tls_context(cfg)
        except (OSError, ssl.SSLError) as e:
            raise TransportError(f"cannot set up TLS: {e}") from None
        client = aiomqtt.Client(
            cfg.host,
            cfg.port,
            identifier=random_client_id(self._rng),
            username=cfg.username,
            password=_password(cfg),
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
