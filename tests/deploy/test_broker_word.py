"""What the broker and the collector say reaches only whom it concerns, against the production
Mosquitto configuration (deploy/mosquitto/: TLS, password file, ACL).

* A publish the ACL refuses (MQTT 5 PUBACK 0x87) is in the agent's ledger as "refused by the
  broker: not authorized" after one collection cycle's publishing, and the report stays in
  the outbox, waiting its receipt wait instead of being re-sent at once.
* A device that names another connection's receipt topic as its Response Topic gets no
  receipt published there; the same request naming its own topic is answered (the positive
  control), and an observer allowed to read every topic sees nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.config import BrokerConfig
from agent.core import Agent
from agent.mqtt import MqttTransport
from agent.publisher import Publisher, ReceiptPolicy
from agent.sealed import Sealer
from protocol.randomness import SeededRandom
from protocol.receipts import decode_receipts
from runtime.backoff import Backoff
from tests.collector.processes import CollectorProcess
from tests.collector.support import load_registry, run_async, write_registry
from tests.deploy.conftest import Clients
from tests.deploy.probe import Probe
from tests.deploy.secure_broker import SecureBroker

DAY = 86_400.0
DEADLINE = 60.0
"""A hang guard: every wait below ends long before on a working system."""


class _OffsetClock:
    """Real time shifted by ``offset`` (the agent records "yesterday", then collects now)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, when: float) -> None:
        await asyncio.sleep(max(0.0, when - self.time()))


async def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {DEADLINE:g} s")
        await asyncio.sleep(0.02)


def _password_file(root: Path, broker: SecureBroker, user: str) -> Path:
    path = root / f"{user}.password"
    path.write_text(broker.passwords[user] + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


@run_async
async def test_a_publish_the_acl_refuses_is_in_the_ledger_within_one_cycle(
    secure_broker: SecureBroker, tmp_path: Path
) -> None:
    """dev-a's credentials with reports staged under dev-b's identity: every PUBACK is 0x87."""
    registry = load_registry(write_registry(tmp_path))
    clock = _OffsetClock(-DAY)
    # The identity in the report topics is not the one the broker authenticates (a device
    # configured with another device's name): the ACL (%u) refuses each publish.
    agent = Agent(
        registry=registry,
        state_dir=tmp_path / "agent",
        sealer=Sealer(b"\x07" * 32),
        clock=clock,
        rng=SeededRandom(7),
        device_identity="dev-b",
    )
    agent.grant_consent()
    agent.record("flag", 1)
    agent.record("usage", 600)
    clock.offset = 0.0
    agent.collect()  # the one cycle
    staged = {p.entry.report_id for p in agent.outbox()}
    assert len(staged) == 2
    broker = BrokerConfig(
        host="127.0.0.1",
        port=secure_broker.tls_port,
        ca_file=secure_broker.ca_file,
        username="dev-a",
        password_file=_password_file(tmp_path, secure_broker, "dev-a"),
        publish_timeout=10.0,
        receipt_timeout_seconds=3600.0,
        receipt_backoff_max=3600.0,
    )
    publisher = Publisher(
        agent,
        MqttTransport(broker, SeededRandom(8)),
        clock=clock,
        rng=SeededRandom(9),
        backoff=Backoff(initial=0.2, cap=2.0),
        receipts=ReceiptPolicy(timeout=3600.0, cap=3600.0),
    )
    task = asyncio.create_task(publisher.run())
    publisher.kick()
    try:
        await _until(lambda: publisher.statistics().refused_by_broker >= 2, "two refusals")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    entries = {e.report_id: e.status for e in agent.ledger()}
    assert entries == dict.fromkeys(staged, "refused by the broker: not authorized")
    # Not retried blindly: each waits in the outbox, sent once, for its receipt wait (an hour).
    assert {p.entry.report_id: p.entry.attempts for p in agent.outbox()} == dict.fromkeys(staged, 1)
    stats = publisher.statistics()
    assert (stats.refused_by_broker, stats.acknowledged, stats.failures, stats.connections) == (2, 0, 0, 1)


def _collector_config(root: Path, broker: SecureBroker, registry: Path) -> Path:
    path = root / "collector.toml"
    path.write_text(
        f"""registry = "{registry}"
instance = "receipts"

[mqtt]
host = "127.0.0.1"
port = {broker.tls_port}
client_id = "ldp-collector-{secrets.token_hex(6)}"
reconnect_max_s = 0.5
username = "collector"
password_file = "{_password_file(root, broker, "collector")}"
[mqtt.tls]
ca_file = "{broker.ca_file}"

[ingest]
commit_interval_s = 0.05

[store]
path = "{root / "collector.sqlite3"}"

[http]
enabled = false
""",
        encoding="utf-8",
    )
    return path


def _ask_receipt(sender: Probe, topic: str, response_topic: str, correlation: bytes) -> None:
    """Publish a message that is no report (the collector refuses it and says so in a receipt)."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ResponseTopic = response_topic
    props.CorrelationData = correlation
    info = sender.client.publish(topic, b"not a report", qos=1, properties=props)
    info.wait_for_publish(DEADLINE)


@run_async
async def test_a_receipt_goes_only_to_the_senders_own_topic(
    secure_broker: SecureBroker, clients: Clients, tmp_path: Path
) -> None:
    """dev-b names dev-a's receipt topic (and 0.1.0's layout): no receipt there; its own topic gets one."""
    registry = write_registry(tmp_path)
    collector = CollectorProcess(_collector_config(tmp_path, secure_broker, registry), log=tmp_path / "c.log")
    await asyncio.to_thread(collector.start)
    try:
        observer = clients.connected("observer")
        assert observer.subscribe("ldp/v1/receipts/#") == [1]
        victim_id, attacker_id = f"victim-{secrets.token_hex(6)}", f"attacker-{secrets.token_hex(6)}"
        victim = clients.connected("dev-a", client_id=victim_id)
        victim_topic = f"ldp/v1/receipts/dev-a/{victim_id}"
        assert victim.subscribe(victim_topic) == [1]
        attacker = clients.connected("dev-b", client_id=attacker_id)
        own_topic = f"ldp/v1/receipts/dev-b/{attacker_id}"
        assert attacker.subscribe(own_topic) == [1]
        report_topic = "ldp/v1/reports/dev-b/flag"
        await asyncio.to_thread(_ask_receipt, attacker, report_topic, victim_topic, b"\x01" * 16)
        await asyncio.to_thread(_ask_receipt, attacker, report_topic, f"ldp/v1/receipts/{victim_id}", b"\x02" * 16)
        await asyncio.to_thread(_ask_receipt, attacker, report_topic, own_topic, b"\x03" * 16)
        # Positive control: the request naming the sender's own topic is answered (after its commit,
        # which comes after the two before it: one connection's messages arrive in order).
        answered = await asyncio.to_thread(attacker.wait_messages, 1, own_topic, DEADLINE)
        assert [(r.correlation, r.counted) for r in decode_receipts(answered[0])] == [(b"\x03" * 16, False)]
        await asyncio.to_thread(observer.wait_messages, 1, own_topic, DEADLINE)
        await asyncio.to_thread(observer.sync)
        await asyncio.to_thread(victim.sync)
        assert victim.received() == []
        assert {topic for topic, _, _ in observer.messages} == {own_topic}
    finally:
        assert await asyncio.to_thread(collector.stop) == 0
