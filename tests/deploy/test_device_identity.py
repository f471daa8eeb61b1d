"""Per-device identities at the broker (deploy/mosquitto/acl, ``pattern write ldp/v1/reports/%u/+``):
a device publishes only under its own authenticated identity, by password and by certificate,
so the identity a collector reads from the topic cannot be forged by another device; the
fleet simulator's credential reaches only its own sub-identities."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from agent.config import BrokerConfig
from agent.core import Agent
from agent.identity import device_identity
from agent.mqtt import MqttTransport
from agent.publisher import Publisher
from agent.sealed import Sealer
from protocol.randomness import SeededRandom
from protocol.registry import parse_registry
from tests.agent.conftest import KEY, REGISTRY, START
from tests.deploy.conftest import Clients
from tests.deploy.probe import DEADLINE, V5, V311
from tests.deploy.secure_broker import SecureBroker
from tests.support.clocks import FakeClock

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


# --- the agent's side: the identity it derives is the one the broker enforces ---------------


async def _publish_one_report(broker_cfg: BrokerConfig, state: Path) -> str:
    """A real agent (identity from its broker config) records, collects and publishes one report; its topic."""
    clock = FakeClock(START)
    agent = Agent(
        registry=parse_registry(REGISTRY, source="t"),
        state_dir=state,
        sealer=Sealer(KEY),
        clock=clock,
        rng=SeededRandom(3),
        device_identity=device_identity(broker_cfg),
    )
    agent.grant_consent()
    agent.record("flag", 1)
    clock.set(clock.time() + 86_400)
    agent.collect()
    (pending,) = agent.outbox()
    publisher = Publisher(agent, MqttTransport(broker_cfg, SeededRandom(4)), clock=clock, rng=SeededRandom(5))
    assert await publisher.drain_once() == 1
    return pending.topic


@pytest.mark.parametrize("mtls", [False, True], ids=["password", "certificate"])
def test_agent_publishes_under_the_identity_the_broker_authenticates(
    clients: Clients, secure_broker: SecureBroker, tmp_path: Path, mtls: bool
) -> None:
    """An agent configured as dev-a (user name) or dev-b (certificate CN) publishes where the ACL lets it."""
    observer = clients.connected("observer")
    assert observer.subscribe("#") == [1]
    pki = secure_broker.pki
    if mtls:
        cfg = BrokerConfig(
            host="127.0.0.1",
            port=secure_broker.mtls_port,
            ca_file=secure_broker.ca_file,
            cert_file=pki / "dev-b.pem",
            key_file=pki / "dev-b.key",
            publish_timeout=DEADLINE,
        )
        expected = "ldp/v1/reports/dev-b/flag"
    else:
        password = tmp_path / "password"
        password.write_text(secure_broker.passwords["dev-a"], encoding="utf-8")
        password.chmod(0o600)
        cfg = BrokerConfig(
            host="127.0.0.1",
            port=secure_broker.tls_port,
            ca_file=secure_broker.ca_file,
            username="dev-a",
            password_file=password,
            publish_timeout=DEADLINE,
        )
        expected = "ldp/v1/reports/dev-a/flag"
    topic = asyncio.run(_publish_one_report(cfg, tmp_path / "state"))
    assert topic == expected
    assert len(observer.wait_messages(1, expected)) == 1
