"""The collector's MQTT 5 subscriber, acknowledging each message only after its commit.

Three rooms (docs/mqtt-client.md says why the client is the collector's own):

* :mod:`collector.mqtt.packets` - single packets: Variable Byte Integers, properties,
  CONNECT, SUBSCRIBE, PUBLISH, CONNACK; stateless.
* :mod:`collector.mqtt.codec` - the subscriber protocol without I/O: bytes in, deliveries and
  events out, with the partial packet, the Receive Maximum accounting and the deliveries
  waiting for ingest.
* :mod:`collector.mqtt.transport` - the asyncio side: the connection, the read loop,
  keep-alive, acknowledgement after commit, receipts, reconnection with backoff; with
  :mod:`collector.mqtt.tls` for the TLS context.
* :mod:`collector.mqtt.brokers` - one session per broker of ``mqtt.addresses``, seen by
  ingest as one transport.
"""

from collector.mqtt.brokers import BrokerSet
from collector.mqtt.codec import SubscriberCodec
from collector.mqtt.packets import (
    BROKER_COUNTERS,
    CONNACK,
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBLISH,
    SUBACK,
    SUBSCRIBE,
    MqttProtocolError,
    connect_packet,
    decode_varint,
    encode_varint,
    publish_packet,
    split_packets,
    subscribe_packet,
)
from collector.mqtt.tls import tls_context
from collector.mqtt.transport import READ_PAUSE_S, MqttTransport

__all__ = [
    "BROKER_COUNTERS",
    "CONNACK",
    "CONNECT",
    "DISCONNECT",
    "PINGREQ",
    "PINGRESP",
    "PUBACK",
    "PUBLISH",
    "READ_PAUSE_S",
    "SUBACK",
    "SUBSCRIBE",
    "BrokerSet",
    "MqttProtocolError",
    "MqttTransport",
    "SubscriberCodec",
    "connect_packet",
    "decode_varint",
    "encode_varint",
    "publish_packet",
    "split_packets",
    "subscribe_packet",
    "tls_context",
]
