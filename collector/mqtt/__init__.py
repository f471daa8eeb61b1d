"""The collector's MQTT 5 subscriber, acknowledging each message only after its commit.

The protocol itself is the project's MQTT core (:mod:`protocol.mqtt`, shared with the
fleet's publisher and the tests'; docs/mqtt-client.md says why the client is the project's
own); this package is the collector's use of it, in the subscriber's role:

* :mod:`collector.mqtt.subscriptions` - what the collector subscribes to on a broker and what
  the broker's answers mean to it.
* :mod:`collector.mqtt.inbox` - the deliveries waiting for ingest, and the QoS 0 ones dropped
  when it is full.
* :mod:`collector.mqtt.transport` - the asyncio side: the connection, the read loop,
  keep-alive, acknowledgement after commit, receipts, reconnection with backoff; with
  :mod:`collector.mqtt.tls` for the TLS context.
* :mod:`collector.mqtt.brokers` - one session per broker of ``mqtt.addresses``, seen by
  ingest as one transport.
"""

from collector.mqtt.brokers import BrokerSet
from collector.mqtt.subscriptions import BROKER_COUNTERS
from collector.mqtt.tls import tls_context
from collector.mqtt.transport import READ_PAUSE_S, MqttTransport

__all__ = ["BROKER_COUNTERS", "READ_PAUSE_S", "BrokerSet", "MqttTransport", "tls_context"]
