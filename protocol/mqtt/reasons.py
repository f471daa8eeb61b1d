"""MQTT reason codes: the one table of what each code means and what a client does about it.

An MQTT 5 reason code is one byte carried by CONNACK, PUBACK, SUBACK, DISCONNECT and the
other acknowledgements (OASIS MQTT 5.0, 2019, §2.4): below 0x80 it reports success, from 0x80
a failure. The agent (through aiomqtt), the collector and the fleet's publisher all act on the
same few of them, so they read them here:

* **busy** ("not now": server unavailable, server busy, quota exceeded, connection rate
  exceeded): in a CONNACK or a DISCONNECT they lengthen the wait before the next connection
  (:meth:`runtime.backoff.Retry.next_delay`);
* **permanent** (unsupported protocol version, client identifier not valid, bad user name or
  password, not authorized, bad authentication method): a CONNACK refusal that retrying
  cannot fix, so a daemon stops with the cause instead of reconnecting for ever;
* the names, for the messages that quote a code (a PUBACK that refused a report, say).

MQTT 3.1.1 has no reason codes, only a CONNACK return code (§3.2.2.3 of that standard); its
permanent refusals are :data:`PERMANENT_REFUSALS_V4`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "BUSY",
    "MALFORMED_PACKET",
    "NAMES",
    "NORMAL",
    "PACKET_TOO_LARGE",
    "PERMANENT_REFUSALS",
    "PERMANENT_REFUSALS_V4",
    "PROTOCOL_ERROR",
    "is_failure",
    "name_of",
    "permanent_refusal",
]

NORMAL = 0x00
"""Success; in a DISCONNECT, normal disconnection (the broker keeps the session)."""
MALFORMED_PACKET, PROTOCOL_ERROR, PACKET_TOO_LARGE = 0x81, 0x82, 0x95
"""The DISCONNECT reason codes a client sends when the broker breaks the protocol (§3.14.2.1)."""

NAMES: Mapping[int, str] = MappingProxyType(
    {
        0x00: "success",
        0x01: "granted qos 1",
        0x02: "granted qos 2",
        0x04: "disconnect with will message",
        0x10: "no matching subscribers",
        0x11: "no subscription existed",
        0x18: "continue authentication",
        0x19: "re-authenticate",
        0x80: "unspecified error",
        0x81: "malformed packet",
        0x82: "protocol error",
        0x83: "implementation specific error",
        0x84: "unsupported protocol version",
        0x85: "client identifier not valid",
        0x86: "bad user name or password",
        0x87: "not authorized",
        0x88: "server unavailable",
        0x89: "server busy",
        0x8A: "banned",
        0x8B: "server shutting down",
        0x8C: "bad authentication method",
        0x8D: "keep alive timeout",
        0x8E: "session taken over",
        0x8F: "topic filter invalid",
        0x90: "topic name invalid",
        0x91: "packet identifier in use",
        0x92: "packet identifier not found",
        0x93: "receive maximum exceeded",
        0x94: "topic alias invalid",
        0x95: "packet too large",
        0x96: "message rate too high",
        0x97: "quota exceeded",
        0x98: "administrative action",
        0x99: "payload format invalid",
        0x9A: "retain not supported",
        0x9B: "qos not supported",
        0x9C: "use another server",
        0x9D: "server moved",
        0x9E: "shared subscriptions not supported",
        0x9F: "connection rate exceeded",
        0xA0: "maximum connect time",
        0xA1: "subscription identifiers not supported",
        0xA2: "wildcard subscriptions not supported",
    }
)
"""Every MQTT 5 reason code by its name in §2.4 (in lower case, as messages quote it); a code
whose name depends on the packet (0x00) has its general one."""

BUSY = frozenset({0x88, 0x89, 0x97, 0x9F})
"""The reason codes by which a broker says "not now": server unavailable, server busy, quota
exceeded, connection rate exceeded. In a CONNACK or a DISCONNECT they lengthen the wait before
the next connection."""

PERMANENT_REFUSALS = frozenset({0x84, 0x85, 0x86, 0x87, 0x8C})
"""The CONNACK reason codes after which retrying is pointless (§3.2.2.2)."""

PERMANENT_REFUSALS_V4: Mapping[int, str] = MappingProxyType(
    {1: "unacceptable protocol version", 2: "identifier rejected", 4: "bad user name or password", 5: "not authorized"}
)
"""The MQTT 3.1.1 CONNACK return codes after which retrying is pointless, by name."""


def name_of(code: int) -> str:
    """The name of an MQTT 5 reason code ("not authorized"), or ``"reason code 0x.."`` for one §2.4 does not define."""
    return NAMES.get(code, f"reason code 0x{code:02x}")


def is_failure(code: int) -> bool:
    """Whether ``code`` reports a failure (0x80 and above, §2.4)."""
    return code >= 0x80


def permanent_refusal(code: int, *, version: int = 5) -> str | None:
    """What a CONNACK refusal means when retrying cannot fix it (bad credentials, ...); None when it may pass."""
    if version == 5:
        return NAMES[code] if code in PERMANENT_REFUSALS else None
    return PERMANENT_REFUSALS_V4.get(code)
