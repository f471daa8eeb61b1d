"""What a session hands its caller: deliveries, acknowledgements, events, and the tokens that name messages.

A :class:`~protocol.mqtt.session.Session` turns the broker's bytes into three kinds of
output. The two that come by the thousand are handed over in batches:

* :class:`Delivery`, one per PUBLISH read (a report for the collector, a commit receipt for a
  publisher), with a **token** that names the connection and the packet id it came with;
* :class:`Acknowledged`, one per PUBACK read (a publisher's report accepted or refused).

Everything else is an :data:`Event`, one at a time, in the order the packets came.

A token is ``(connection << 8 | tag) << 16 | packet id``: ``connection`` counts the
session's connections (a token of an earlier one is never acknowledged on a later one, where
its packet id may name another message), ``tag`` is the caller's name for the session among
several it holds (the collector's index of the broker, ``collector.mqtt.brokers``), and the
packet id is 0 for a QoS 0 message, which needs no acknowledgement. :func:`tag_of` is the one
place a tag is read back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "MAX_TAGS",
    "Acknowledged",
    "BrokerMessage",
    "Connected",
    "ConnectionRefused",
    "Delivery",
    "Disconnected",
    "Event",
    "SessionStatistics",
    "Subscribed",
    "make_token",
    "packet_id_of",
    "tag_of",
]

MAX_TAGS = 256
"""A token keeps its session's tag in 8 bits."""


def make_token(connection: int, tag: int, packet_id: int) -> int:
    """The token of a message read on connection number ``connection`` of session ``tag`` (0 <= tag < 256)."""
    return (connection << 8 | tag) << 16 | packet_id


def tag_of(token: int) -> int:
    """The tag of the session whose connection gave out ``token`` (bits 16-23)."""
    return (token >> 16) & 0xFF


def packet_id_of(token: int) -> int:
    """The packet id a token acknowledges; 0 for a QoS 0 message, which needs no acknowledgement."""
    return token & 0xFFFF


class Delivery(NamedTuple):
    """One PUBLISH read, reduced to its payload, its sender and a request for an answer.

    Immutable, and a named tuple rather than a frozen dataclass: one is made for every
    message read, and a tuple is made in a third of the time.

    Attributes:
        payload: the message body, exactly as published.
        token: names the message for its acknowledgement (module docstring).
        reply_to: the MQTT 5 Response Topic, when the sender asked for an answer (§4.10).
        correlation: the Correlation Data to echo in the answer.
        sender: the topic levels between the session's ``topic_prefix`` and the last level
            (``<prefix><sender>/<last>``); empty when the topic has none, or the session
            was given no prefix.
    """

    payload: bytes
    token: int
    reply_to: bytes | None = None
    correlation: bytes | None = None
    sender: bytes = b""


class Acknowledged(NamedTuple):
    """One PUBACK read: the broker took the PUBLISH with ``packet_id``, or refused it (``reason`` >= 0x80, §3.4.2.1)."""

    packet_id: int
    reason: int


@dataclass(frozen=True, slots=True)
class Connected:
    """The broker accepted the connection (CONNACK with reason 0).

    Attributes:
        session_present: the broker resumed our session (its subscriptions and queue).
        server_keep_alive: the broker's Server Keep Alive, which replaces ours (§3.2.2.3.14).
        receive_maximum: how many QoS 1 PUBLISHes the broker takes unacknowledged
            (§3.2.2.3.3; 65,535 when it says nothing).
    """

    session_present: bool
    server_keep_alive: int | None = None
    receive_maximum: int = 65535


@dataclass(frozen=True, slots=True)
class ConnectionRefused:
    """The broker refused the connection (CONNACK with a reason code); the connection is over.

    Attributes:
        reason: the CONNACK reason code (§3.2.2.2), or the return code at MQTT 3.1.1.
        permanent_cause: what the refusal means when retrying cannot fix it (bad
            credentials, ...); None when it may pass (server busy, ...).
    """

    reason: int
    permanent_cause: str | None


@dataclass(frozen=True, slots=True)
class Subscribed:
    """The broker answered a SUBSCRIBE (SUBACK).

    Attributes:
        packet_id: the SUBSCRIBE's packet id.
        reasons: one reason code per topic filter as the broker sent them: the QoS
            granted (0, 1), or a refusal (0x80 and above).
    """

    packet_id: int
    reasons: bytes


@dataclass(frozen=True, slots=True)
class BrokerMessage:
    """A QoS 0 PUBLISH on one of the broker's own topics (``$SYS/...``, §4.7.2): never a delivery."""

    topic: bytes
    payload: bytes


@dataclass(frozen=True, slots=True)
class Disconnected:
    """The broker sent DISCONNECT; the connection is over.

    Attributes:
        reason: its reason code (0 when it carried none).
    """

    reason: int


Event = Connected | ConnectionRefused | Subscribed | BrokerMessage | Disconnected
"""What :meth:`~protocol.mqtt.session.Session.next_event` reports, one at a time."""


@dataclass(frozen=True, slots=True)
class SessionStatistics:
    """A snapshot of a session's counters (totals over every connection).

    Attributes:
        received: PUBLISH packets read, other than the broker's own topics.
        acked: PUBACKs this session wrote.
        stale_acks: tokens not acknowledged because their connection had ended.
        over_receive_maximum: QoS 1 PUBLISHes read while ``receive_maximum`` already awaited
            acknowledgement (the broker's fault; counted, not refused).
    """

    received: int
    acked: int
    stale_acks: int
    over_receive_maximum: int
