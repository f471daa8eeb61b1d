"""What the collector subscribes to on each broker, and what the broker's answers mean to it.

Two SUBSCRIBEs per connection (docs/mqtt-client.md): the reports' topic filter at QoS 1,
which acknowledgement after commit needs, and a few of Mosquitto's ``$SYS`` counters at QoS 0
(:data:`BROKER_COUNTERS`), which make loss at the broker visible. Subscribing again on a
resumed session is harmless (it replaces the identical subscription) and covers a session
the broker has forgotten.
"""

from __future__ import annotations

import contextlib

from protocol.mqtt.events import BrokerMessage, Subscribed
from protocol.mqtt.reasons import is_failure
from protocol.mqtt.session import Session

__all__ = [
    "BROKER_COUNTERS",
    "COUNTERS_PACKET_ID",
    "REPORTS_PACKET_ID",
    "broker_counter",
    "counters_refused",
    "reports_granted",
    "subscribe",
]

REPORTS_PACKET_ID = 1
"""The packet id of the SUBSCRIBE to the reports."""
COUNTERS_PACKET_ID = 2
"""The packet id of the SUBSCRIBE to :data:`BROKER_COUNTERS`."""

BROKER_COUNTERS: tuple[str, ...] = (
    "$SYS/broker/publish/messages/dropped",
    "$SYS/broker/store/messages/count",
    "$SYS/broker/store/messages/bytes",
    "$SYS/broker/clients/connected",
)
"""Mosquitto's counters the collector follows (published every ``sys_interval`` seconds)."""


def subscribe(session: Session, topic_filter: str) -> bytes:
    """Both SUBSCRIBEs: ``topic_filter`` at QoS 1, then :data:`BROKER_COUNTERS` at QoS 0."""
    return session.subscribe(REPORTS_PACKET_ID, [(topic_filter, 1)]) + session.subscribe(
        COUNTERS_PACKET_ID, [(topic, 0) for topic in BROKER_COUNTERS]
    )


def reports_granted(event: Subscribed) -> int | None:
    """For the reports' SUBACK: None when QoS 1 is granted, else the code that makes it unusable
    (0: granted only at QoS 0; 0x80 and above: refused)."""
    code = event.reasons[0]
    return None if code == 1 else code


def counters_refused(event: Subscribed) -> bool:
    """Whether the counters' SUBACK refused any of them (a log line, nothing more)."""
    return any(is_failure(code) for code in event.reasons)


def broker_counter(message: BrokerMessage) -> tuple[str, float] | None:
    """A broker counter's topic and new value; None when the message is not an ASCII number."""
    with contextlib.suppress(ValueError):  # UnicodeDecodeError is a ValueError
        return message.topic.decode(), float(message.payload.decode("ascii"))
    return None
