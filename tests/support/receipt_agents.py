"""Many agents in one process, each published with receipts through its own brokers, as the daemon does.

    python -m tests.support.receipt_agents --registry R --state DIR --agents N \\
        --broker HOST:PORT --broker HOST:PORT

Each agent is the agent library as ``agent.daemon`` drives it: an :class:`~agent.core.Agent`
over a state directory of its own, under an identity of its own (the broker user name
``dev-NNN``), and a :class:`~agent.publisher.Publisher` with one
:class:`~agent.transport.Route` per broker in the device's rendezvous order
(``agent.daemon.broker_routes``), waiting for commit receipts. All of them share one event
loop and one :class:`ShiftedClock`: real time plus an offset that each simulated collection
cycle moves on by six hours, so receipt waits and reconnect backoff run in real time while
the agents live through days.

The test drives the process with one JSON object per line on stdin and reads one JSON answer
per line on stdout:

* ``{"cmd": "stage", "cycles": n}``: n cycles (each agent records, the clock moves on six
  hours, each agent collects), then every publisher is kicked; answers the reports staged.
* ``{"cmd": "mark", "name": s, "at": t}``: the reports waiting in the outboxes now are watched
  until the last of them is settled; ``t`` is the ``time.monotonic()`` of the event (a kill)
  the time is measured from (the machine's monotonic clock, the same in every namespace).
* ``{"cmd": "drain", "timeout": s}``: waits until every outbox is empty (or ``s`` seconds).
* ``{"cmd": "summary"}``: every agent's ledger (report ids, statuses, brokers) and the marks;
  then the process stops its publishers and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.brokers import broker_order
from agent.config import BrokerConfig
from agent.core import Agent
from agent.identity import device_identity
from agent.mqtt import MqttTransport
from agent.publisher import Publisher, ReceiptPolicy
from agent.sealed import Sealer
from agent.transport import Route
from protocol.randomness import SeededRandom
from protocol.registry import Registry, parse_registry
from runtime.backoff import Backoff

__all__ = ["ShiftedClock", "main"]

CYCLE_S = 6 * 3600.0
"""One simulated collection cycle: the 6-hour period of the test registry's ``usage``."""
KEY = bytes(range(32))
RECEIPT_TIMEOUT_S = 3.0
"""A short receipt wait: a report a restarted broker dropped before the collectors subscribed
again is sent again soon (the collector answers a second copy "counted" and folds it once)."""
POLL_S = 0.02


class ShiftedClock:
    """Real time plus an offset that only grows (:meth:`advance`); sleeps last real seconds.

    ``sleep_until`` re-reads the time at least every 0.1 s, so a deadline an advance has
    passed returns at once, as :class:`runtime.clock.SystemClock` does after a suspend.
    """

    def __init__(self, start: float) -> None:
        self.offset = start - time.time()

    def time(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, when: float) -> None:
        while (remaining := when - self.time()) > 0:
            await asyncio.sleep(min(remaining, 0.1))


@dataclass
class Device:
    """One agent and its publisher."""

    agent: Agent
    publisher: Publisher
    order: list[str]


@dataclass
class Mark:
    """Reports waiting at an event, and when the last of them was settled."""

    name: str
    at: float
    waiting: set[tuple[int, bytes]]
    total: int
    last_settled: float | None = None
    settled_through: dict[str, int] = field(default_factory=dict)


def build_devices(
    registry: Registry, state: Path, agents: int, brokers: Sequence[str], clock: ShiftedClock
) -> list[Device]:
    """``agents`` agents, each with its state directory, user name and routes in its own order."""
    devices = []
    for i in range(agents):
        cfg = BrokerConfig(
            addresses=tuple(brokers),
            tls=False,
            username=f"dev-{i:03d}",
            publish_timeout=30.0,
            backoff_initial=0.2,
            backoff_max=1.0,
            receipt_timeout_seconds=RECEIPT_TIMEOUT_S,
            receipt_backoff_max=4 * RECEIPT_TIMEOUT_S,
        )
        rng = SeededRandom(1_000 + i)
        # As agent.daemon.broker_routes: the device's identity orders the brokers.
        order = broker_order(device_identity(cfg), cfg.endpoints)
        routes = [Route(str(a), MqttTransport(cfg, rng, address=a)) for a in order]
        agent = Agent(
            registry=registry,
            state_dir=state / f"agent-{i:03d}",
            sealer=Sealer(KEY),
            clock=clock,
            rng=SeededRandom(i),
            device_identity=cfg.username,
        )
        agent.grant_consent()
        publisher = Publisher(
            agent,
            routes,
            clock=clock,
            rng=rng,
            backoff=Backoff(initial=cfg.backoff_initial, cap=cfg.backoff_max),
            receipts=ReceiptPolicy(timeout=cfg.receipt_timeout_seconds, cap=cfg.receipt_backoff_max),
        )
        devices.append(Device(agent, publisher, [str(a) for a in order]))
    return devices


class Fleet:
    """The devices, their publishers' tasks and the marks."""

    def __init__(self, devices: list[Device], clock: ShiftedClock) -> None:
        self.devices = devices
        self.clock = clock
        self.cycles = 0
        self.staged: set[bytes] = set()
        self.marks: list[Mark] = []

    async def stage(self, cycles: int) -> int:
        """Record, move the clock one cycle on, collect; ``cycles`` times. Returns the reports staged.

        The event loop gets a turn after each agent, so the publishers keep sending and
        settling receipts while a cycle is staged (as each device's daemon would).
        """
        before = len(self.staged)
        for _ in range(cycles):
            n = self.cycles
            for i, device in enumerate(self.devices):
                device.agent.record("usage", (37 * i + 11 * n) % 3_600)
                device.agent.record("hist", (i + n) % 100)
                await asyncio.sleep(0)
            self.clock.advance(CYCLE_S)
            for device in self.devices:
                device.agent.collect()
                self.staged.update(p.entry.report_id for p in device.agent.outbox())
                await asyncio.sleep(0)
            self.cycles += 1
        for device in self.devices:
            device.publisher.kick()
        return len(self.staged) - before

    def waiting(self) -> set[tuple[int, bytes]]:
        return {(i, p.entry.report_id) for i, d in enumerate(self.devices) for p in d.agent.outbox()}

    def mark(self, name: str, at: float) -> Mark:
        waiting = self.waiting()
        mark = Mark(name, at, waiting, len(waiting))
        self.marks.append(mark)
        return mark

    async def watch(self) -> None:
        """Note when the last report of each mark leaves its outbox (its receipt came)."""
        while True:
            open_marks = [m for m in self.marks if m.last_settled is None]
            if open_marks:
                now_waiting = self.waiting()
                for mark in open_marks:
                    if not mark.waiting & now_waiting:
                        mark.last_settled = time.monotonic()
            await asyncio.sleep(POLL_S)

    async def drain(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(d.agent.outbox_size for d in self.devices):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

    def summary(self) -> dict[str, Any]:
        ledgers = []
        for device in self.devices:
            entries = device.agent.ledger()
            ledgers.append(
                {
                    "order": device.order,
                    "outbox": device.agent.outbox_size,
                    "entries": [[e.report_id.hex(), e.use_case, e.status, e.broker] for e in entries],
                    "acknowledged": device.publisher.statistics().acknowledged,
                }
            )
        marks = [
            {
                "name": m.name,
                "waiting": m.total,
                "seconds": None if m.last_settled is None else max(0.0, m.last_settled - m.at),
            }
            for m in self.marks
        ]
        return {"staged": sorted(r.hex() for r in self.staged), "agents": ledgers, "marks": marks}


async def serve(fleet: Fleet) -> None:
    """Answer the commands on stdin until ``summary``."""
    tasks = [asyncio.create_task(d.publisher.run()) for d in fleet.devices]
    tasks.append(asyncio.create_task(fleet.watch()))
    try:
        print(json.dumps({"ready": len(fleet.devices)}), flush=True)
        while line := await asyncio.to_thread(sys.stdin.readline):
            command = json.loads(line)
            cmd = command["cmd"]
            if cmd == "stage":
                answer: dict[str, Any] = {"staged": await fleet.stage(int(command["cycles"]))}
            elif cmd == "mark":
                answer = {"waiting": fleet.mark(str(command["name"]), float(command["at"])).total}
            elif cmd == "drain":
                answer = {"drained": await fleet.drain(float(command["timeout"]))}
            elif cmd == "summary":
                print(json.dumps(fleet.summary()), flush=True)
                return
            else:
                answer = {"error": f"unknown command {cmd!r}"}
            print(json.dumps(answer), flush=True)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="receipt_agents", description=__doc__.splitlines()[0])
    parser.add_argument("--registry", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--agents", type=int, required=True)
    parser.add_argument("--broker", action="append", required=True, help="host:port, once per broker")
    parser.add_argument("--start", type=float, required=True, help="the simulated time of the first cycle")
    ns = parser.parse_args(argv)
    # The publishers' failovers and resends, with times, in the test's log of this process.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    registry = parse_registry(ns.registry.read_bytes(), source=str(ns.registry))
    clock = ShiftedClock(ns.start)
    fleet = Fleet(build_devices(registry, ns.state, ns.agents, ns.broker, clock), clock)
    asyncio.run(serve(fleet))
    return 0


if __name__ == "__main__":
    sys.exit(main())
