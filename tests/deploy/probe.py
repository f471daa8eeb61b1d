"""A paho-mqtt client for broker tests in which every step waits on an event with a deadline.

Each callback records what the broker said (CONNACK, SUBACK, PUBACK and UNSUBACK reason
codes, messages, disconnects) under one condition variable; each method sends one packet
and waits on that condition for the answer, failing after ``DEADLINE`` seconds. Nothing
sleeps to synchronise.

:meth:`Probe.sync` is the barrier that makes "received nothing" a checkable claim: it
sends an UNSUBSCRIBE and waits for the UNSUBACK. Mosquitto handles packets one at a time
and writes a client's outgoing packets in order, so a message it routed to this client
before reading the UNSUBSCRIBE is on the wire ahead of the UNSUBACK, and paho dispatches
packets in order: once ``sync()`` returns, every such message has reached ``on_message``.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

__all__ = ["DEADLINE", "V5", "V311", "ConnectResult", "Probe", "tls_context"]

DEADLINE = 60.0  # a hang guard: every wait ends on the event it waits for
V311 = 4  # paho's protocol numbers: MQTT 3.1.1 (the agent's) and MQTT 5 (the collector's)
V5 = 5


def tls_context(ca_file: Path, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A client context that trusts ``ca_file``, checks the host name, and may present a certificate."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


@dataclass(frozen=True)
class ConnectResult:
    """How a connection attempt ended.

    Attributes:
        accepted: the broker answered CONNACK with success.
        connack: the CONNACK reason (``"Success"``, ``"Not authorized"``, ...), or None when
            the connection ended (or could not be set up) without any CONNACK.
        detail: what ended a connection without CONNACK (an exception or a disconnect reason).
    """

    accepted: bool
    connack: str | None
    detail: str = ""


class Probe:
    """One MQTT connection driven from the test thread, with paho's network loop in a thread.

    Args:
        port: the broker's loopback port.
        protocol: ``V311`` or ``V5``.
        context: TLS context, or None for a plaintext connection.
        username: user name, or None for none (anonymous, or a client certificate).
        password: password, or None.
        host: the name to dial and to check the broker's certificate against.
        client_id: the MQTT client identifier ("" lets the broker choose one).
    """

    def __init__(
        self,
        port: int,
        *,
        protocol: int = V5,
        context: ssl.SSLContext | None = None,
        username: str | None = None,
        password: str | None = None,
        host: str = "127.0.0.1",
        client_id: str = "",
    ) -> None:
        self.port = port
        self.host = host
        self.protocol = protocol
        if protocol == V5:
            self.client = mqtt.Client(
                CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5, reconnect_on_failure=False
            )
        else:
            self.client = mqtt.Client(
                CallbackAPIVersion.VERSION2,
                client_id=client_id,
                protocol=mqtt.MQTTv311,
                clean_session=True,
                reconnect_on_failure=False,
            )
        if context is not None:
            self.client.tls_set_context(context)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.max_inflight_messages_set(1000)
        self._cond = threading.Condition()
        self._connack: str | None = None
        self._connack_failed = False
        self._disconnected: str | None = None
        self._subacks: dict[int, list[int]] = {}
        self._unsubacks: set[int] = set()
        self._pubacks: dict[int, int] = {}
        self.messages: list[tuple[str, bytes, bool]] = []
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._saw_disconnect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_unsubscribe = self._on_unsubscribe
        self.client.on_publish = self._saw_puback
        self.client.on_message = self._on_message
        self._started = False

    # -- callbacks (paho's network thread) ------------------------------------------------

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        with self._cond:
            self._connack = str(reason)
            self._connack_failed = bool(reason.is_failure)
            self._cond.notify_all()

    def _saw_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        with self._cond:
            self._disconnected = str(reason)
            self._cond.notify_all()

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reasons: list[Any], properties: Any) -> None:
        with self._cond:
            self._subacks[mid] = [int(r.value) for r in reasons]
            self._cond.notify_all()

    def _on_unsubscribe(self, client: Any, userdata: Any, mid: int, reasons: Any, properties: Any) -> None:
        with self._cond:
            self._unsubacks.add(mid)
            self._cond.notify_all()

    def _saw_puback(self, client: Any, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        with self._cond:
            self._pubacks[mid] = int(reason.value)
            self._cond.notify_all()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self._cond:
            self.messages.append((str(message.topic), bytes(message.payload), bool(message.retain)))
            self._cond.notify_all()

    # -- test side ------------------------------------------------------------------------

    def _wait(self, predicate: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout=timeout):
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def connect(self, *, clean_start: bool = True, session_expiry: int = 0) -> ConnectResult:
        """Connect and wait for the CONNACK, or for the connection to end without one.

        Args:
            clean_start: MQTT 5 Clean Start (MQTT 3.1.1 probes always use a clean session).
            session_expiry: MQTT 5 Session Expiry Interval in seconds (0: the session ends with
                the connection).
        """
        kwargs: dict[str, Any] = {}
        if self.protocol == V5:
            kwargs["clean_start"] = clean_start
            if session_expiry:
                props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]  # unannotated in paho
                props.SessionExpiryInterval = session_expiry
                kwargs["properties"] = props
        try:
            self.client.connect(self.host, self.port, keepalive=30, **kwargs)
        except (OSError, ssl.SSLError) as exc:
            # The TLS handshake failed inside connect(): no CONNECT was ever read by the broker.
            return ConnectResult(accepted=False, connack=None, detail=f"{type(exc).__name__}: {exc}")
        self.client.loop_start()
        self._started = True
        self._wait(lambda: self._connack is not None or self._disconnected is not None, "CONNACK or disconnect")
        with self._cond:
            if self._connack is None:
                return ConnectResult(accepted=False, connack=None, detail=f"disconnected: {self._disconnected}")
            return ConnectResult(accepted=not self._connack_failed, connack=self._connack)

    def subscribe(self, topic_filter: str, qos: int = 1) -> list[int]:
        """Subscribe and return the SUBACK reason codes (granted QoS, or >= 0x80 for a refusal)."""
        result, mid = self.client.subscribe(topic_filter, qos=qos)
        assert result == mqtt.MQTT_ERR_SUCCESS, f"subscribe({topic_filter!r}) not sent: {result}"
        assert mid is not None
        self._wait(lambda: mid in self._subacks, f"SUBACK for {topic_filter}")
        with self._cond:
            return self._subacks[mid]

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> int | None:
        """Publish at QoS 1 and return the PUBACK reason code; None if the broker disconnected us."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        mid = info.mid
        self._wait(lambda: mid in self._pubacks or self._disconnected is not None, f"PUBACK for {topic}")
        with self._cond:
            return self._pubacks.get(mid)

    def publish_many(self, topic: str, payloads: list[bytes]) -> None:
        """Publish every payload at QoS 1 (pipelined) and wait until all are acknowledged."""
        mids = [self.client.publish(topic, p, qos=1).mid for p in payloads]
        self._wait(lambda: all(m in self._pubacks for m in mids), f"{len(mids)} PUBACKs", timeout=3 * DEADLINE)

    def sync(self) -> None:
        """Round trip to the broker: every message it routed to us before now has been received."""
        result, mid = self.client.unsubscribe("ldp-test/sync-barrier")
        assert result == mqtt.MQTT_ERR_SUCCESS, f"unsubscribe not sent: {result}"
        self._wait(lambda: mid in self._unsubacks or self._disconnected is not None, "UNSUBACK")
        with self._cond:
            assert mid in self._unsubacks, f"disconnected during sync: {self._disconnected}"

    def wait_messages(self, count: int, topic: str, timeout: float = DEADLINE) -> list[bytes]:
        """Wait until ``count`` messages on ``topic`` have arrived; return their payloads."""
        self._wait(lambda: len(self.received(topic)) >= count, f"{count} messages on {topic}", timeout)
        return self.received(topic)

    def received(self, topic: str | None = None) -> list[bytes]:
        """Payloads received so far, on ``topic`` or on any topic."""
        with self._cond:
            return [p for t, p, _ in self.messages if topic is None or t == topic]

    def wait_disconnected(self) -> str:
        """Wait until the broker closes the connection; return the reason paho reports."""
        self._wait(lambda: self._disconnected is not None, "the broker to disconnect us")
        with self._cond:
            assert self._disconnected is not None
            return self._disconnected

    @property
    def disconnected(self) -> str | None:
        """Why the connection ended, or None while it is up."""
        with self._cond:
            return self._disconnected

    def close(self) -> None:
        """Disconnect (if connected) and stop the network thread."""
        self.client.disconnect()
        if self._started:
            self.client.loop_stop()
            self._started = False
        sock = self.client.socket()
        if sock is not None:
            sock.close()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
