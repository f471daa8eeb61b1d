"""Agents of the previous release and of this one report to a collector of this release at once; all are counted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from pathlib import Path

import msgpack

from agent.config import BrokerConfig
from agent.core import Agent
from agent.mqtt import MqttTransport
from agent.publisher import Publisher, ReceiptPolicy
from agent.sealed import Sealer
from collector.store import CheckpointStore
from protocol.randomness import SeededRandom
from protocol.registry import parse_registry
from runtime.backoff import Backoff
from tests.agent.conftest import REGISTRY
from tests.collector.processes import CollectorProcess
from tests.collector.support import plain_equal, reference_aggregates, run_async
from tests.compat.previous_release import PreviousRelease
from tests.support.broker import Broker

DAY = 86_400.0
NEW_AGENTS = 3
SETTLE_SECONDS = 90.0
"""A hang guard: every report is counted long before (the collector commits every 50 ms)."""

VALUES = {"flag": 1, "seconds": 600, "hist": 300.0, "procs": "bash", "words": "hello"}

# Run by the previous release: one agent records yesterday's values, collects now and publishes
# them with commit receipts until the collector has answered every one (or the guard ends).
_OLD_AGENT = """
import asyncio, faulthandler, json, sys, time
from pathlib import Path
from agent.config import BrokerConfig
from agent.core import Agent
from agent.mqtt import MqttTransport
from agent.publisher import Publisher, ReceiptPolicy
from agent.sealed import Sealer
from protocol.randomness import SeededRandom
from protocol.registry import parse_registry
from runtime.backoff import Backoff

registry_path, state, port, guard = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
values = json.loads(sys.argv[5])
# Past the guard and its margin, the stacks of every thread go to stderr and the process ends,
# so a hang is reported with where it hung.
faulthandler.dump_traceback_later(guard + 30.0, exit=True)

class Clock:
    offset = -86_400.0
    def time(self): return time.time() + self.offset
    async def sleep(self, s): await asyncio.sleep(max(0.0, s))
    async def sleep_until(self, t): await asyncio.sleep(max(0.0, t - self.time()))

registry = parse_registry(Path(registry_path).read_bytes(), source=registry_path)
clock = Clock()
agent = Agent(registry=registry, state_dir=Path(state), sealer=Sealer(b"\\x42" * 32), clock=clock, rng=SeededRandom(99))
agent.grant_consent()
for name, value in values.items():
    agent.record(name, value)
clock.offset = 0.0
agent.collect()
payloads = [p.entry.payload.hex() for p in agent.outbox()]
broker = BrokerConfig(host="127.0.0.1", port=port, tls=False, publish_timeout=10.0, receipt_timeout_seconds=1.0,
                      receipt_backoff_max=4.0)
publisher = Publisher(agent, MqttTransport(broker, SeededRandom(98)), clock=clock, rng=SeededRandom(97),
                      backoff=Backoff(initial=0.2, cap=2.0), receipts=ReceiptPolicy(timeout=1.0, cap=4.0))

async def main():
    task = asyncio.create_task(publisher.run())
    publisher.kick()
    deadline = time.monotonic() + guard
    while agent.outbox() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass

asyncio.run(main())
print(json.dumps({"payloads": payloads, "statuses": [e.status for e in agent.ledger()]}))
"""


class _OffsetClock:
    """Real time shifted by ``offset`` (the agents record "yesterday", then collect now)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def time(self) -> float:
        return time.time() + self.offset

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, when: float) -> None:
        await asyncio.sleep(max(0.0, when - self.time()))


def _collector_config(root: Path, registry: Path, port: int) -> Path:
    path = root / "collector.toml"
    path.write_text(
        f"""registry = "{registry}"
instance = "mixed"

[mqtt]
host = "127.0.0.1"
port = {port}
client_id = "ldp-collector-mixed"
reconnect_max_s = 0.5

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


@run_async
async def test_agents_of_both_releases_report_to_one_collector_and_are_all_counted(
    previous_release: PreviousRelease, mosquitto: Broker, tmp_path: Path
) -> None:
    """An agent of 0.1.0 (format 1) and agents of this release (format 2), at once: every receipt says counted."""
    registry_path = tmp_path / "usecases.toml"
    registry_path.write_text(REGISTRY, encoding="utf-8")
    registry = parse_registry(registry_path.read_bytes(), source=str(registry_path))
    collector = CollectorProcess(_collector_config(tmp_path, registry_path, mosquitto.port), log=tmp_path / "c.log")
    await asyncio.to_thread(collector.start)
    try:
        old = subprocess.Popen(
            previous_release.command(
                _OLD_AGENT,
                str(registry_path),
                str(tmp_path / "old-agent"),
                str(mosquitto.port),
                str(SETTLE_SECONDS),
                json.dumps(VALUES),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        clock = _OffsetClock(-DAY)
        agents = []
        for i in range(NEW_AGENTS):
            agent = Agent(
                registry=registry,
                state_dir=tmp_path / f"new-{i}",
                sealer=Sealer(bytes([i + 1]) * 32),
                clock=clock,
                rng=SeededRandom(10 + i),
            )
            agent.grant_consent()
            for name, value in VALUES.items():
                agent.record(name, value)
            agents.append(agent)
        clock.offset = 0.0
        for agent in agents:
            agent.collect()
        new_payloads = [p.entry.payload for a in agents for p in a.outbox()]
        broker = BrokerConfig(
            host="127.0.0.1",
            port=mosquitto.port,
            tls=False,
            publish_timeout=10.0,
            receipt_timeout_seconds=1.0,
            receipt_backoff_max=4.0,
        )
        publishers = [
            Publisher(
                agent,
                MqttTransport(broker, SeededRandom(20 + i)),
                clock=clock,
                rng=SeededRandom(30 + i),
                backoff=Backoff(initial=0.2, cap=2.0),
                receipts=ReceiptPolicy(timeout=1.0, cap=4.0),
            )
            for i, agent in enumerate(agents)
        ]
        tasks = [asyncio.create_task(p.run()) for p in publishers]
        for p in publishers:
            p.kick()
        deadline = time.monotonic() + SETTLE_SECONDS
        while any(a.outbox() for a in agents) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        try:
            out, err = await asyncio.to_thread(old.communicate, timeout=SETTLE_SECONDS + 60)
        except subprocess.TimeoutExpired:
            old.kill()
            out, err = await asyncio.to_thread(old.communicate)
        log_tail = collector.log.read_text(encoding="utf-8", errors="replace")[-3000:]
        assert old.returncode == 0, f"the old agent's stderr:\n{err[-5000:]}\nthe collector's log:\n{log_tail}"
        previous = json.loads(out.strip().splitlines()[-1])
    finally:
        assert await asyncio.to_thread(collector.stop) == 0
    old_payloads = [bytes.fromhex(p) for p in previous["payloads"]]
    assert {msgpack.unpackb(p)["v"] for p in old_payloads} == {1}
    assert {msgpack.unpackb(p)["v"] for p in new_payloads} == {2}
    assert previous["statuses"] == ["counted"] * len(old_payloads)
    assert [e.status for a in agents for e in a.ledger()] == ["counted"] * len(new_payloads)
    # Both formats fold into the same definitions' aggregates, each report exactly once.
    payloads = old_payloads + new_payloads
    reference = reference_aggregates(registry, payloads)
    store = CheckpointStore(tmp_path / "collector.sqlite3", registry, readonly=True)
    try:
        totals = {(k.use_case, k.period): k.reports for k in store.totals()}
        assert set(totals) == set(reference)
        for key, agg in reference.items():
            assert plain_equal(store.aggregate(*key)[0], agg), key
        assert sum(totals.values()) == len(payloads)
        assert all(n == NEW_AGENTS + 1 for n in totals.values())
    finally:
        store.close()
