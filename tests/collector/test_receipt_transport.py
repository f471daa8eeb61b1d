"""Receipt requests cross the broker: a report published with a Response Topic and Correlation
Data reaches the collector's transport with both, and the receipt it sends reaches the
publisher on that topic (real Mosquitto)."""

from __future__ import annotations

import asyncio
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from collector.config import MqttConfig
from collector.mqtt import MqttTransport
from protocol.receipts import Receipt, decode_receipts
from tests.collector.support import run_async
from tests.support.broker import Broker

RECEIPT_TOPIC = "ldp/v1/receipts/conn-1234"


@run_async
async def test_a_receipt_request_round_trips_through_the_broker(mosquitto: Broker) -> None:
    """The delivery carries the reply topic and correlation; the receipt arrives on that topic."""
    transport = MqttTransport(MqttConfig(host=mosquitto.host, port=mosquitto.port, client_id="collector"))
    runner = asyncio.create_task(transport.run())
    got: list[bytes] = []
    arrived = threading.Event()
    subscribed = threading.Event()
    device = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="conn-1234", protocol=mqtt.MQTTv5)
    device.on_subscribe = lambda *_: subscribed.set()

    def on_message(client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        got.append(bytes(message.payload))
        arrived.set()

    device.on_message = on_message
    try:
        await asyncio.wait_for(transport.wait_subscribed(), 10)
        device.connect(mosquitto.host, mosquitto.port)
        device.loop_start()
        device.subscribe(RECEIPT_TOPIC, qos=1)
        assert await asyncio.to_thread(subscribed.wait, 10)
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = RECEIPT_TOPIC
        props.CorrelationData = b"\x01" * 16
        device.publish("ldp/v1/reports/x", b"report-bytes", qos=1, properties=props).wait_for_publish(10)
        (delivery,) = await asyncio.wait_for(transport.receive(10), 10)
        assert delivery.payload == b"report-bytes"
        assert delivery.reply_to == RECEIPT_TOPIC.encode()
        assert delivery.correlation == b"\x01" * 16
        transport.ack([delivery.token])
        transport.send_receipts({delivery.reply_to: [Receipt(delivery.correlation, counted=True)]})
        assert await asyncio.to_thread(arrived.wait, 10)
        assert decode_receipts(got[0]) == [Receipt(b"\x01" * 16, counted=True)]
        assert transport.statistics().receipts_sent == 1
    finally:
        device.loop_stop()
        device.disconnect()
        await transport.close()
        await asyncio.wait_for(runner, 5)
