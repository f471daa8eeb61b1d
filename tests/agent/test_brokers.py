"""Several brokers: ``[broker] addresses``, and the order each device tries them in (agent.brokers)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from agent.brokers import BrokerAddress, broker_order, parse_address
from agent.config import parse_config
from agent.errors import ConfigError

CONFIG = """
[broker]
{broker}
tls = false
[registry]
path = "usecases.toml"
[state]
directory = "state"
key_file = "state.key"
[api]
socket = "agent.sock"
"""

DEVICES = [f"device-{i:05d}" for i in range(10_000)]
"""Synthetic identities, as user names or certificate common names would be."""


def _brokers(n: int) -> list[BrokerAddress]:
    return [BrokerAddress(f"broker-{chr(ord('a') + i)}.example", 8883) for i in range(n)]


def test_host_and_port_still_name_one_broker() -> None:
    cfg = parse_config(CONFIG.format(broker='host = "broker.example"\nport = 1883'), path="agent.toml")
    assert cfg.broker.addresses is None
    assert (cfg.broker.host, cfg.broker.port) == ("broker.example", 1883)
    assert cfg.broker.endpoints == (BrokerAddress("broker.example", 1883),)


def test_addresses_list_several_brokers_ipv6_in_brackets() -> None:
    text = 'addresses = ["broker-a.example:8883", "10.0.0.2:1883", "[2001:db8::1]:8884"]'
    cfg = parse_config(CONFIG.format(broker=text), path="agent.toml")
    assert cfg.broker.endpoints == (
        BrokerAddress("broker-a.example", 8883),
        BrokerAddress("10.0.0.2", 1883),
        BrokerAddress("2001:db8::1", 8884),
    )
    assert [str(a) for a in cfg.broker.endpoints] == ["broker-a.example:8883", "10.0.0.2:1883", "[2001:db8::1]:8884"]


@pytest.mark.parametrize(
    ("broker", "field", "message"),
    [
        ('host = "h"\naddresses = ["a.example:8883"]', "broker.addresses", "either host .* not both; host is 'h'"),
        ("addresses = []", "broker.addresses", r"at least one broker .* got \[\]"),
        ('addresses = ["a.example:1", "b.example:2", "A.example:1"]', r"broker.addresses\[2\]", "listed twice"),
        ('addresses = ["a.example"]', r"broker.addresses\[0\]", "'a.example' is not host:port"),
        ('addresses = ["2001:db8::1:8883"]', r"broker.addresses\[0\]", r"goes in brackets, as \[2001:db8::1\]:8883"),
        ('addresses = ["a.example:0"]', r"broker.addresses\[0\]", r"no port in \[1, 65535\]"),
        ('addresses = ["[a.example]:1"]', r"broker.addresses\[0\]", "only an IPv6 address goes in brackets"),
        ('addresses = [":1"]', r"broker.addresses\[0\]", "no valid host"),
        ('addresses = ["a.example:1"]\nport = 1883', "broker.port", "goes with host"),
        ('addresses = "a.example:1"', "broker.addresses", ""),
        ("port = 1883", "broker.host", "is required"),
    ],
)
def test_a_bad_broker_list_names_the_file_the_field_and_the_value(broker: str, field: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"agent\.toml: {field}: .*{message}"):
        parse_config(CONFIG.format(broker=broker), path="agent.toml")


def test_parse_address_round_trips() -> None:
    for text in ("a.example:1", "127.0.0.1:65535", "[::1]:8883"):
        assert str(parse_address(text)) == text


def test_the_order_is_a_permutation_and_the_same_every_time() -> None:
    brokers = _brokers(5)
    for device in DEVICES[:100]:
        order = broker_order(device, brokers)
        assert sorted(order, key=str) == sorted(brokers, key=str)
        assert broker_order(device, list(reversed(brokers))) == order  # the listed order does not matter


@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_fleet_spreads_evenly_over_its_brokers(n: int) -> None:
    """Each broker is the primary of 1/n of 10,000 devices, within 4 standard errors."""
    brokers = _brokers(n)
    primaries = Counter(broker_order(device, brokers)[0] for device in DEVICES)
    share, se = 1 / n, math.sqrt((1 / n) * (1 - 1 / n) / len(DEVICES))
    for broker in brokers:
        observed = primaries[broker] / len(DEVICES)
        assert abs(observed - share) <= 4 * se, (broker, observed, share, se)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_removing_a_broker_moves_only_its_devices(n: int) -> None:
    brokers = _brokers(n)
    gone = brokers[n // 2]
    rest = [b for b in brokers if b != gone]
    moved = 0
    for device in DEVICES:
        before = broker_order(device, brokers)
        after = broker_order(device, rest)
        # The others keep their order: a device whose primary stays keeps it, and every
        # fallback order is the old one without the broker removed.
        assert after == [b for b in before if b != gone]
        moved += before[0] == gone
    assert moved > 0


def test_anonymous_devices_share_one_order() -> None:
    brokers = _brokers(3)
    assert broker_order(None, brokers) == broker_order("", brokers)
