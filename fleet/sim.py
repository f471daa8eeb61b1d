"""The fleet simulator's devices: many real agents in one process, on a simulated clock.

Each simulated device is a complete :class:`agent.core.Agent` (its own sealed state with its
own key, daily limits, ε accounting, permanent randomness and memo tables, outbox and
ledger) driven by an :class:`agent.daemon.Daemon`, whose collection cycle and publisher are
the ones a real device runs. Only three things differ from a device:

* **Time.** The devices of one worker share a :class:`fleet.clock.FakeClock`. Simulated time
  moves slot by slot (6 hours); inside a slot every device runs its cycle at its own jittered
  due time (``agent.schedule.next_cycle_after`` with the device's random source), in time
  order, so days pass in seconds.
* **Randomness.** Each device's random source is a :class:`protocol.randomness.SeededRandom`
  derived from ``(seed, device number)``: runs are reproducible, and a device's coins do not
  depend on how devices are split between worker processes.
* **State storage and connections.** Sealed state stays in memory (:class:`MemorySealer`,
  still AES-GCM sealed, just not fsynced to disk thousands of times a second) unless a state
  directory is asked for, and the devices share a small pool of MQTT connections
  (:class:`ConnectionPool`) instead of each opening its own TLS session per cycle. The pool
  authenticates as the simulator's own broker user (``fleet-sim`` in the demo), and each
  device publishes under its own sub-identity, ``<prefix>/<user>/<device number>/<use case>``:
  the collector gives every simulated device its own allowance, and the broker's ACL
  (``deploy/mosquitto/acl.fleet-sim``) still checks that only the simulator's user writes there.

The truth is kept exactly, per use-case *definition*: a device's value for a (use case,
period) is tallied under the definition its report was made with (the hash the report
carries) when the collector's commit receipt says the report was counted, or, without
receipts, when the broker acknowledges it. Values a device recorded but never sent (daily
limit, lifetime ε cap) are not part of the truth, and the truth of a frequency use case is
the counts of the values actually reported.

**Commit receipts.** Each pooled connection has a response topic of its own; a device's
report is published on one with its report id as correlation data, and the receipt that
comes back is routed to the device whose outbox holds that id (its agent settles it exactly
as a device does: the ledger says counted or refused, the report leaves the outbox). A report
without a receipt after ``receipt_timeout`` real seconds is sent again, byte for byte. The
run ends when every report has its receipt, or after ``receipt_wait`` real seconds.
A device's reports are marked sent (``Agent.mark_sent``) only if their receipts have not all
come before the device's next send or the end of the run; when they have, the agent settles
them in one state write, as a device whose receipts come before it writes the send would.
Either way a report stays in the outbox, its ε charged when it was staged, until settled.

**A registry change** (:class:`RegistryChange`): at a given slot, every second device restarts
its agent with a second registry, as a device that takes an update does; its state carries
over (``agent.core``), and its reports name the definitions they were made with.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from agent.accounting import EPSILON_SLACK
from agent.aes_gcm import package_aes_gcm
from agent.config import ScheduleConfig
from agent.core import Agent
from agent.daemon import Daemon
from agent.errors import TransportError, UseCaseStoppedError, ValueRefusedError
from agent.identity import device_identity
from agent.outbox import Pending
from agent.schedule import next_cycle_after
from agent.sealed import Sealer
from agent.transport import PublishRefusedError, Transport
from fleet.brokers import BrokerPools
from fleet.clock import FakeClock
from fleet.plan import SLOT_SECONDS, FleetPlan, RegistryChange, build_generators, device_seed
from fleet.pool import MAX_PUBLISH_ATTEMPTS, ConnectionPool, DeviceTransport, Pool
from fleet.tally import MAX_PROBLEMS, Progress, ShardResult, Tally, tally_kind
from fleet.values import ValueGenerator
from protocol.catalog import Catalog
from protocol.randomness import SeededRandom
from protocol.receipts import Receipt
from protocol.registry import Registry, UseCase

__all__ = ["MemorySealer", "run_shard"]

log = logging.getLogger("ldp_fleet")


class MemorySealer(Sealer):
    """A :class:`Sealer` that keeps the sealed blobs in memory instead of files.

    Documents are still sealed with AES-256-GCM under the device's key and opened (and
    authenticated) on every read, exactly as on disk; only the atomic file write and its
    fsyncs are skipped, which would otherwise dominate a simulation of thousands of devices.
    """

    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        # The cryptography package's GCM: the agent's bytes at a fraction of ctypes' cost per call.
        self._aead = package_aes_gcm(key)
        self._blobs: dict[Path, bytes] = {}

    def read(self, path: Path, purpose: str, version: int) -> Any | None:
        blob = self._blobs.get(path)
        return None if blob is None else self.open(purpose, version, blob, where=str(path))

    def write(self, path: Path, purpose: str, version: int, document: Any, *, sync_directory: bool = True) -> None:
        del sync_directory  # nothing to make durable in memory
        self._blobs[path] = self.seal(purpose, version, document)

    def sync(self, directory: Path) -> None:
        """Nothing to make durable: the simulated device's files live in memory."""
        del directory


# --------------------------------------------------------------------------- plan and tallies


class _Device:
    def __init__(
        self, number: int, *, plan: FleetPlan, registry: Registry, clock: FakeClock, root: Path, shard: _Shard
    ) -> None:
        self.number = number
        rng = SeededRandom(device_seed(plan.seed, plan.start, number))
        key = rng.words(4).astype("<u8").tobytes()
        self._state_dir = root / f"device-{number:07d}"
        self._sealer = Sealer(key) if plan.state_dir is not None else MemorySealer(key)
        self._clock = clock
        self._plan = plan
        self.rng = rng
        self._shard = shard
        # What picks its broker among several (fleet.brokers): its sub-identity, or its number.
        self.name = shard.identity(number) or f"device-{number}"
        self.agent = self._agent(registry)
        self.agent.grant_consent()
        # (use case, period) -> the value recorded, until the report carrying it is counted.
        self.recorded: dict[tuple[str, int], object] = {}
        # Reports of the last send not yet marked sent, and receipts not yet settled (_Shard.send).
        self.unmarked: list[Pending] = []
        self.answers: list[Receipt] = []
        self.sending = False

    def _agent(self, registry: Registry) -> Agent:
        agent = Agent(
            registry=registry,
            state_dir=self._state_dir,
            sealer=self._sealer,
            clock=self._clock,
            rng=self.rng,
            device_identity=self._shard.identity(self.number),
        )
        transport = DeviceTransport(self._shard.pool, self._acked, device=self.name)
        self.daemon = Daemon(
            agent,
            transport,
            clock=self._clock,
            rng=self.rng,
            schedule=ScheduleConfig(jitter_seconds=self._plan.jitter_seconds),
        )
        return agent

    def move(self, registry: Registry) -> None:
        """Restart the agent with another registry, on the same state, as an updated device does."""
        self.agent = self._agent(registry)

    def _acked(self, payload: bytes) -> None:
        self._shard.acknowledged(self, payload)


class _Shard:
    def __init__(self, plan: FleetPlan, pool: Pool | None = None) -> None:
        self.plan = plan
        self.catalog = plan.catalog()
        self.pool: Pool = pool  # type: ignore[assignment]  # set by run_shard before any device exists
        self.result = ShardResult()
        # Reports sent and waiting for their receipt: report id -> (device, payload).
        self.waiting: dict[bytes, tuple[_Device, bytes]] = {}
        self._identity = None if plan.broker is None else device_identity(plan.broker, source="ldp-fleet")

    def identity(self, number: int) -> str | None:
        """The sub-identity device ``number`` publishes under (None for an anonymous broker)."""
        return None if self._identity is None else f"{self._identity}/{number:07d}"

    def _report(self, payload: bytes) -> tuple[UseCase, int, int]:
        """The definition, period and record count of one of the fleet's own reports."""
        body = msgpack.unpackb(payload, raw=False)
        use_case = self.catalog.by_definition(bytes(body["h"]))
        assert use_case is not None, "a simulated device reported under a definition the fleet does not know"
        return use_case, int(body["p"]), len(body["r"])

    def acknowledged(self, device: _Device, payload: bytes) -> None:
        """The broker acknowledged a report (without receipts, this is where its value counts)."""
        res = self.result
        res.messages += 1
        use_case, period, records = self._report(payload)
        pub = res.published.setdefault(use_case.ref, {}).setdefault(period, [0, 0])
        pub[0] += 1
        pub[1] += records
        if not self.plan.receipts:
            self._tally(device, use_case, period)

    def _tally(self, device: _Device, use_case: UseCase, period: int) -> None:
        value = device.recorded.pop((use_case.name, period), None)
        if value is not None and use_case.name in self.plan.use_cases:
            tally = self.result.truth.setdefault(use_case.ref, {}).setdefault(period, Tally())
            tally.add(tally_kind(use_case), value, use_case)

    def receipts(self, receipts: list[Receipt]) -> None:
        """Commit receipts arrived on a pooled connection: each goes to the device whose report it answers."""
        by_device: dict[int, tuple[_Device, list[Receipt]]] = {}
        for receipt in receipts:
            found = self.waiting.pop(receipt.correlation, None)
            if found is None:
                continue  # a second answer, to a report sent again
            device, payload = found
            use_case, period, _ = self._report(payload)
            status = "counted" if receipt.counted else f"refused: {receipt.reason or 'unknown'}"
            said = self.result.outcomes.setdefault(use_case.ref, {})
            said[status] = said.get(status, 0) + 1
            if receipt.counted:
                periods = self.result.counted_periods.setdefault(use_case.ref, {})
                periods[period] = periods.get(period, 0) + 1
                self._tally(device, use_case, period)
            else:
                device.recorded.pop((use_case.name, period), None)
            by_device.setdefault(device.number, (device, []))[1].append(receipt)
        for device, mine in by_device.values():
            device.answers.extend(mine)
            self._settle_if_answered(device)

    def _settle_if_answered(self, device: _Device) -> None:
        """Once every report of the device's last send is answered, the agent settles them as a
        device does (the ledger says so, the reports leave the outbox); marking them sent first
        would only have been overwritten."""
        if device.sending:
            return  # the reports of this send are known when it ends
        answered = {r.correlation for r in device.answers}
        if all(p.entry.report_id in answered for p in device.unmarked):
            device.unmarked = []
            self._settle(device)

    @staticmethod
    def _settle(device: _Device) -> None:
        answers, device.answers = device.answers, []
        if answers:
            device.agent.settle(answers)

    def flush(self, device: _Device) -> None:
        """Mark sent the device's reports still waiting for their receipt, then settle the
        receipts that came: the ledger and the outbox as if each had happened at once."""
        if device.unmarked:
            waiting = {p.entry.report_id for p in device.agent.outbox()}
            unmarked, device.unmarked = device.unmarked, []
            device.agent.mark_sent([p for p in unmarked if p.entry.report_id in waiting])
        self._settle(device)

    async def send(self, device: _Device) -> None:
        """Publish the device's reports not sent yet, each asking for a receipt.

        Raises:
            TransportError: a publish was not acknowledged (what was sent before is recorded).
        """
        self.flush(device)
        due = [p for p in device.agent.outbox() if p.entry.attempts == 0]
        sent: list[Pending] = []
        refused: list[tuple[Pending, str]] = []
        device.sending = True
        try:
            for p in due:
                self.waiting[p.entry.report_id] = (device, p.entry.payload)
                try:
                    await self.pool.publish(p.topic, p.entry.payload, correlation=p.entry.report_id, device=device.name)
                except PublishRefusedError as e:
                    # The broker dropped this report (its ACL denies the topic): no receipt will
                    # come, so it is settled here as not counted, and the next report goes on.
                    self.waiting.pop(p.entry.report_id, None)
                    refused.append((p, e.reason))
                    self.refused_by_broker(device, p.entry.payload, e.reason)
                    continue
                sent.append(p)
                self.acknowledged(device, p.entry.payload)
        finally:
            done = {p.entry.report_id for p in sent} | {p.entry.report_id for p, _ in refused}
            for p in due:
                if p.entry.report_id not in done:
                    self.waiting.pop(p.entry.report_id, None)
            # Marked sent when the next send of the device or the end of the run comes first,
            # else settled at once when their receipts come (one state write instead of two;
            # the ε was charged when the reports were staged, and they stay in the outbox).
            device.unmarked = sent
            device.sending = False
            if refused:
                self.flush(device)  # the ledger lists this send's reports in the order they went
                device.agent.mark_refused(refused)
            self._settle_if_answered(device)

    def refused_by_broker(self, device: _Device, payload: bytes, reason: str) -> None:
        """The broker refused a report: one of the fleet's own reports that will not be counted."""
        use_case, period, _ = self._report(payload)
        status = f"refused by the broker: {reason}"
        said = self.result.outcomes.setdefault(use_case.ref, {})
        said[status] = said.get(status, 0) + 1
        device.recorded.pop((use_case.name, period), None)

    async def resend_waiting(self) -> int:
        """Send again, byte for byte, every report still without its receipt; how many."""
        items = list(self.waiting.items())
        for report_id, (device, payload) in items:
            if report_id not in self.waiting:
                continue  # answered meanwhile
            use_case, _, _ = self._report(payload)
            await self.pool.publish(
                device.agent.topic(use_case.name), payload, correlation=report_id, device=device.name
            )
        self.result.retries += len(items)
        return len(items)


async def _drain(device: _Device, shard: _Shard) -> None:
    for attempt in range(MAX_PUBLISH_ATTEMPTS):
        try:
            if shard.plan.receipts:
                await shard.send(device)
            else:
                await device.daemon.publisher.drain_once()
            return
        except TransportError as e:
            shard.result.retries += 1
            log.warning("device %d: publishing failed (%s); reconnecting", device.number, e)
            with contextlib.suppress(TransportError):
                await shard.pool.repair(attempt=attempt)
    raise TransportError(f"device {device.number}: reports not acknowledged after {MAX_PUBLISH_ATTEMPTS} attempts")


async def _await_receipts(shard: _Shard) -> None:
    """Wait until every report has its receipt (sending again what has none after the timeout), or give up."""
    plan = shard.plan
    deadline = time.monotonic() + plan.receipt_wait
    sent_at = time.monotonic()
    attempt = 0
    while shard.waiting and time.monotonic() < deadline:
        if time.monotonic() - sent_at >= plan.receipt_timeout:
            log.warning(
                "%d reports have had no commit receipt for %g s; sending them again",
                len(shard.waiting),
                plan.receipt_timeout,
            )
            try:
                await shard.resend_waiting()
            except TransportError as e:
                log.warning("sending again failed (%s); reconnecting", e)
                with contextlib.suppress(TransportError):
                    await shard.pool.repair(attempt=attempt)
                attempt += 1
            sent_at = time.monotonic()
        await asyncio.sleep(0.05)
    shard.result.missing = len(shard.waiting)


async def run_shard(
    plan: FleetPlan,
    devices: range,
    *,
    worker: int = 0,
    transport: Transport | None = None,
    progress: Callable[[Progress], None] | None = None,
    root: Path | None = None,
) -> ShardResult:
    """Simulate ``devices`` (device numbers) over the plan's days and publish their reports.

    Args:
        plan: the simulation.
        devices: the device numbers this worker runs.
        worker: this worker's number (for progress).
        transport: how to reach the broker (default: the agent's MQTT transport to ``plan.broker``).
        progress: called with a snapshot a few times per second and after every slot.
        root: the state directory root (default: ``plan.state_dir`` or a throw-away name;
            with in-memory state nothing is written there but empty directories).

    Raises:
        TransportError: the broker could not be reached or stopped acknowledging.
        fleet.values.GeneratorError: a generator does not fit its use case.
    """
    registry = plan.registry()
    generators = build_generators(plan)
    transports = [transport] if transport is not None else _broker_transports(plan, worker)
    started = time.monotonic()
    cpu_started = time.process_time()
    shard = _Shard(plan)
    async with contextlib.AsyncExitStack() as stack:
        if root is None and plan.state_dir is None:
            # In-memory state still needs a directory per agent (it only stays empty).
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ldp-fleet-")))
        base = Path(root or plan.state_dir or ".")
        shard.pool = await stack.enter_async_context(_pool(plan, transports, shard))
        clock = FakeClock(float(plan.start))
        fleet = [_Device(d, plan=plan, registry=registry, clock=clock, root=base, shard=shard) for d in devices]
        shard.result.devices = len(fleet)
        shard.result.setup_seconds = time.monotonic() - started
        shard.result.setup_cpu_seconds = time.process_time() - cpu_started
        await _simulate(shard, generators=generators, fleet=fleet, clock=clock, worker=worker, progress=progress)
        if plan.receipts:
            await _await_receipts(shard)
            for device in fleet:
                shard.flush(device)
    caps = _caps(shard.catalog)
    for device in fleet:
        checked, problems = _audit_epsilon(device, caps)
        shard.result.epsilon_checked += checked
        shard.result.epsilon_problems += problems[: MAX_PROBLEMS - len(shard.result.epsilon_problems)]
    # What is still recorded but not counted was held back by a limit (or its report refused):
    # not part of the truth.
    for device in fleet:
        for use_case, _period in device.recorded:
            shard.result.unsent[use_case] = shard.result.unsent.get(use_case, 0) + 1
    shard.result.run_seconds = time.monotonic() - started
    return shard.result


def _broker_transports(plan: FleetPlan, worker: int) -> list[Transport]:
    """The agent's MQTT transport to each broker of the plan (the devices spread over them)."""
    from agent.mqtt import MqttTransport  # noqa: PLC0415 - only when publishing to a real broker

    if plan.broker is None:
        raise ValueError("the plan names no broker and no transport was given")
    broker = dataclasses.replace(plan.broker, receipts=plan.receipts)
    rng = SeededRandom(device_seed(plan.seed, plan.start, -1 - worker))
    return [MqttTransport(broker, rng, address=a) for a in broker.endpoints]


def _pool(plan: FleetPlan, transports: Sequence[Transport], shard: _Shard) -> ConnectionPool | BrokerPools:
    """One pool of connections per transport; several behind one :class:`BrokerPools`."""
    pools = [
        ConnectionPool(
            t,
            size=plan.connections,
            window=plan.window,
            on_receipts=shard.receipts if plan.receipts else None,
        )
        for t in transports
    ]
    if len(pools) == 1:
        return pools[0]
    assert plan.broker is not None
    return BrokerPools(pools, plan.broker.endpoints)


def _caps(catalog: Catalog) -> dict[str, float]:
    """The largest lifetime ε cap any definition of each use case allows."""
    caps: dict[str, float] = {}
    for uc in catalog.use_cases.values():
        caps[uc.name] = max(caps.get(uc.name, 0.0), uc.lifetime_epsilon)
    return caps


def _audit_epsilon(device: _Device, caps: dict[str, float]) -> tuple[int, list[str]]:
    """Check the privacy invariant on one device: per use case, the ε spent its ledger records
    never goes down and never passes the lifetime cap, and its status shows no less than the
    ledger (whatever registry changes it went through)."""
    agent = device.agent
    spent: dict[str, list[float]] = {}
    for entry in agent.ledger():
        spent.setdefault(entry.use_case, []).append(entry.epsilon_total)
    shown = {r.use_case: r.epsilon_total for r in agent.use_case_status()}
    problems = []
    for name, totals in spent.items():
        where = f"device {device.number}, use case {name}"
        if any(later + EPSILON_SLACK < earlier for earlier, later in itertools.pairwise(totals)):
            problems.append(f"{where}: the ε spent its ledger records goes down ({totals})")
        if max(totals) > caps.get(name, 0.0) + EPSILON_SLACK:
            problems.append(f"{where}: ε spent {max(totals):g} passes the lifetime cap {caps.get(name, 0.0):g}")
        now = shown.get(name)
        if isinstance(now, float) and now + EPSILON_SLACK < totals[-1]:
            problems.append(f"{where}: the status shows ε spent {now:g}, less than its ledger's {totals[-1]:g}")
    return len(spent), problems


def _record(shard: _Shard, device: _Device, values: Sequence[tuple[str, object | None, int]]) -> None:
    """Give the device's agent its values of the period (name, value, period; a value of None:
    the device has none), in one state write as a device's batch; count refusals."""
    agent = device.agent
    given = [(name, value, period) for name, value, period in values if value is not None]
    given = [item for item in given if item[0] in agent.registry.use_cases]
    if not given:
        return
    results = agent.record_each([(name, value, None) for name, value, _ in given])
    for (name, value, period), result in zip(given, results, strict=True):
        if isinstance(result, ValueRefusedError | UseCaseStoppedError):
            shard.result.refused[name] = shard.result.refused.get(name, 0) + 1
        elif result.outcome == "recorded":
            device.recorded[(name, period)] = value


def _move(fleet: Sequence[_Device], change: RegistryChange, registry: Registry, clock: FakeClock, at: int) -> None:
    """Half the fleet takes the second registry at the slot's boundary (each device restarts its agent)."""
    clock.set(float(at))
    for device in fleet:
        if change.moves(device.number):
            device.move(registry)


async def _simulate(
    shard: _Shard,
    *,
    generators: dict[str, ValueGenerator],
    fleet: Sequence[_Device],
    clock: FakeClock,
    worker: int,
    progress: Callable[[Progress], None] | None,
) -> None:
    plan = shard.plan
    use_cases = [plan.use_case(name) for name in plan.use_cases]
    first = {uc.name: uc.period.index_at(plan.start) for uc in use_cases}
    slots_per_period = {uc.name: uc.period.seconds // SLOT_SECONDS for uc in use_cases}
    queue: asyncio.Queue[_Device] = asyncio.Queue(maxsize=4 * plan.connections * plan.window)
    last_report = time.monotonic()
    moved = plan.change.registry() if plan.change is not None else None

    async def publisher() -> None:
        while True:
            device = await queue.get()
            try:
                await _drain(device, shard)
            finally:
                queue.task_done()

    async with asyncio.TaskGroup() as tg:
        workers = [tg.create_task(publisher(), name=f"publish-{i}") for i in range(plan.connections * plan.window)]
        for slot in range(plan.slots + 1):
            boundary = plan.start + slot * SLOT_SECONDS
            recording = slot < plan.slots
            if moved is not None and plan.change is not None and slot == plan.change.at_slot:
                _move(fleet, plan.change, moved, clock, boundary)
            # Values of the periods that start in this slot, for every device at once.
            values: dict[str, list[object | None]] = {}
            if recording:
                for uc in use_cases:
                    if slot % slots_per_period[uc.name] == 0:
                        values[uc.name] = generators[uc.name].values(slot // slots_per_period[uc.name])
            due = np.array(
                [
                    next_cycle_after(
                        boundary - 1,
                        interval_hours=SLOT_SECONDS // 3600,
                        jitter_seconds=plan.jitter_seconds,
                        rng=d.rng,
                    )
                    for d in fleet
                ]
            )
            for done, i in enumerate(np.argsort(due, kind="stable")):
                device = fleet[int(i)]
                clock.set(float(due[i]))
                _record(
                    shard,
                    device,
                    [
                        (name, column[device.number], first[name] + slot // slots_per_period[name])
                        for name, column in values.items()
                    ],
                )
                device.daemon.run_cycle()
                await queue.put(device)
                if done % 16 == 0:
                    await asyncio.sleep(0)  # let the publishers run between devices
                if progress is not None and time.monotonic() - last_report > 0.25:
                    last_report = time.monotonic()
                    progress(Progress(worker, slot, done + 1, shard.result.messages))
            # A device's next cycle starts only after its reports from this one are acknowledged.
            await queue.join()
            if progress is not None:
                progress(Progress(worker, slot + 1, 0, shard.result.messages))
        for task in workers:
            task.cancel()
