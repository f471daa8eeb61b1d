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

**A registry change** (:class:`RegistryChange`): at a given slot, every second device restarts
its agent with a second registry, as a device that takes an update does; its state carries
over (``agent.core``), and its reports name the definitions they were made with.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import logging
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from agent.accounting import EPSILON_SLACK
from agent.config import BrokerConfig, ScheduleConfig
from agent.core import Agent
from agent.daemon import Daemon
from agent.errors import TransportError, UseCaseStoppedError, ValueRefusedError
from agent.identity import device_identity
from agent.schedule import next_cycle_after
from agent.sealed import Sealer
from agent.transport import Connection, ReceiptConnection, ReceiptTransport, Transport
from fleet.clock import FakeClock
from fleet.values import GeneratorSpec, Population, ValueGenerator, build_generator, load_population
from protocol.catalog import Catalog
from protocol.interfaces import EstimateKind, as_histogram
from protocol.randomness import SeededRandom
from protocol.receipts import Receipt
from protocol.registry import Registry, UseCase, parse_registry
from runtime.backoff import Backoff

__all__ = [
    "SLOT_SECONDS",
    "ConnectionPool",
    "FleetPlan",
    "MemorySealer",
    "Progress",
    "RegistryChange",
    "ShardResult",
    "Tally",
    "build_generators",
    "device_seed",
    "run_shard",
    "tally_kind",
]

_REPAIR_BACKOFF = Backoff(initial=0.05, cap=2.0)
"""Waits before reopening broken pooled connections (doubling from 50 ms to 2 s)."""

log = logging.getLogger("ldp_fleet")

SLOT_SECONDS = 21_600
"""One collection slot: the agent's cycles run every 6 hours (000 §6)."""

MAX_PROBLEMS = 20
"""Findings of the ε audit kept per run (the count of pairs checked is kept in full)."""

MAX_PUBLISH_ATTEMPTS = 8
"""A device's reports are retried this many times across reconnects before the run fails."""


def device_seed(seed: int, start: int, device: int) -> int:
    """The seed of device ``device``'s random source (independent of the worker split).

    The simulated start time is part of it: report ids come from this source, and the
    collector drops a report whose id it has seen, so two runs over different days must not
    draw the same ids (the same run repeated is, correctly, a redelivery).
    """
    digest = hashlib.blake2b(f"{seed}/{start}/{device}".encode(), digest_size=16, person=b"ldp-fleet-dev").digest()
    return int.from_bytes(digest, "little")


class MemorySealer(Sealer):
    """A :class:`Sealer` that keeps the sealed blobs in memory instead of files.

    Documents are still sealed with AES-256-GCM under the device's key and opened (and
    authenticated) on every read, exactly as on disk; only the atomic file write and its
    fsyncs are skipped, which would otherwise dominate a simulation of thousands of devices.
    """

    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        self._blobs: dict[Path, bytes] = {}

    def read(self, path: Path, purpose: str, version: int) -> Any | None:
        blob = self._blobs.get(path)
        return None if blob is None else self.open(purpose, version, blob, where=str(path))

    def write(self, path: Path, purpose: str, version: int, document: Any) -> None:
        self._blobs[path] = self.seal(purpose, version, document)


# --------------------------------------------------------------------------- plan and tallies


@dataclass(frozen=True, kw_only=True)
class RegistryChange:
    """Every second device (the odd numbers) moves to a second registry at a slot, as a device
    that takes an update restarts its agent with the new file (``ldp-fleet --registry-change``).

    Attributes:
        registry_text: the second registry file's bytes.
        registry_path: where it was read from.
        at_slot: the slot (6-hour step from the start) at whose beginning the devices move,
            before they record that slot's values.
    """

    registry_text: bytes
    registry_path: str
    at_slot: int

    @staticmethod
    def moves(device: int) -> bool:
        """Whether device ``device`` moves (half the fleet, spread over every worker)."""
        return device % 2 == 1

    def registry(self) -> Registry:
        """The parsed second registry."""
        return parse_registry(self.registry_text, source=self.registry_path)


@dataclass(frozen=True, kw_only=True)
class FleetPlan:
    """Everything a worker needs to simulate its devices (picklable, for worker processes).

    Attributes:
        registry_text: the registry file's bytes (parsed again in each worker).
        registry_path: where it was read from (dictionaries resolve against its directory).
        use_cases: the simulated use cases (of either registry, with a change).
        generators: generator specification per use case.
        populations: population file per use case, where one is used.
        devices: how many devices the whole fleet has.
        days: simulated days.
        start: simulated start time (a UTC midnight).
        seed: the simulation seed.
        broker: where to publish (None: the transport factory given to :func:`run_shard`).
        connections: MQTT connections per worker.
        window: publishes in flight per connection.
        jitter_seconds: the agents' cycle jitter.
        state_dir: where sealed state goes (None: in memory).
        change: half the fleet moves to a second registry mid-run (None: no change).
        receipts: wait for the collector's commit receipts (the transport must offer them);
            False: a report is done at the broker's acknowledgement.
        receipt_timeout: real seconds after which a report without its receipt is sent again.
        receipt_wait: real seconds the run waits, after the last slot, for the last receipts.
    """

    registry_text: bytes
    registry_path: str
    use_cases: tuple[str, ...]
    generators: dict[str, GeneratorSpec]
    populations: dict[str, str] = field(default_factory=dict)
    devices: int
    days: int
    start: int
    seed: int
    broker: BrokerConfig | None = None
    connections: int = 4
    window: int = 8
    jitter_seconds: float = 1800.0
    state_dir: str | None = None
    change: RegistryChange | None = None
    receipts: bool = False
    receipt_timeout: float = 30.0
    receipt_wait: float = 300.0

    @property
    def slots(self) -> int:
        """Collection slots with recording (the closing cycle after them comes on top)."""
        return self.days * (86_400 // SLOT_SECONDS)

    def registry(self) -> Registry:
        """The parsed registry."""
        return parse_registry(self.registry_text, source=self.registry_path)

    def catalog(self) -> Catalog:
        """Every definition a simulated device can report under (the second registry's first)."""
        first = self.registry()
        if self.change is None:
            return Catalog.build(first)
        return Catalog.build(self.change.registry(), [first])

    def use_case(self, name: str) -> UseCase:
        """The use case ``name`` as the simulation's values are drawn for it: the first registry's
        definition, or the second's for a use case only it has."""
        first = self.registry()
        if name in first.use_cases:
            return first[name]
        assert self.change is not None, name
        return self.change.registry()[name]


def tally_kind(use_case: UseCase) -> str:
    """How a use case's truth is tallied: ``mean``, ``histogram`` or ``frequencies`` (by the mechanism's kind)."""
    kind = use_case.mechanism.kind
    if kind.scalar:
        return "mean"
    if kind is EstimateKind.HISTOGRAM:
        return "histogram"
    return "frequencies"


@dataclass
class Tally:
    """The truth of one (use case, period): what the reporting devices' values were.

    Attributes:
        n: values reported.
        total: their sum (means and proportions).
        buckets: values per bucket (histograms).
        counts: reports per distinct value (frequencies).
    """

    n: int = 0
    total: float = 0.0
    buckets: list[int] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, value: object, use_case: UseCase) -> None:
        """Count one reported value."""
        self.n += 1
        if kind == "mean":
            self.total += float(value)  # type: ignore[arg-type]
        elif kind == "histogram":
            histogram = as_histogram(use_case.mechanism)
            if not self.buckets:
                self.buckets = [0] * (len(histogram.bucket_edges) - 1)
            if not isinstance(value, int | float):
                raise TypeError(f"{use_case.name}: a histogram value is a number; got {value!r}")
            self.buckets[histogram.bucket_of(value)] += 1
        else:
            key = str(value)
            self.counts[key] = self.counts.get(key, 0) + 1

    def merge(self, other: Tally) -> Tally:
        """The tally of both (exact integer sums; float sums for means)."""
        if self.buckets and other.buckets:
            buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]
        else:
            buckets = list(self.buckets or other.buckets)
        counts = dict(self.counts)
        for k, v in other.counts.items():
            counts[k] = counts.get(k, 0) + v
        return Tally(n=self.n + other.n, total=self.total + other.total, buckets=buckets, counts=counts)


@dataclass
class ShardResult:
    """What one worker's devices did.

    Attributes:
        devices: how many devices it ran.
        truth: definition ref (``name@hex``) -> period -> the tally of the values its counted
            (with receipts) or acknowledged (without) reports carried.
        published: definition ref -> period -> [reports, records] acknowledged by the broker.
        unsent: use case -> values recorded but never reported (daily limit, ε cap, outbox drops).
        refused: use case -> values the agent refused (stopped use case, bad value).
        messages: reports acknowledged by the broker (resends not counted).
        retries: device publish attempts repeated after a connection failure, and reports sent
            again for want of a receipt.
        setup_seconds: time to create the agents.
        run_seconds: time to simulate and publish.
        outcomes: definition ref -> what the receipts said -> how many reports (``counted``,
            ``refused: <reason>``); empty without receipts.
        missing: reports still without a receipt when the run ended.
        counted_periods: definition ref -> period -> reports a receipt said were counted.
        epsilon_checked: (device, use case) pairs whose ε spent was audited at the end.
        epsilon_problems: what the audit found (ε spent that went down, or past a lifetime
            cap, in a device's ledger or status); at most :data:`MAX_PROBLEMS` kept.
    """

    devices: int = 0
    truth: dict[str, dict[int, Tally]] = field(default_factory=dict)
    published: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    unsent: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    retries: int = 0
    setup_seconds: float = 0.0
    run_seconds: float = 0.0
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    missing: int = 0
    counted_periods: dict[str, dict[int, int]] = field(default_factory=dict)
    epsilon_checked: int = 0
    epsilon_problems: list[str] = field(default_factory=list)

    @property
    def counted(self) -> int:
        """Reports a receipt said were counted."""
        return sum(o.get("counted", 0) for o in self.outcomes.values())

    def merge(self, other: ShardResult) -> ShardResult:
        """Both workers' results together."""
        out = ShardResult(
            devices=self.devices + other.devices,
            messages=self.messages + other.messages,
            retries=self.retries + other.retries,
            setup_seconds=max(self.setup_seconds, other.setup_seconds),
            run_seconds=max(self.run_seconds, other.run_seconds),
            missing=self.missing + other.missing,
            epsilon_checked=self.epsilon_checked + other.epsilon_checked,
            epsilon_problems=(self.epsilon_problems + other.epsilon_problems)[:MAX_PROBLEMS],
        )
        for src in (self, other):
            for uc, periods in src.truth.items():
                dst = out.truth.setdefault(uc, {})
                for p, t in periods.items():
                    dst[p] = dst[p].merge(t) if p in dst else Tally().merge(t)
            for uc, pub in src.published.items():
                dst_pub = out.published.setdefault(uc, {})
                for p, (reports, records) in pub.items():
                    r0, n0 = dst_pub.get(p, [0, 0])
                    dst_pub[p] = [r0 + reports, n0 + records]
            for uc, n in src.unsent.items():
                out.unsent[uc] = out.unsent.get(uc, 0) + n
            for uc, n in src.refused.items():
                out.refused[uc] = out.refused.get(uc, 0) + n
            for ref, said in src.outcomes.items():
                mine = out.outcomes.setdefault(ref, {})
                for status, n in said.items():
                    mine[status] = mine.get(status, 0) + n
            for ref, counted in src.counted_periods.items():
                into = out.counted_periods.setdefault(ref, {})
                for period, n in counted.items():
                    into[period] = into.get(period, 0) + n
        return out


@dataclass(frozen=True, slots=True)
class Progress:
    """A progress snapshot of one worker.

    Attributes:
        worker: the worker's number.
        slot: slots completed (of ``plan.slots + 1``, the closing cycle included).
        devices_done: devices through their cycle in the current slot.
        messages: reports acknowledged so far.
    """

    worker: int
    slot: int
    devices_done: int
    messages: int


def build_generators(plan: FleetPlan) -> dict[str, ValueGenerator]:
    """The value generator of every simulated use case (drawn for :meth:`FleetPlan.use_case`).

    Raises:
        fleet.values.GeneratorError: for a generator that does not fit its use case.
    """
    base = Path(plan.registry_path).resolve().parent
    populations: dict[str, Population] = {}
    out = {}
    for name in plan.use_cases:
        path = plan.populations.get(name)
        if path is not None and path not in populations:
            populations[path] = load_population(Path(path))
        out[name] = build_generator(
            plan.use_case(name),
            plan.generators[name],
            devices=plan.devices,
            seed=plan.seed,
            registry_dir=base,
            population=populations.get(path) if path is not None else None,
        )
    return out


# --------------------------------------------------------------------------- connections


@dataclass
class _Pooled:
    number: int
    stack: contextlib.AsyncExitStack | None = None
    connection: Connection | None = None
    receipts: ReceiptConnection | None = None
    listener: asyncio.Task[None] | None = None
    in_flight: int = 0


class ConnectionPool:
    """A few long-lived broker connections shared by every device of a worker.

    Each is opened through an ordinary :class:`agent.transport.Transport` (the agent's MQTT
    adapter with its TLS and authentication), so what reaches the broker is what a device
    sends; a device borrows a connection for one publish at a time. A connection that fails
    is closed and reopened with a capped backoff by the next device that needs it.

    With ``on_receipts``, each connection is opened with a response topic of its own
    (:meth:`agent.transport.ReceiptTransport.connect_receipts`), every publish asks for a
    commit receipt, and a listener per connection (owned by the pool's task group) hands the
    receipts that arrive to ``on_receipts``.

    Args:
        transport: opens connections.
        size: number of connections.
        window: publishes in flight per connection (below aiomqtt's warning threshold of 10).
        on_receipts: called with each receipt message's receipts (None: no receipts asked).
    """

    def __init__(
        self,
        transport: Transport,
        *,
        size: int,
        window: int,
        on_receipts: Callable[[list[Receipt]], None] | None = None,
    ) -> None:
        if on_receipts is not None and not isinstance(transport, ReceiptTransport):
            raise TypeError(f"{type(transport).__name__} cannot receive commit receipts")
        self._transport = transport
        self._slots = [_Pooled(i) for i in range(size)]
        self._free = asyncio.Semaphore(size * window)
        self._window = window
        self._lock = asyncio.Lock()
        self._on_receipts = on_receipts
        self._stack = contextlib.AsyncExitStack()
        self._tasks: asyncio.TaskGroup | None = None
        self.reconnects = 0

    async def __aenter__(self) -> ConnectionPool:
        self._tasks = await self._stack.enter_async_context(asyncio.TaskGroup())
        try:
            for slot in self._slots:
                await self._open(slot)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for slot in self._slots:
            await self._close(slot)
        await self._stack.aclose()

    async def _open(self, slot: _Pooled) -> None:
        stack = contextlib.AsyncExitStack()
        try:
            if self._on_receipts is not None:
                transport: ReceiptTransport = self._transport  # type: ignore[assignment]  # checked in __init__
                conn = await stack.enter_async_context(transport.connect_receipts())
                slot.receipts = conn
                assert self._tasks is not None
                slot.listener = self._tasks.create_task(self._listen(slot, conn), name=f"receipts-{slot.number}")
            else:
                slot.connection = await stack.enter_async_context(self._transport.connect())
        except BaseException:
            await stack.aclose()
            raise
        slot.stack = stack

    async def _listen(self, slot: _Pooled, conn: ReceiptConnection) -> None:
        """Hand over the connection's receipts until it ends (then it is repaired on demand)."""
        assert self._on_receipts is not None
        try:
            while True:
                self._on_receipts(await conn.receipts())
        except TransportError:
            if slot.receipts is conn:
                slot.receipts = None

    async def _close(self, slot: _Pooled) -> None:
        listener, slot.listener = slot.listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        stack, slot.stack, slot.connection, slot.receipts = slot.stack, None, None, None
        if stack is not None:
            # A connection that already broke may fail again while closing: it is gone either way.
            with contextlib.suppress(TransportError):
                await stack.aclose()

    def _live(self, slot: _Pooled) -> bool:
        return (slot.receipts if self._on_receipts is not None else slot.connection) is not None

    async def repair(self, *, attempt: int) -> None:
        """Reopen every broken connection (after a delay that grows with ``attempt``).

        Raises:
            TransportError: if the broker still cannot be reached.
        """
        await asyncio.sleep(_REPAIR_BACKOFF.ceiling(attempt))  # no jitter: the simulator replays exactly
        async with self._lock:
            for slot in self._slots:
                if not self._live(slot):
                    await self._close(slot)
                    await self._open(slot)
                    self.reconnects += 1

    async def publish(self, topic: str, payload: bytes, *, correlation: bytes | None = None) -> None:
        """Publish on the least busy live connection; return after the broker's acknowledgement.

        With receipts, ``correlation`` (the report id) comes back in the commit receipt.

        Raises:
            TransportError: if it was not acknowledged (the connection is marked broken).
        """
        async with self._free:
            live = [s for s in self._slots if self._live(s) and s.in_flight < self._window]
            if not live:
                raise TransportError("no live broker connection in the pool")
            slot = min(live, key=lambda s: s.in_flight)
            slot.in_flight += 1
            try:
                if slot.receipts is not None:
                    await slot.receipts.publish(topic, payload, correlation=correlation or b"")
                else:
                    assert slot.connection is not None
                    await slot.connection.publish(topic, payload)
            except TransportError:
                slot.connection = slot.receipts = None
                raise
            finally:
                slot.in_flight -= 1


class _DeviceTransport:
    """One device's view of the pool: its publisher "connects" by borrowing pooled connections."""

    def __init__(self, pool: ConnectionPool, on_ack: Callable[[bytes], None]) -> None:
        self._pool = pool
        self._on_ack = on_ack

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Connection]:
        yield _DeviceConnection(self._pool, self._on_ack)


class _DeviceConnection:
    def __init__(self, pool: ConnectionPool, on_ack: Callable[[bytes], None]) -> None:
        self._pool = pool
        self._on_ack = on_ack

    async def publish(self, topic: str, payload: bytes) -> None:
        await self._pool.publish(topic, payload)
        self._on_ack(payload)


# --------------------------------------------------------------------------- the devices


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
        self.agent = self._agent(registry)
        self.agent.grant_consent()
        # (use case, period) -> the value recorded, until the report carrying it is counted.
        self.recorded: dict[tuple[str, int], object] = {}

    def _agent(self, registry: Registry) -> Agent:
        agent = Agent(
            registry=registry,
            state_dir=self._state_dir,
            sealer=self._sealer,
            clock=self._clock,
            rng=self.rng,
            device_identity=self._shard.identity(self.number),
        )
        transport = _DeviceTransport(self._shard.pool, self._acked)
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
    def __init__(self, plan: FleetPlan, pool: ConnectionPool | None = None) -> None:
        self.plan = plan
        self.catalog = plan.catalog()
        self.pool: ConnectionPool = pool  # type: ignore[assignment]  # set by run_shard before any device exists
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
            # The agent settles them as a device does: the ledger says so, the reports leave the outbox.
            device.agent.settle(mine)

    async def send(self, device: _Device) -> None:
        """Publish the device's reports not sent yet, each asking for a receipt.

        Raises:
            TransportError: a publish was not acknowledged (what was sent before is recorded).
        """
        due = [p for p in device.agent.outbox() if p.entry.attempts == 0]
        sent = []
        try:
            for p in due:
                self.waiting[p.entry.report_id] = (device, p.entry.payload)
                await self.pool.publish(p.topic, p.entry.payload, correlation=p.entry.report_id)
                sent.append(p)
                self.acknowledged(device, p.entry.payload)
        finally:
            for p in due[len(sent) :]:
                self.waiting.pop(p.entry.report_id, None)
            device.agent.mark_sent(sent)

    async def resend_waiting(self) -> int:
        """Send again, byte for byte, every report still without its receipt; how many."""
        items = list(self.waiting.items())
        for report_id, (device, payload) in items:
            if report_id not in self.waiting:
                continue  # answered meanwhile
            use_case, _, _ = self._report(payload)
            await self.pool.publish(device.agent.topic(use_case.name), payload, correlation=report_id)
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
    if transport is None:
        from agent.mqtt import MqttTransport  # noqa: PLC0415 - only when publishing to a real broker

        if plan.broker is None:
            raise ValueError("the plan names no broker and no transport was given")
        broker = dataclasses.replace(plan.broker, receipts=plan.receipts)
        transport = MqttTransport(broker, SeededRandom(device_seed(plan.seed, plan.start, -1 - worker)))
    started = time.monotonic()
    shard = _Shard(plan)
    async with contextlib.AsyncExitStack() as stack:
        if root is None and plan.state_dir is None:
            # In-memory state still needs a directory per agent (it only stays empty).
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ldp-fleet-")))
        base = Path(root or plan.state_dir or ".")
        pool = ConnectionPool(
            transport,
            size=plan.connections,
            window=plan.window,
            on_receipts=shard.receipts if plan.receipts else None,
        )
        shard.pool = await stack.enter_async_context(pool)
        clock = FakeClock(float(plan.start))
        fleet = [_Device(d, plan=plan, registry=registry, clock=clock, root=base, shard=shard) for d in devices]
        shard.result.devices = len(fleet)
        shard.result.setup_seconds = time.monotonic() - started
        await _simulate(shard, generators=generators, fleet=fleet, clock=clock, worker=worker, progress=progress)
        if plan.receipts:
            await _await_receipts(shard)
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


def _record(shard: _Shard, device: _Device, name: str, value: object | None, period: int) -> None:
    """Give the device's agent its value of the period (none: the device has no value); count refusals."""
    if value is None or name not in device.agent.registry.use_cases:
        return
    try:
        outcome = device.agent.record(name, value)
    except (ValueRefusedError, UseCaseStoppedError):
        shard.result.refused[name] = shard.result.refused.get(name, 0) + 1
        return
    if outcome.outcome == "recorded":
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
                for name, column in values.items():
                    _record(shard, device, name, column[device.number], first[name] + slot // slots_per_period[name])
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
