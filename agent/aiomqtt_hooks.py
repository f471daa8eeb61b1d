"""What the agent needs of aiomqtt beyond its public API, and nothing else: the broker's word on a publish.

An MQTT 5 PUBACK may refuse the message it answers (0x87 "not authorized" when the broker's
ACL denies the topic), and a broker may end a connection with a reason (0x89 "server busy").
The agent acts on both (docs/wire-format.md, "What the broker says"), and aiomqtt 2.5, the
newest release, hands neither to its caller: its ``Client.publish`` waits on an event that
its handler of paho-mqtt's ``on_publish`` sets, dropping the reason code paho passes (paho's
callback API v2 calls ``on_publish`` for a QoS 1 message from its PUBACK handler only, with
the PUBACK's code), and when the broker disconnects it leaves the publish waiting until its
timeout, the broker's reason lost. No public API gives either; the alternatives were a PUBACK
parser of our own under paho (more code that can be wrong, for the same information) or a
change to aiomqtt, not in a release we can depend on (docs/mqtt-client.md, "The agent's
client").

So :class:`HookedClient` overrides aiomqtt's two private handlers, ``_on_publish`` and
``_on_disconnect``: the one module of the project that does (docs/design.md, convention 15).
pyproject.toml pins aiomqtt below 2.6, and tests/agent/test_aiomqtt_hooks.py drives the hooks
against a scripted broker on loopback (a PUBACK that refuses, a DISCONNECT while a publish
waits, a connection lost before CONNACK), so that a release that changes what they rely on
fails there, by name, before it reaches a device.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["HookedClient"]


class HookedClient(aiomqtt.Client):
    """aiomqtt's client, keeping the reason code of a PUBACK and of a DISCONNECT from the broker.

    Each connection is a client of its own (aiomqtt's are not reused here), so what it keeps
    belongs to that connection.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refusal: ReasonCode | None = None
        # One publish at a time, so that the PUBACK code kept is that publish's.
        self._one_publish = asyncio.Lock()
        self._gone = asyncio.Event()
        self.disconnect_reason: ReasonCode | None = None
        """The reason code of the broker's DISCONNECT, once it sent one."""

    def _on_publish(
        self, client: paho.Client, userdata: Any, mid: int, reason_code: ReasonCode, properties: Properties
    ) -> None:
        # paho calls this from its PUBACK handler; with one publish in flight the code is that
        # publish's. A success code is never kept.
        if reason_code.is_failure:
            self._refusal = reason_code
        super()._on_publish(client, userdata, mid, reason_code, properties)

    def _on_disconnect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None = None,
    ) -> None:
        # aiomqtt leaves a publish waiting for its PUBACK until its timeout when the broker
        # disconnects; the publish is cut short (publish_checked), with the broker's reason.
        if isinstance(reason_code, ReasonCode):
            self.disconnect_reason = reason_code
        self._gone.set()
        # aiomqtt ignores a connection lost before the CONNACK, so a broker killed during the
        # handshake held the connect (and the failover to the next broker, agent.publisher)
        # until its timeout; the connect fails at once instead. The lock is held only while
        # __aenter__ waits for the CONNACK, so the future failed here is always awaited.
        if self._lock.locked() and not self._connected.done():
            self._connected.set_exception(aiomqtt.MqttError(f"connection lost before the CONNACK ({reason_code})"))
            return
        super()._on_disconnect(client, userdata, flags, reason_code, properties)

    async def publish_checked(self, topic: str, payload: bytes, *, timeout: float, properties: Properties) -> int:
        """Publish at QoS 1 and wait for the PUBACK: its refusal (a reason code of 0x80 and above), or 0.

        The publish is raced against the broker's DISCONNECT in a task group of its own, so
        neither wait outlives this call, whichever ends first or if the caller is cancelled.

        Raises:
            aiomqtt.MqttError: no PUBACK (timeout, connection lost); an ``MqttCodeError``
                holding the broker's reason when the broker disconnected.
        """
        async with self._one_publish:
            self._refusal = None
            try:
                async with asyncio.TaskGroup() as tasks:
                    watch = tasks.create_task(self._until_gone(), name="mqtt-broker-gone")
                    await self.publish(topic, payload, qos=1, retain=False, properties=properties, timeout=timeout)
                    watch.cancel()
            except* aiomqtt.MqttError as lost:
                # Whichever way the loss showed (paho's "not connected" when the DISCONNECT was
                # read before the publish began), the broker's own reason decides.
                if self.disconnect_reason is not None:
                    raise aiomqtt.MqttCodeError(self.disconnect_reason, "the broker disconnected") from None
                raise lost.exceptions[0] from None
            refusal, self._refusal = self._refusal, None
        return 0 if refusal is None else int(refusal.value)

    async def _until_gone(self) -> None:
        """Return never; raise once the broker has disconnected (which ends the publish's group)."""
        await self._gone.wait()
        raise aiomqtt.MqttError("the broker disconnected")
