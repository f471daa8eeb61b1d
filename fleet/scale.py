"""The fleet's scale mode (``ldp-fleet --scale``): devices simulated in bulk, not as complete agents.

A complete agent per device (:mod:`fleet.sim`) costs a few hundred microseconds of CPU per
report: sealing its state, accounting, keeping its outbox and ledger. That is what a device
does, and what the normal fleet checks; it is also what keeps a fleet of 10^5 devices from
sending a day's reports in minutes. The scale mode keeps what makes a report a device's and
drops the rest:

* **Per-device state, set up once.** Every device's permanent randomness is drawn once for
  the run and kept as arrays (:mod:`fleet.scale_privatize`): 1BitMean's α and memo bits,
  dBitFlipPM's buckets and memoized answers, RAPPOR's cohort and memoized ``B'``.
* **The same values.** Each device's value per (use case, period) comes from the normal
  fleet's generators (:func:`fleet.plan.build_generators`), so both modes simulate the same
  population.
* **Daily limits by construction.** A device sends at most ``daily_limit`` records per use case
  and day, and one report per (use case, period), as the agent's accounting allows
  (docs/privacy-accounting.md); a value beyond the limit is counted as not sent.
* **The agent's wire form.** Reports are encoded as :func:`protocol.wire.encode_report` does,
  all of a (use case, period) at once (:func:`protocol.wire.encode_reports`), each with a
  fresh random report id, and published under the device's own sub-identity
  (``<prefix>/<user>/<device number>/<use case>``, as :mod:`fleet.sim`), so the collector's
  allowance per device holds.
* **Receipts.** Reports go through a few long-lived pipelined connections
  (:mod:`fleet.scale_publisher`), each asking for the collector's commit receipt; the
  truth holds the values whose reports a receipt said were counted. At most
  :data:`SCALE_UNANSWERED` reports wait for their receipt at a time (a device waits for its
  own), and when no receipt has come for ``receipt_timeout`` seconds the reports without
  one are sent again byte for byte.

What it does not do: seal state, keep a ledger or an outbox, hold a device to its lifetime ε
cap or audit its ε (a run of a few days stays far below the caps of
``deploy/fleet.usecases.toml``), or run the agent's schedule (every device of a period is
privatized in one batch). Records are privatized per (use case, period) in batches, with
the fleet's coins from one seeded source, so a run is reproducible for the same plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from agent.config import DEFAULT_TOPIC_PREFIX
from agent.identity import device_identity
from agent.mqtt import random_client_id
from fleet.plan import SLOT_SECONDS, FleetPlan, build_generators, device_seed
from fleet.scale_privatize import DevicePrivatizer, device_privatizer
from fleet.scale_publisher import Outgoing, ReceiptPublisher
from fleet.tally import Progress, ShardResult, Tally, tally_kind
from protocol.errors import InputError
from protocol.mqtt.reasons import is_failure
from protocol.randomness import SeededRandom
from protocol.receipts import Receipt
from protocol.registry import UseCase
from protocol.wire import REPORT_ID_SIZE, encode_reports

__all__ = ["SCALE_LABEL", "ScaleFleet", "ScaleReport", "build_period", "periods", "run_scale"]

log = logging.getLogger("ldp_fleet")

SCALE_LABEL = (
    "scale mode: devices are simulated in bulk, not as complete agents; "
    "reports are privatized per device with the vectorised privatizers"
)

_BATCH = 50_000
"""Devices privatized in one call: bounds the arrays a batch makes."""
SCALE_WINDOW = 2_000
"""PUBLISHes in flight per connection: enough to keep the broker busy across the loopback."""
SCALE_UNANSWERED = 100_000
"""Reports published and still without their receipt, at most: far below the deployed broker's
queue per subscriber (deploy/mosquitto/mosquitto.conf, max_queued_messages)."""
_CHUNK = 10_000
"""Reports published between two looks at the receipts."""
_YOUNG_COLLECTION = 50_000
"""Allocations between two of the cyclic garbage collector's young passes while the scale mode
runs (the interpreter's default is 700)."""


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """The cyclic garbage collector's young pass every :data:`_YOUNG_COLLECTION` allocations
    instead of every 700, until the block ends.

    A run makes several objects per report (its record, bytes, the receipt) and keeps up to
    :data:`SCALE_UNANSWERED` reports waiting, none of them in a reference cycle; with the default
    threshold the collector passes over them so often that it costs about a fifth of the
    time spent building the reports, and frees nothing. Cycles are still collected, later.
    """
    before = gc.get_threshold()
    gc.set_threshold(_YOUNG_COLLECTION, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


class ScaleReport(NamedTuple):
    """One report of the scale mode, and what it carries (a tuple: a run makes one per report).

    Attributes:
        device: the device number.
        use_case: the use case (the plan's definition).
        period: the period index.
        value: the value the device recorded (the truth it adds when counted).
        topic: where it is published.
        payload: the encoded report.
        report_id: its id (the receipt's correlation data).
    """

    device: int
    use_case: UseCase
    period: int
    value: object
    topic: str
    payload: bytes
    report_id: bytes


class ScaleFleet:
    """The whole fleet's state: one privatizer per use case, records sent per device and day."""

    def __init__(self, plan: FleetPlan, identity: str | None) -> None:
        self.plan = plan
        self.identity = identity
        self.rng = SeededRandom(device_seed(plan.seed, plan.start, -1_000_000))
        # Report ids from a stream of their own (fleet.plan.device_seed: the start is part of it).
        self.ids = np.random.default_rng(device_seed(plan.seed, plan.start, -1_000_001))
        self.use_cases = [plan.use_case(name) for name in plan.use_cases]
        self.privatizers = {uc.name: device_privatizer(uc, plan.devices, self.rng) for uc in self.use_cases}
        self.sent_on: dict[str, tuple[int, np.ndarray[Any, np.dtype[np.int64]]]] = {}
        self.result = ShardResult(devices=plan.devices)
        self.topic_prefix = DEFAULT_TOPIC_PREFIX if plan.broker is None else plan.broker.topic_prefix
        # Each device's topic up to the use case, made once for the run rather than once per report.
        self._device_topics = (
            [f"{self.topic_prefix}/{identity}/{device:07d}/" for device in range(plan.devices)]
            if identity is not None
            else []
        )

    def topic(self, device: int, use_case: str) -> str:
        """Where ``device`` publishes ``use_case``: as an agent under its sub-identity does (agent.core.Agent.topic)."""
        if self.identity is None:
            return f"{self.topic_prefix}/{use_case}"
        return self._device_topics[device] + use_case

    def topics(self, devices: list[int], use_case: str) -> list[str]:
        """:meth:`topic` of each of ``devices``."""
        if self.identity is None:
            return [self.topic(0, use_case)] * len(devices)
        heads = self._device_topics
        return [heads[device] + use_case for device in devices]

    def allowance(self, use_case: UseCase, day: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Records each device has sent of ``use_case`` on ``day`` (a fresh count each day)."""
        seen = self.sent_on.get(use_case.name)
        if seen is None or seen[0] != day:
            seen = self.sent_on[use_case.name] = (day, np.zeros(self.plan.devices, dtype=np.int64))
        return seen[1]


def build_period(
    fleet: ScaleFleet, use_case: UseCase, period: int, values: list[object | None], day: int
) -> list[ScaleReport]:
    """Every device's report of ``use_case`` for ``period`` (one record each; none for a device
    without a value, with a value the mechanism refuses, or at its daily limit)."""
    result = fleet.result
    privatizer: DevicePrivatizer = fleet.privatizers[use_case.name]
    sent = fleet.allowance(use_case, day)
    rows: list[int] = []
    inputs: list[object] = []
    raw: list[object] = []
    for device, value in enumerate(values):
        if value is None:
            continue
        try:
            checked = privatizer.value(value)
        except InputError:
            result.refused[use_case.name] = result.refused.get(use_case.name, 0) + 1
            continue
        if sent[device] >= use_case.daily_limit:
            result.unsent[use_case.name] = result.unsent.get(use_case.name, 0) + 1
            continue
        rows.append(device)
        inputs.append(checked)
        raw.append(value)
    chosen = np.asarray(rows, dtype=np.int64)
    sent[chosen] += 1
    out: list[ScaleReport] = []
    for lo in range(0, len(rows), _BATCH):
        part = chosen[lo : lo + _BATCH]
        records = privatizer.records(part, inputs[lo : lo + _BATCH], fleet.rng)
        ids = fleet.ids.bytes(REPORT_ID_SIZE * len(part))
        report_ids = [ids[i : i + REPORT_ID_SIZE] for i in range(0, len(ids), REPORT_ID_SIZE)]
        payloads = encode_reports(use_case.name, use_case.definition, period, report_ids, [[r] for r in records])
        devices = part.tolist()
        topics = fleet.topics(devices, use_case.name)
        out.extend(
            ScaleReport(device, use_case, period, value, topic, payload, report_id)
            for device, value, topic, payload, report_id in zip(
                devices, raw[lo : lo + _BATCH], topics, payloads, report_ids, strict=True
            )
        )
    return out


def periods(fleet: ScaleFleet) -> Iterator[tuple[int, list[ScaleReport]]]:
    """Slot by slot, the reports of every period that starts in it (the generators' order)."""
    plan = fleet.plan
    generators = build_generators(plan)
    first = {uc.name: uc.period.index_at(plan.start) for uc in fleet.use_cases}
    per = {uc.name: uc.period.seconds // SLOT_SECONDS for uc in fleet.use_cases}
    for slot in range(plan.slots):
        day = slot * SLOT_SECONDS // 86_400
        for uc in fleet.use_cases:
            if slot % per[uc.name]:
                continue
            offset = slot // per[uc.name]
            yield slot, build_period(fleet, uc, first[uc.name] + offset, generators[uc.name].values(offset), day)


class _Sender:
    """Publishes the reports over the fleet's connections and folds the receipts into the result."""

    def __init__(self, fleet: ScaleFleet, receipts: bool, unanswered: int) -> None:
        self.fleet = fleet
        self.receipts_on = receipts
        self.unanswered = unanswered
        self.answered = asyncio.Event()
        self.publishers: list[ReceiptPublisher] = []
        self.waiting: dict[bytes, ScaleReport] = {}
        # Per use case, what every one of its reports is counted under: asked once, not per report.
        self._refs = {uc.name: uc.ref for uc in fleet.use_cases}
        self._kinds = {uc.name: tally_kind(uc) for uc in fleet.use_cases}

    def _tally(self, report: ScaleReport, ref: str) -> None:
        uc = report.use_case
        truth = self.fleet.result.truth
        per_period = truth.get(ref)
        if per_period is None:
            per_period = truth[ref] = {}
        tally = per_period.get(report.period)
        if tally is None:
            tally = per_period[report.period] = Tally()
        tally.add(self._kinds[uc.name], report.value, uc)

    def receipts(self, receipts: list[Receipt]) -> None:
        """Commit receipts arrived: count what they say, once per report."""
        result = self.fleet.result
        self.answered.set()
        waiting, refs, outcomes, counted_periods = self.waiting, self._refs, result.outcomes, result.counted_periods
        for receipt in receipts:
            report = waiting.pop(receipt.correlation, None)
            if report is None:
                continue  # a second answer, to a report sent again
            ref = refs[report.use_case.name]
            status = "counted" if receipt.counted else f"refused: {receipt.reason or 'unknown'}"
            said = outcomes.get(ref)
            if said is None:
                said = outcomes[ref] = {}
            said[status] = said.get(status, 0) + 1
            if receipt.counted:
                counted = counted_periods.get(ref)
                if counted is None:
                    counted = counted_periods[ref] = {}
                counted[report.period] = counted.get(report.period, 0) + 1
                self._tally(report, ref)

    def acknowledged(self, item: Outgoing, reason: int) -> None:
        """The broker's PUBACK of a first send: published, or refused (its ACL denies the topic)."""
        assert isinstance(item, ScaleReport)
        result = self.fleet.result
        ref = self._refs[item.use_case.name]
        if is_failure(reason):  # the broker refused the message (MQTT 5 §3.4.2.1)
            self.waiting.pop(item.report_id, None)
            said = result.outcomes.setdefault(ref, {})
            status = f"refused by the broker: reason code 0x{reason:02x}"
            said[status] = said.get(status, 0) + 1
            return
        result.messages += 1
        per_period = result.published.get(ref)
        if per_period is None:
            per_period = result.published[ref] = {}
        pub = per_period.get(item.period)
        if pub is None:
            pub = per_period[item.period] = [0, 0]
        pub[0] += 1
        pub[1] += 1
        if not self.receipts_on:
            self._tally(item, ref)

    async def send_all(self, reports: list[ScaleReport]) -> None:
        """Publish ``reports``, spread over the connections, never more than ``unanswered`` of
        the fleet's reports without their receipt (a collector that falls behind holds the fleet
        back, as each device waits for its own receipts, instead of the broker's queue filling);
        return when the last chunk is written, the broker's acknowledgements of it still to come
        (:meth:`flush`), so that the next period is built while broker and collector work.

        Raises:
            TransportError: a connection ended.
        """
        n = len(self.publishers)
        step = max(1, min(_CHUNK, self.unanswered // 2))
        for lo in range(0, len(reports), step):
            chunk = reports[lo : lo + step]
            if self.receipts_on:
                await self.await_receipts(room=self.unanswered - len(chunk))
                self.waiting.update((r.report_id, r) for r in chunk)
            # Written, not yet acknowledged: the caller builds the next period while broker and
            # collector work on this one; each connection's window bounds what is in flight.
            for i, publisher in enumerate(self.publishers):
                await publisher.write_all(chunk[i::n], self.acknowledged)

    async def flush(self) -> None:
        """Wait until the broker acknowledged everything :meth:`send_all` wrote.

        Raises:
            TransportError: a connection ended.
        """
        for publisher in self.publishers:
            await publisher.settled()

    async def await_receipts(self, *, room: int = 0) -> None:
        """Wait until at most ``room`` reports lack their receipt, or the plan's receipt wait is
        over. When no receipt has come for the plan's receipt timeout, every report without one
        is sent again, byte for byte (the collector counts a report id once)."""
        plan = self.fleet.plan
        deadline = time.monotonic() + plan.receipt_wait
        seen, since = len(self.waiting), time.monotonic()
        while len(self.waiting) > room and time.monotonic() < deadline:
            if len(self.waiting) < seen:
                seen, since = len(self.waiting), time.monotonic()
            elif time.monotonic() - since >= plan.receipt_timeout:
                again = list(self.waiting.values())
                log.warning("no commit receipt for %g s; sending %d reports again", plan.receipt_timeout, len(again))
                self.fleet.result.retries += len(again)
                await self.flush()
                await self.publishers[0].publish_all(again, lambda _item, _reason: None)
                since = time.monotonic()
            self.answered.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.answered.wait(), 0.05)
        if room == 0:
            self.fleet.result.missing = len(self.waiting)


async def run_scale(
    plan: FleetPlan,
    *,
    window: int = SCALE_WINDOW,
    unanswered: int = SCALE_UNANSWERED,
    progress: Callable[[Progress], None] | None = None,
) -> ShardResult:
    """Simulate the plan's whole fleet in scale mode and publish its reports to ``plan.broker``.

    Args:
        plan: the simulation (a registry change and a state directory are not simulated here);
            ``plan.connections`` connections publish.
        window: PUBLISHes in flight per connection.
        unanswered: most reports published and still without their receipt (with receipts).
        progress: called after every slot.

    Raises:
        TransportError: the broker could not be reached or a connection ended.
        fleet.values.GeneratorError: a generator does not fit its use case.
    """
    if plan.change is not None:
        raise ValueError("the scale mode does not simulate a registry change")
    if plan.broker is None:
        raise ValueError("the plan names no broker")
    started = time.monotonic()
    cpu_started = time.process_time()
    identity = device_identity(plan.broker, source="ldp-fleet")
    fleet = ScaleFleet(plan, identity)
    ids = SeededRandom(device_seed(plan.seed, plan.start, -1_000_002))
    result = fleet.result
    sender = _Sender(fleet, plan.receipts, unanswered)
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(_fewer_collections())
        for _ in range(plan.connections):
            publisher = ReceiptPublisher(
                plan.broker,
                client_id=random_client_id(ids),
                identity=identity,
                window=window,
                on_receipts=sender.receipts if plan.receipts else None,
            )
            sender.publishers.append(await stack.enter_async_context(publisher))
        result.setup_seconds = time.monotonic() - started
        result.setup_cpu_seconds = time.process_time() - cpu_started
        await _send_periods(sender, progress)
        if progress is not None:
            progress(Progress(0, plan.slots + 1, 0, result.messages))
        if plan.receipts:
            await sender.await_receipts()
    result.run_seconds = time.monotonic() - started
    return result


async def _send_periods(sender: _Sender, progress: Callable[[Progress], None] | None) -> None:
    """Build and publish every period's reports, each built while the ones before are acknowledged."""
    for slot, reports in periods(sender.fleet):
        await sender.send_all(reports)
        if progress is not None:
            progress(Progress(0, slot + 1, 0, sender.fleet.result.messages))
    await sender.flush()
