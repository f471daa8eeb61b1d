"""The brokers an agent may publish through, and the order one device tries them in.

``[broker] addresses`` lists several brokers as ``host:port`` strings (an IPv6 address in
brackets: ``[2001:db8::1]:8883``). Each device orders them by rendezvous (highest random
weight) hashing: the weight of a broker is SHA-256 of the device identity and the broker's
address, and the broker with the highest weight is the device's primary. So:

* a fleet spreads evenly: for each device every broker is the primary with probability 1/n,
  independently of the other devices (tests/agent/test_brokers.py measures it);
* removing a broker moves only the devices whose primary it was (the other brokers' weights
  do not change, so neither does their order); adding one takes about 1/(n+1) of the fleet;
* the order needs no coordination and no state: it is the same at every start.

The identity is the one the broker sees (agent.identity): a user name or a certificate's
common name. An anonymous agent (a test broker without an ACL) hashes the empty identity, so
every such agent has the same order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BrokerAddress", "broker_order", "parse_address"]


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """One broker's network address.

    Attributes:
        host: a host name, an IPv4 address or an IPv6 address (without brackets).
        port: the TCP port.
    """

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(text: str) -> BrokerAddress:
    """``host:port`` (``[v6]:port`` for an IPv6 address) as a :class:`BrokerAddress`.

    Raises:
        ValueError: saying what is wrong with ``text``.
    """
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or not text[end + 1 :].startswith(":"):
            raise ValueError(f"{text!r} is not [ipv6-address]:port")
        host, port_text = text[1:end], text[end + 2 :]
        if ":" not in host:
            raise ValueError(f"{text!r}: only an IPv6 address goes in brackets")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"{text!r} is not host:port (the port is required)")
        if ":" in host:
            raise ValueError(f"{text!r}: an IPv6 address goes in brackets, as [{host}]:{port_text}")
    if not host or any(c.isspace() or c in "/[]" for c in host):
        raise ValueError(f"{text!r} has no valid host")
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r} has no port in [1, 65535]")
    return BrokerAddress(host, int(port_text))


def _weight(identity: str, address: BrokerAddress) -> bytes:
    # The separator keeps ("ab", "c:1") and ("a", "bc:1") apart.
    return hashlib.sha256(identity.encode("utf-8") + b"\x00" + str(address).encode("utf-8")).digest()


def broker_order(identity: str | None, addresses: Sequence[BrokerAddress]) -> list[BrokerAddress]:
    """The brokers in the order the device ``identity`` tries them, its primary first.

    Rendezvous hashing (see the module's docstring); ties, which need a SHA-256 collision,
    fall back to the address text so the order is still total.
    """
    who = identity or ""
    return sorted(addresses, key=lambda a: (_weight(who, a), str(a)), reverse=True)
