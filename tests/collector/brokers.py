"""Helpers of the several-broker tests: devices that wait for commit receipts, and a broker
that can be killed with SIGKILL and started again on its port."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from protocol.receipts import decode_receipts
from tests.support.broker import Broker

RECEIPT_PREFIX = "ldp/v1/receipts/"


def kill9(broker: Broker) -> None:
    """``kill -9`` the broker: whatever it had not saved is gone, as after a crash."""
    assert broker.process is not None
    broker.process.kill()
    broker.process.wait(timeout=30)
    broker.process = None


class ReceiptDevice:
    """A device on one broker (paho, MQTT 5) that publishes reports with a receipt request and
    re-sends the identical bytes of every report not yet answered "counted", as an agent does.

    ``outcomes`` maps each correlation (the report id) to every receipt it got, in order.
    """

    def __init__(self, broker: Broker, client_id: str) -> None:
        self.client_id = client_id
        self.topic = RECEIPT_PREFIX + client_id
        self.outcomes: dict[bytes, list[tuple[bool, str]]] = {}
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._subscribed = threading.Event()
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        client.reconnect_delay_set(min_delay=1, max_delay=1)
        client.max_queued_messages_set(0)
        client.on_connect = self._on_connect
        client.on_subscribe = lambda *_: self._subscribed.set()
        client.on_message = self._on_message
        self._client = client
        client.connect(broker.host, broker.port)
        client.loop_start()

    def _on_connect(self, client: mqtt.Client, *_: object) -> None:
        # Subscribed again at every connection: a broker killed with -9 forgets the session.
        client.subscribe(self.topic, qos=1)

    def _on_message(self, client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        with self._answered:
            for receipt in decode_receipts(bytes(message.payload)):
                self.outcomes.setdefault(receipt.correlation, []).append((receipt.counted, receipt.reason))
            self._answered.notify_all()

    def wait_subscribed(self, timeout: float = 60.0) -> None:
        """Until the receipt topic is subscribed (a hang guard only)."""
        assert self._subscribed.wait(timeout), f"{self.client_id}: receipt topic not subscribed"

    def publish(self, topic: str, payload: bytes, report_id: bytes) -> None:
        """One report at QoS 1 with its receipt request (paho queues it while disconnected)."""
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = self.topic
        props.CorrelationData = report_id
        self._client.publish(topic, payload, qos=1, properties=props)

    def counted(self) -> set[bytes]:
        """The report ids some receipt said "counted" for."""
        with self._lock:
            return {rid for rid, got in self.outcomes.items() if any(c for c, _ in got)}

    def deliver(
        self, items: Sequence[tuple[str, bytes, bytes]], *, round_s: float = 3.0, guard_s: float = 600.0
    ) -> int:
        """Publish ``items`` (topic, payload, report id) until each is answered "counted".

        Each round re-sends what is not counted yet and waits up to ``round_s`` for answers
        (a pace, not a threshold: a slow round only means one more identical re-send, which
        the collector counts once). Returns the number of re-sends.

        Raises:
            TimeoutError: ``guard_s`` passed (a hang guard only).
        """
        deadline = time.monotonic() + guard_s
        pending = list(items)
        resent = -len(pending)
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.client_id}: {len(pending)} reports never counted")
            for topic, payload, rid in pending:
                self.publish(topic, payload, rid)
            resent += len(pending)
            round_end = time.monotonic() + round_s
            with self._answered:
                while True:
                    done = {rid for rid, got in self.outcomes.items() if any(c for c, _ in got)}
                    if all(rid in done for _, _, rid in pending) or time.monotonic() >= round_end:
                        break
                    self._answered.wait(max(0.0, round_end - time.monotonic()))
            pending = [item for item in pending if item[2] not in done]
        return resent

    def close(self) -> None:
        """Disconnect and stop paho's thread."""
        self._client.disconnect()
        self._client.loop_stop()
