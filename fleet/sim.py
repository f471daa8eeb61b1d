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

The truth is kept exactly: a device's value for a (use case, period) is tallied when the
broker acknowledges the report that carries it, so values a device recorded but never sent
(daily limit, lifetime ε cap) are not part of the truth, and the truth of a frequency use
case is the counts of the values actually reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from agent.config import BrokerConfig, ScheduleConfig
from agent.core import Agent
from agent.daemon import Daemon
from agent.errors import TransportError, UseCaseStoppedError, ValueRefusedError
from agent.identity import device_identity
from agent.schedule import next_cycle_after
from agent.sealed import Sealer
from agent.transport import Connection, Transport
from fleet.clock import FakeClock
from fleet.values import GeneratorSpec, Population, ValueGenerator, build_generator, load_population
from protocol.interfaces import EstimateKind, as_histogram
from protocol.randomness import SeededRandom
from protocol.registry import Registry, UseCase, parse_registry
from runtime.backoff import Backoff

__all__ = [
    "SLOT_SECONDS",
    "ConnectionPool",
    "FleetPlan",
    "MemorySealer",
    "Progress",
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
class FleetPlan:
    """Everything a worker needs to simulate its devices (picklable, for worker processes).

    Attributes:
        registry_text: the registry file's bytes (parsed again in each worker).
        registry_path: where it was read from (dictionaries resolve against its directory).
        use_cases: the simulated use cases.
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

    @property
    def slots(self) -> int:
        """Collection slots with recording (the closing cycle after them comes on top)."""
        return self.days * (86_400 // SLOT_SECONDS)

    def registry(self) -> Registry:
        """The parsed registry."""
        return parse_registry(self.registry_text, source=self.registry_path)


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
        truth: use case -> period -> the reported values' tally.
        published: use case -> period -> [reports, records] acknowledged by the broker.
        unsent: use case -> values recorded but never reported (daily limit, ε cap, outbox drops).
        refused: use case -> values the agent refused (stopped use case, bad value).
        messages: reports acknowledged.
        retries: device publish attempts repeated after a connection failure.
        setup_seconds: time to create the agents.
        run_seconds: time to simulate and publish.
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

    def merge(self, other: ShardResult) -> ShardResult:
        """Both workers' results together."""
        out = ShardResult(
            devices=self.devices + other.devices,
            messages=self.messages + other.messages,
            retries=self.retries + other.retries,
            setup_seconds=max(self.setup_seconds, other.setup_seconds),
            run_seconds=max(self.run_seconds, other.run_seconds),
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


def build_generators(plan: FleetPlan, registry: Registry) -> dict[str, ValueGenerator]:
    """The value generator of every simulated use case.

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
            registry.use_cases[name],
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
    in_flight: int = 0


class ConnectionPool:
    """A few long-lived broker connections shared by every device of a worker.

    Each is opened through an ordinary :class:`agent.transport.Transport` (the agent's MQTT
    adapter with its TLS and authentication), so what reaches the broker is what a device
    sends; a device borrows a connection for one publish at a time. A connection that fails
    is closed and reopened with a capped backoff by the next device that needs it.

    Args:
        transport: opens connections.
        size: number of connections.
        window: publishes in flight per connection (below aiomqtt's warning threshold of 10).
    """

    def __init__(self, transport: Transport, *, size: int, window: int) -> None:
        self._transport = transport
        self._slots = [_Pooled(i) for i in range(size)]
        self._free = asyncio.Semaphore(size * window)
        self._window = window
        self._lock = asyncio.Lock()
        self.reconnects = 0

    async def __aenter__(self) -> ConnectionPool:
        for slot in self._slots:
            await self._open(slot)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for slot in self._slots:
            await self._close(slot)

    async def _open(self, slot: _Pooled) -> None:
        stack = contextlib.AsyncExitStack()
        try:
            slot.connection = await stack.enter_async_context(self._transport.connect())
        except BaseException:
            await stack.aclose()
            raise
        slot.stack = stack

    async def _close(self, slot: _Pooled) -> None:
        stack, slot.stack, slot.connection = slot.stack, None, None
        if stack is not None:
            # A connection that already broke may fail again while closing: it is gone either way.
            with contextlib.suppress(TransportError):
                await stack.aclose()

    async def repair(self, *, attempt: int) -> None:
        """Reopen every broken connection (after a delay that grows with ``attempt``).

        Raises:
            TransportError: if the broker still cannot be reached.
        """
        await asyncio.sleep(_REPAIR_BACKOFF.ceiling(attempt))  # no jitter: the simulator replays exactly
        async with self._lock:
            for slot in self._slots:
                if slot.connection is None:
                    await self._close(slot)
                    await self._open(slot)
                    self.reconnects += 1

    async def publish(self, topic: str, payload: bytes) -> None:
        """Publish on the least busy live connection; return after the broker's acknowledgement.

        Raises:
            TransportError: if it was not acknowledged (the connection is marked broken).
        """
        async with self._free:
            live = [s for s in self._slots if s.connection is not None and s.in_flight < self._window]
            if not live:
                raise TransportError("no live broker connection in the pool")
            slot = min(live, key=lambda s: s.in_flight)
            conn = slot.connection
            assert conn is not None
            slot.in_flight += 1
            try:
                await conn.publish(topic, payload)
            except TransportError:
                slot.connection = None
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
        state_dir = root / f"device-{number:07d}"
        sealer = Sealer(key) if plan.state_dir is not None else MemorySealer(key)
        self.agent = Agent(
            registry=registry,
            state_dir=state_dir,
            sealer=sealer,
            clock=clock,
            rng=rng,
            device_identity=shard.identity(number),
        )
        self.agent.grant_consent()
        transport = _DeviceTransport(shard.pool, self._acked)
        self.daemon = Daemon(
            self.agent, transport, clock=clock, rng=rng, schedule=ScheduleConfig(jitter_seconds=plan.jitter_seconds)
        )
        self.rng = rng
        self._shard = shard
        # (use case, period) -> the value recorded, until the report carrying it is acknowledged.
        self.recorded: dict[tuple[str, int], object] = {}

    def _acked(self, payload: bytes) -> None:
        body = msgpack.unpackb(payload, raw=False)
        self._shard.acknowledged(self, str(body["u"]), int(body["p"]), len(body["r"]))


class _Shard:
    def __init__(self, plan: FleetPlan, registry: Registry, pool: ConnectionPool) -> None:
        self.plan = plan
        self.registry = registry
        self.pool = pool
        self.result = ShardResult()
        self.kinds = {name: tally_kind(registry.use_cases[name]) for name in plan.use_cases}
        self._identity = None if plan.broker is None else device_identity(plan.broker, source="ldp-fleet")

    def identity(self, number: int) -> str | None:
        """The sub-identity device ``number`` publishes under (None for an anonymous broker)."""
        return None if self._identity is None else f"{self._identity}/{number:07d}"

    def acknowledged(self, device: _Device, use_case: str, period: int, records: int) -> None:
        res = self.result
        res.messages += 1
        pub = res.published.setdefault(use_case, {}).setdefault(period, [0, 0])
        pub[0] += 1
        pub[1] += records
        value = device.recorded.pop((use_case, period), None)
        if value is not None and use_case in self.kinds:
            tally = res.truth.setdefault(use_case, {}).setdefault(period, Tally())
            tally.add(self.kinds[use_case], value, self.registry.use_cases[use_case])


async def _drain(device: _Device, shard: _Shard) -> None:
    for attempt in range(MAX_PUBLISH_ATTEMPTS):
        try:
            await device.daemon.publisher.drain_once()
            return
        except TransportError as e:
            shard.result.retries += 1
            log.warning("device %d: publishing failed (%s); reconnecting", device.number, e)
            with contextlib.suppress(TransportError):
                await shard.pool.repair(attempt=attempt)
    raise TransportError(f"device {device.number}: reports not acknowledged after {MAX_PUBLISH_ATTEMPTS} attempts")


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
    generators = build_generators(plan, registry)
    if transport is None:
        from agent.mqtt import MqttTransport  # noqa: PLC0415 - only when publishing to a real broker

        if plan.broker is None:
            raise ValueError("the plan names no broker and no transport was given")
        # The pooled connections publish without commit receipts (each device's report is
        # done at the broker's PUBACK); receipts would need a receipt topic per pooled
        # connection and routing each receipt back to the device whose outbox holds the id.
        broker = dataclasses.replace(plan.broker, receipts=False)
        transport = MqttTransport(broker, SeededRandom(device_seed(plan.seed, plan.start, -1 - worker)))
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        if root is None and plan.state_dir is None:
            # In-memory state still needs a directory per agent (it only stays empty).
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ldp-fleet-")))
        base = Path(root or plan.state_dir or ".")
        pool = await stack.enter_async_context(ConnectionPool(transport, size=plan.connections, window=plan.window))
        shard = _Shard(plan, registry, pool)
        clock = FakeClock(float(plan.start))
        fleet = [_Device(d, plan=plan, registry=registry, clock=clock, root=base, shard=shard) for d in devices]
        shard.result.devices = len(fleet)
        shard.result.setup_seconds = time.monotonic() - started
        await _simulate(shard, generators=generators, fleet=fleet, clock=clock, worker=worker, progress=progress)
    # What is still recorded but unacknowledged was held back by a limit: not part of the truth.
    for device in fleet:
        for use_case, _period in device.recorded:
            shard.result.unsent[use_case] = shard.result.unsent.get(use_case, 0) + 1
    shard.result.run_seconds = time.monotonic() - started
    return shard.result


def _record(shard: _Shard, device: _Device, name: str, value: object | None, period: int) -> None:
    """Give the device's agent its value of the period (none: the device has no value); count refusals."""
    if value is None:
        return
    try:
        outcome = device.agent.record(name, value)
    except (ValueRefusedError, UseCaseStoppedError):
        shard.result.refused[name] = shard.result.refused.get(name, 0) + 1
        return
    if outcome.outcome == "recorded":
        device.recorded[(name, period)] = value


async def _simulate(
    shard: _Shard,
    *,
    generators: dict[str, ValueGenerator],
    fleet: Sequence[_Device],
    clock: FakeClock,
    worker: int,
    progress: Callable[[Progress], None] | None,
) -> None:
    plan, registry = shard.plan, shard.registry
    use_cases = [registry.use_cases[name] for name in plan.use_cases]
    first = {uc.name: uc.period.index_at(plan.start) for uc in use_cases}
    slots_per_period = {uc.name: uc.period.seconds // SLOT_SECONDS for uc in use_cases}
    queue: asyncio.Queue[_Device] = asyncio.Queue(maxsize=4 * plan.connections * plan.window)
    last_report = time.monotonic()

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
