"""With commit receipts, every loss between device and store becomes a delay (docs/design.md §6.2).

Each test runs the production broker config (TLS, password file, ACL; only the queue limit
made small), a collector process and real agents (``agent.core.Agent`` + ``Publisher`` over
``agent.mqtt`` with receipts on, a short receipt timeout). It causes one loss the broker's
PUBACK cannot see, ends the cause, and then requires, within a stated bound, that every
agent's ledger says "counted" for every report and that the stored aggregates equal an
in-process reference folded from exactly the reports the agents staged: every honest report
counted exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agent.config import BrokerConfig
from agent.core import Agent
from agent.mqtt import MqttTransport
from agent.publisher import Publisher, ReceiptPolicy
from agent.sealed import Sealer
from collector.store import CheckpointStore
from protocol.randomness import SeededRandom
from protocol.registry import Registry
from runtime.backoff import Backoff
from tests.collector.processes import CollectorProcess
from tests.collector.support import load_registry, plain_equal, reference_aggregates, run_async, write_registry
from tests.deploy.conftest import BrokerUsers
from tests.deploy.probe import Probe, tls_context
from tests.deploy.secure_broker import SecureBroker, make_users, running_secure_broker

DEVICES = 10
QUEUE_LIMIT = 8
"""The broker's max_queued_messages here: far below the reports sent while the collector is away."""
SETTLE_SECONDS = 60.0
"""The bound: after the cause ends, every report is counted within this time."""
USE_CASES = ("flag", "hist", "home", "usage")
DAY = 86_400.0


class OffsetClock:
    """Real time shifted by ``offset`` (the agents record "yesterday", then collect now)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, when: float) -> None:
        await asyncio.sleep(max(0.0, when - self.time()))


def _value(use_case: str, device: int) -> object:
    return {"flag": device % 2, "hist": (device * 13) % 100, "home": f"site-{device % 3}", "usage": device * 90}[
        use_case
    ]


class Fleet:
    """Real agents with staged reports, publishing with receipts through the secure broker."""

    def __init__(
        self, root: Path, registry: Registry, broker: SecureBroker, *, timeout: float = 1.0, receipts: bool = True
    ) -> None:
        self.registry = registry
        root.mkdir(parents=True, exist_ok=True)
        # One broker user per device: the ACL puts each under ldp/v1/reports/<its user>/, and
        # the collector folds at most one report per (device, use case, period).
        self.configs = []
        for d in range(DEVICES):
            password = root / f"dev-{d}.password"
            password.write_text(broker.passwords[f"dev-{d}"] + "\n", encoding="utf-8")
            password.chmod(0o600)
            self.configs.append(
                BrokerConfig(
                    host="127.0.0.1",
                    port=broker.tls_port,
                    ca_file=broker.ca_file,
                    username=f"dev-{d}",
                    password_file=password,
                    publish_timeout=10.0,
                    receipt_timeout_seconds=timeout,
                    receipt_backoff_max=4 * timeout,
                    receipts=receipts,
                )
            )
        clock = OffsetClock(-DAY)
        self.clock = clock
        self.agents: list[Agent] = []
        for d in range(DEVICES):
            agent = Agent(
                registry=registry,
                state_dir=root / f"device-{d}",
                sealer=Sealer(bytes([d + 1]) * 32),
                clock=clock,
                rng=SeededRandom(1000 + d),
                device_identity=f"dev-{d}",
            )
            agent.grant_consent()
            for name in USE_CASES:
                agent.record(name, _value(name, d))
            self.agents.append(agent)
        clock.offset = 0.0
        for agent in self.agents:
            agent.collect()
        self.payloads = [p.entry.payload for a in self.agents for p in a.outbox()]
        assert len(self.payloads) == DEVICES * len(USE_CASES)
        self.publishers = [
            Publisher(
                agent,
                MqttTransport(self.configs[i], SeededRandom(2000 + i)),
                clock=clock,
                rng=SeededRandom(3000 + i),
                backoff=Backoff(initial=0.2, cap=2.0),
                receipts=ReceiptPolicy(timeout=timeout, cap=4 * timeout) if receipts else None,
            )
            for i, agent in enumerate(self.agents)
        ]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Publish (and re-send, and settle) until the block ends."""
        tasks = [asyncio.create_task(p.run()) for p in self.publishers]
        for p in self.publishers:
            p.kick()
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t

    def all_sent(self) -> bool:
        return all(p.entry.attempts > 0 for a in self.agents for p in a.outbox())

    def settled(self) -> bool:
        return all(not a.outbox() for a in self.agents)

    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.agents:
            for e in a.ledger():
                out[e.status] = out.get(e.status, 0) + 1
        return out

    def sends(self) -> int:
        return sum(p.statistics().acknowledged for p in self.publishers)


async def _until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``predicate`` (generous deadline); the seconds it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


def _collector_config(root: Path, broker: SecureBroker, registry: Path, *, client_id: str, group: str = "") -> Path:
    password = root / "collector-password"
    password.write_text(broker.passwords["collector"] + "\n", encoding="utf-8")
    password.chmod(0o600)
    path = root / "collector.toml"
    path.write_text(
        f"""registry = "{registry}"
instance = "faults"

[mqtt]
host = "127.0.0.1"
port = {broker.tls_port}
client_id = "{client_id}"
shared_group = "{group}"
keepalive_s = 10
reconnect_max_s = 0.5
username = "collector"
password_file = "{password}"
[mqtt.tls]
ca_file = "{broker.ca_file}"

[ingest]
commit_max_reports = 2000
commit_interval_s = 0.05

[store]
path = "{root / "collector.sqlite3"}"

[http]
enabled = false
""",
        encoding="utf-8",
    )
    return path


def _check_store(store: Path, registry: Registry, payloads: list[bytes]) -> None:
    reference = reference_aggregates(registry, payloads)
    db = CheckpointStore(store, registry, readonly=True)
    try:
        stored = {(k.use_case, k.period): k.reports for k in db.totals()}
        assert set(stored) == set(reference)
        for (name, period), agg in reference.items():
            assert plain_equal(db.aggregate(name, period)[0], agg), (name, period)
        assert sum(stored.values()) == len(payloads)  # each exactly once
    finally:
        db.close()


class Scene:
    """The broker, the collector process and the fleet of one test."""

    def __init__(self, root: Path, broker: SecureBroker, *, group: str = "", receipts: bool = True) -> None:
        self.root = root
        self.broker = broker
        self.registry_path = write_registry(root)
        self.registry = load_registry(self.registry_path)
        self.client_id = f"ldp-collector-{secrets.token_hex(6)}"
        self.config = _collector_config(root, broker, self.registry_path, client_id=self.client_id, group=group)
        self.collector = CollectorProcess(self.config, log=root / "collector.log")
        self.fleet = Fleet(root / "agents", self.registry, broker, receipts=receipts)

    async def start_collector(self) -> None:
        await asyncio.to_thread(self.collector.start)

    async def stop_collector(self) -> None:
        assert await asyncio.to_thread(self.collector.stop) == 0

    async def settle(self) -> float:
        """Wait (bounded) until every report is counted; check the store; the seconds it took."""
        took = await _until(self.fleet.settled, SETTLE_SECONDS, f"all receipts (ledger {self.fleet.statuses()})")
        print(
            f"{len(self.fleet.payloads)} reports counted exactly once {took:.1f} s after the cause ended"
            f" (bound {SETTLE_SECONDS:g} s; {self.fleet.sends()} sends)"
        )
        assert self.fleet.statuses() == {"counted": len(self.fleet.payloads)}
        await self.stop_collector()
        _check_store(self.root / "collector.sqlite3", self.registry, self.fleet.payloads)
        # Response topics name connections: never in the collector's log or store.
        assert "receipts/" not in (self.root / "collector.log").read_text(encoding="utf-8", errors="replace")
        for f in self.root.glob("collector.sqlite3*"):
            assert b"receipts/" not in f.read_bytes(), f
        return took


@pytest.fixture(scope="module")
def fault_users(tmp_path_factory: pytest.TempPathFactory) -> BrokerUsers:
    """The collector, one user per device, a flooding and an intruding device (make-broker-users.sh)."""
    base = tmp_path_factory.mktemp("fault-users")
    users = ("collector", "observer", "flooder", "intruder", *(f"dev-{d}" for d in range(DEVICES)))
    passwords = make_users(base / "passwd", base / "secrets", users)
    return BrokerUsers(passwd=base / "passwd", passwords=passwords)


@pytest.fixture
def small_queue_broker(tmp_path: Path, pki: Path, fault_users: BrokerUsers) -> Any:
    """The production broker config with max_queued_messages = QUEUE_LIMIT."""
    with running_secure_broker(
        tmp_path / "broker",
        pki=pki,
        passwd=fault_users.passwd,
        passwords=fault_users.passwords,
        overrides={"max_queued_messages": str(QUEUE_LIMIT)},
    ) as broker:
        yield broker


@pytest.fixture
def scene(tmp_path: Path, small_queue_broker: SecureBroker) -> Any:
    s = Scene(tmp_path, small_queue_broker)
    try:
        yield s
    finally:
        s.collector.close()


@run_async
async def test_collector_offline_past_the_queue_limit(scene: Scene) -> None:
    """40 reports PUBACKed while the collector is away and the broker keeps 8: all counted once it is back."""
    fleet = scene.fleet
    await scene.start_collector()  # its persistent session exists from now on
    await scene.stop_collector()
    async with fleet.running():
        await _until(fleet.all_sent, SETTLE_SECONDS, "every report PUBACKed once")
        # The broker acknowledged all 40; it can hold only 8 for the collector.
        assert fleet.statuses() == {"sent": len(fleet.payloads)}
        await scene.start_collector()
        await scene.settle()
    assert fleet.sends() > len(fleet.payloads)  # the dropped ones were sent again


@run_async
async def test_control_without_receipts_the_queue_limit_loses_reports(
    tmp_path: Path, small_queue_broker: SecureBroker
) -> None:
    """The cause is real: with receipts off, a PUBACK ends each report and only the broker's 8 are counted."""
    scene = Scene(tmp_path, small_queue_broker, receipts=False)
    try:
        fleet = scene.fleet
        await scene.start_collector()
        await scene.stop_collector()
        async with fleet.running():
            await _until(fleet.settled, SETTLE_SECONDS, "every report PUBACKed")
        assert fleet.statuses() == {"sent": len(fleet.payloads)}
        await scene.start_collector()
        store = scene.root / "collector.sqlite3"
        # Nothing else can arrive: the agents hold nothing more, the broker held QUEUE_LIMIT.
        await _until(
            lambda: _counter(store, scene.registry, "reports") >= QUEUE_LIMIT, SETTLE_SECONDS, "the queued reports"
        )
        await scene.stop_collector()
        assert _counter(store, scene.registry, "reports") == QUEUE_LIMIT < len(fleet.payloads)
    finally:
        scene.collector.close()


def _counter(store: Path, registry: Registry, name: str) -> int:
    db = CheckpointStore(store, registry, readonly=True)
    try:
        return db.counters().get(name, 0)
    finally:
        db.close()


@run_async
async def test_broker_killed_with_a_queue_before_autosave(scene: Scene) -> None:
    """kill -9 of the broker holding PUBACKed reports (autosave every 60 s): all counted after its restart."""
    fleet = scene.fleet
    await scene.start_collector()
    await scene.stop_collector()
    async with fleet.running():
        await _until(fleet.all_sent, SETTLE_SECONDS, "every report PUBACKed once")
        await asyncio.to_thread(scene.broker.kill9)
        await asyncio.to_thread(scene.broker.start)
        await scene.start_collector()
        await scene.settle()


@run_async
async def test_junk_flood_with_the_collector_offline(scene: Scene) -> None:
    """A device credential fills the collector's queue with junk first: honest reports still all count."""
    fleet = scene.fleet
    await scene.start_collector()
    await scene.stop_collector()
    flood = _device_probe(scene.broker, "flooder")
    try:
        assert flood.connect().accepted
        flood.publish_many("ldp/v1/reports/flooder/flag", [secrets.token_bytes(1000) for _ in range(5 * QUEUE_LIMIT)])
    finally:
        flood.close()
    async with fleet.running():
        await _until(fleet.all_sent, SETTLE_SECONDS, "every report PUBACKed once")
        await scene.start_collector()
        await scene.settle()
    # The broker's queue for the collector had filled with junk: it was delivered and refused.
    store = scene.root / "collector.sqlite3"
    db = CheckpointStore(store, scene.registry, readonly=True)
    try:
        refused = sum(v for k, v in db.counters().items() if k.startswith("rejected:"))
    finally:
        db.close()
    assert refused >= QUEUE_LIMIT


def _device_probe(broker: SecureBroker, user: str, client_id: str = "") -> Probe:
    return Probe(
        broker.tls_port,
        context=tls_context(broker.ca_file),
        username=user,
        password=broker.passwords[user],
        client_id=client_id,
    )


@run_async
async def test_a_device_in_the_collectors_shared_group(tmp_path: Path, small_queue_broker: SecureBroker) -> None:
    """A device joins $share/<group>/...: the reports routed to it vanish; once it leaves, all count once."""
    group = f"g{secrets.token_hex(6)}"
    scene = Scene(tmp_path, small_queue_broker, group=group)
    intruder = _device_probe(small_queue_broker, "intruder")
    try:
        await scene.start_collector()
        assert (await asyncio.to_thread(intruder.connect)).accepted
        granted = await asyncio.to_thread(intruder.subscribe, f"$share/{group}/ldp/v1/reports/#")
        assert granted == [1]  # Mosquitto 2.0 cannot refuse it (tests/deploy/test_acl.py)
        fleet = scene.fleet
        async with fleet.running():
            await _until(fleet.all_sent, SETTLE_SECONDS, "every report PUBACKed once")
            # Some reports went to the intruder and were withheld from it by the ACL: lost to
            # the broker, so no receipt; their resends meet the same odds while it stays.
            await _until(lambda: fleet.sends() > len(fleet.payloads), SETTLE_SECONDS, "a resend")
            await asyncio.to_thread(intruder.close)  # the cause ends
            await scene.settle()
        assert intruder.received() == []
    finally:
        intruder.close()
        scene.collector.close()


@run_async
async def test_a_device_taking_the_collectors_client_id(tmp_path: Path, small_queue_broker: SecureBroker) -> None:
    """A device resumes the collector's session by its client id: what it takes is lost; after it, all count once."""
    scene = Scene(tmp_path, small_queue_broker)
    intruder = _device_probe(small_queue_broker, "intruder", client_id=scene.client_id)
    try:
        await scene.start_collector()
        await scene.stop_collector()
        # The device takes over the collector's persistent session (its ldp/v1/reports/#
        # subscription included); the ACL withholds every report from it, so each is dropped.
        result = await asyncio.to_thread(functools.partial(intruder.connect, clean_start=False, session_expiry=3600))
        assert result.accepted
        fleet = scene.fleet
        async with fleet.running():
            await _until(fleet.all_sent, SETTLE_SECONDS, "every report PUBACKed once")
            await asyncio.to_thread(intruder.close)  # the cause ends
            await scene.start_collector()
            await scene.settle()
        assert intruder.received() == []
    finally:
        intruder.close()
        scene.collector.close()
