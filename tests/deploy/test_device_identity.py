"""Per-device identities at the broker (deploy/mosquitto/acl, ``pattern write ldp/v1/reports/%u/+``):
a device publishes only under its own authenticated identity, by password and by certificate,
so the identity a collector reads from the topic cannot be forged by another device; the
fleet simulator's credential reaches only its own sub-identities."""

from __future__ import annotations

import itertools

import pytest

from tests.deploy.conftest import Clients
from tests.deploy.probe import V5, V311

PROTOCOLS = [pytest.param(V311, id="mqtt311"), pytest.param(V5, id="mqtt5")]
_names = itertools.count()


def _use_case() -> str:
    return f"identity-test-{next(_names)}"


def _refused(protocol: int) -> int:
    # MQTT 3.1.1 has no refusal in PUBACK: the broker acknowledges and drops the message.
    return 0x87 if protocol == V5 else 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mtls", [False, True], ids=["password", "certificate"])
def test_device_cannot_publish_under_another_identity(clients: Clients, protocol: int, mtls: bool) -> None:
    """dev-a's reports under ldp/v1/reports/dev-b/ (or with no identity) reach nobody; under its own they arrive."""
    observer = clients.connected("observer")
    assert observer.subscribe("#") == [1]
    dev_a = clients.connected("dev-a", protocol=protocol, mtls=mtls)
    dev_b = clients.connected("dev-b", protocol=protocol, mtls=mtls)
    uc = _use_case()
    forged = [
        f"ldp/v1/reports/dev-b/{uc}",  # another device
        f"ldp/v1/reports/{uc}",  # no identity
        f"ldp/v1/reports/fleet-sim/1/{uc}",  # the simulator's sub-identities
        f"ldp/v1/reports/dev-a/x/{uc}",  # a sub-identity of its own (only the simulator has those)
    ]
    for topic in forged:
        assert dev_a.publish(topic, b"forged " + topic.encode()) == _refused(protocol), topic
    assert dev_b.publish(f"ldp/v1/reports/dev-b/{uc}", b"dev-b's own") == 0
    assert dev_a.publish(f"ldp/v1/reports/dev-a/{uc}", b"dev-a's own") == 0
    # The broker handles one client's packets in order: dev-a's own report, published after the
    # forgeries, arriving means any forgery it had routed would have arrived first.
    assert observer.wait_messages(1, f"ldp/v1/reports/dev-a/{uc}") == [b"dev-a's own"]
    assert observer.wait_messages(1, f"ldp/v1/reports/dev-b/{uc}") == [b"dev-b's own"]
    observer.sync()
    assert sorted(observer.received()) == [b"dev-a's own", b"dev-b's own"]


def test_fleet_simulator_publishes_only_under_its_sub_identities(clients: Clients) -> None:
    """fleet-sim may publish under ldp/v1/reports/fleet-sim/<n>/<uc>, never under a device's identity."""
    observer = clients.connected("observer")
    assert observer.subscribe("#") == [1]
    sim = clients.connected("fleet-sim")
    uc = _use_case()
    for topic in (f"ldp/v1/reports/dev-a/{uc}", f"ldp/v1/reports/{uc}", f"ldp/v1/reports/fleet-sim/1/{uc}/deeper"):
        assert sim.publish(topic, b"forged") == 0x87, topic
    own = [f"ldp/v1/reports/fleet-sim/{n:06d}/{uc}" for n in range(3)]
    for topic in own:
        assert sim.publish(topic, topic.encode()) == 0
    got: list[bytes] = []
    for topic in own:
        got += observer.wait_messages(1, topic)
    observer.sync()
    assert sorted(observer.received()) == sorted(t.encode() for t in own)
    assert sorted(got) == sorted(t.encode() for t in own)
