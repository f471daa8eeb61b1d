"""What agent.aiomqtt_hooks relies on in aiomqtt, held against a scripted broker on loopback.

The hooks override two private handlers of aiomqtt's client (``_on_publish``,
``_on_disconnect``; pyproject.toml pins aiomqtt below 2.6). A release of aiomqtt or paho-mqtt
that stops calling them, or calls them differently, fails here by name: a PUBACK's refusal
must come back as its reason code, a DISCONNECT while a publish waits must end the publish
with the broker's reason (not with the publish's timeout, set to an hour here: a hang guard
of a minute fails the test first), and a connection lost before CONNACK must fail the
connect. The real broker's side of the same (Mosquitto's ACL answering PUBACK 0x87) is
tests/deploy/test_broker_word.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.aiomqtt_hooks import HookedClient
from agent.config import BrokerConfig
from agent.mqtt import MqttTransport
from agent.transport import BrokerBusyError, PublishRefusedError
from protocol.mqtt.packets import (
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PUBLISH,
    SUBSCRIBE,
    disconnect_packet,
    puback_packet,
    split_packets,
)
from protocol.randomness import SeededRandom
from tests.collector.support import run_async

TIMEOUT = 3600.0
"""Every wait of the client under test: never reached, so that what ends a wait is the broker's packet."""
HANG_GUARD = 60.0
"""How long a test waits for what the broker's packet must end at once: reached only when a hook no longer works."""

CONNACK = b"\x20\x03\x00\x00\x00"


@dataclass
class _Broker:
    """Answers CONNECT, SUBSCRIBE and PINGREQ as a broker does, and each PUBLISH with ``answer(packet id)``."""

    answer: Callable[[int], bytes]
    hang_up_on_connect: bool = False
    port: int = 0
    published: list[bytes] = field(default_factory=list)
    received: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rest = b""
        try:
            while data := await reader.read(65536):
                packets, rest = split_packets(rest + data)
                for first, body in packets:
                    if not self._answer(first >> 4, body, writer):
                        return
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _answer(self, kind: int, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """Write the answer to one packet; False when the connection is to end."""
        if kind == CONNECT:
            if self.hang_up_on_connect:
                return False
            writer.write(CONNACK)
        elif kind == SUBSCRIBE:  # one filter, as the agent subscribes: QoS 0 granted
            writer.write(b"\x90\x04" + body[:2] + b"\x00\x00")
        elif kind == PUBLISH:
            topic_end = 2 + int.from_bytes(body[:2], "big")
            self.published.append(body[2:topic_end])
            self.received.set()
            answer = self.answer(int.from_bytes(body[topic_end : topic_end + 2], "big"))
            writer.write(answer)
            return not answer or answer[0] >> 4 != DISCONNECT
        elif kind == PINGREQ:
            writer.write(b"\xd0\x00")
        elif kind == DISCONNECT:
            return False
        return True


@contextlib.asynccontextmanager
async def _broker(answer: Callable[[int], bytes], *, hang_up_on_connect: bool = False) -> AsyncIterator[_Broker]:
    broker = _Broker(answer, hang_up_on_connect=hang_up_on_connect)
    server = await asyncio.start_server(broker.handle, "127.0.0.1", 0)
    broker.port = server.sockets[0].getsockname()[1]
    async with server:
        yield broker


def _client(port: int) -> HookedClient:
    return HookedClient(
        "127.0.0.1", port, identifier="hooked", protocol=aiomqtt.ProtocolVersion.V5, clean_start=True, timeout=TIMEOUT
    )


async def _connect(port: int) -> None:
    async with _client(port):
        pass


def _properties() -> Properties:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ResponseTopic = "ldp/v1/receipts/hooked"
    props.CorrelationData = b"\x01"
    return props


def _transport(port: int) -> MqttTransport:
    return MqttTransport(BrokerConfig(host="127.0.0.1", port=port, tls=False, publish_timeout=TIMEOUT), SeededRandom(3))


@run_async
async def test_a_puback_comes_back_as_its_reason_code() -> None:
    """publish_checked returns each PUBACK's refusal (0x87 for an ACL's), and 0 for every success (0x00, 0x10)."""
    codes = iter([0x00, 0x87, 0x10])
    async with _broker(lambda pid: puback_packet(pid, next(codes))) as broker, _client(broker.port) as client:
        got = [await client.publish_checked("t", b"r", timeout=TIMEOUT, properties=_properties()) for _ in range(3)]
    assert got == [0x00, 0x87, 0x00]


@run_async
async def test_a_refusing_puback_is_a_publish_refused_error_and_the_connection_goes_on() -> None:
    """Through the agent's transport: PublishRefusedError names the code and the reason; the next publish goes on."""
    codes = iter([0x87, 0x00])
    async with (
        _broker(lambda pid: puback_packet(pid, next(codes))) as broker,
        _transport(broker.port).connect_receipts() as connection,
    ):
        with pytest.raises(PublishRefusedError) as refused:
            await connection.publish("ldp/v1/reports/flag", b"r", correlation=b"\x01")
        await connection.publish("ldp/v1/reports/flag", b"r", correlation=b"\x02")
    assert (refused.value.code, refused.value.reason) == (0x87, "not authorized")
    assert broker.published == [b"ldp/v1/reports/flag"] * 2


@run_async
async def test_a_disconnect_while_a_publish_waits_ends_it_with_the_brokers_reason() -> None:
    """The broker answers a PUBLISH with DISCONNECT 0x89: the publish ends with that code, not with its timeout."""
    lost: list[aiomqtt.MqttError] = []
    async with _broker(lambda _pid: disconnect_packet(0x89)) as broker:
        client = _client(broker.port)
        with contextlib.suppress(aiomqtt.MqttError):  # leaving the client finds the connection gone
            async with client:
                try:
                    await asyncio.wait_for(
                        client.publish_checked("t", b"r", timeout=TIMEOUT, properties=_properties()), HANG_GUARD
                    )
                except aiomqtt.MqttError as e:
                    lost.append(e)
    assert [type(e) for e in lost] == [aiomqtt.MqttCodeError]
    assert isinstance(lost[0], aiomqtt.MqttCodeError)
    assert lost[0].rc == 0x89
    assert client.disconnect_reason == 0x89


@run_async
async def test_a_busy_broker_is_a_broker_busy_error() -> None:
    """Through the agent's transport, the same DISCONNECT 0x89 is BrokerBusyError (the publisher backs off more)."""
    async with _broker(lambda _pid: disconnect_packet(0x89)) as broker:
        with pytest.raises(BrokerBusyError, match="busy"):
            async with _transport(broker.port).connect_receipts() as connection:
                await asyncio.wait_for(connection.publish("ldp/v1/reports/flag", b"r", correlation=b"\x01"), HANG_GUARD)


@run_async
async def test_a_connection_lost_before_connack_fails_the_connect() -> None:
    """A broker that hangs up on CONNECT fails the connect at once, naming the lost CONNACK."""
    async with _broker(lambda pid: puback_packet(pid, 0), hang_up_on_connect=True) as broker:
        with pytest.raises(aiomqtt.MqttError, match="before the CONNACK"):
            await asyncio.wait_for(_connect(broker.port), HANG_GUARD)


@run_async
async def test_a_cancelled_publish_leaves_no_task_behind() -> None:
    """A publish cancelled while it waits for its PUBACK takes its watch on the broker with it."""
    async with _broker(lambda _pid: b"") as broker, _client(broker.port) as client:
        publishing = asyncio.create_task(client.publish_checked("t", b"r", timeout=TIMEOUT, properties=_properties()))
        await asyncio.wait_for(broker.received.wait(), HANG_GUARD)
        publishing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await publishing
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "mqtt-broker-gone"]


def test_the_hooks_are_aiomqtts_handlers() -> None:
    """HookedClient overrides aiomqtt's handlers of paho's on_publish and on_disconnect: they must still exist."""
    for name in ("_on_publish", "_on_disconnect"):
        base = getattr(aiomqtt.Client, name)
        assert getattr(HookedClient, name) is not base
        assert (
            list(inspect.signature(base).parameters)[:5]
            == list(inspect.signature(getattr(HookedClient, name)).parameters)[:5]
        )
