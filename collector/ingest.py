"""Streaming ingest: decode strictly, window and de-duplicate, shuffle, commit, then acknowledge.

The path of one message (003 §3.2.2 "Ingestion and Aggregation", made streaming):

1. The transport hands over the payload and the sender's identity from the topic (client id,
   arrival time and the rest of the topic are gone). The identity is kept next to the report
   only until its commit, where the store checks the per-device allowance under a keyed hash
   (docs/device-identity.md); it is never logged.
2. ``protocol.wire.decode_report`` decodes it strictly against the catalog of definitions
   the collector accepts (its current registry and the earlier ones still in the field); a
   malformed, oversize or foreign message is counted under its reason and acknowledged,
   never raised. A report is counted under the definition it was made with.
3. A report whose period lies outside the retention window (``period-expired``), too far
   ahead of the clock (``period-future``), or on or after its definition's retirement day
   (``retired``) is refused; a report id already in the current batch is a duplicate.
4. Accepted reports wait in a bounded shuffle buffer (``commit_max_reports``). When it is
   full or ``commit_interval_s`` has passed since its first report, the buffer is randomly
   permuted and handed to the checkpoint store, which - in one transaction - drops report
   ids it already holds, folds the rest per (use case, period) and records their ids.
5. Only then are the messages acknowledged (PUBACK). A crash before that leaves them
   unacknowledged; the broker redelivers them and step 4 recognises the ones already folded.
6. Then the commit receipts (``protocol.receipts``, docs/design.md, invariant 8): every message that
   asked for one (an MQTT 5 Response Topic under ``mqtt.receipt_prefix`` and Correlation
   Data) is answered through the broker that delivered it (a collector may subscribe to
   several, collector.mqtt.brokers), one message per response topic per commit: *counted* when its report
   is in the store (folded now or by an earlier delivery), *refused* with the counted reason
   otherwise (a report for a period ahead of the clock gets none: it may count later). A
   receipt is never sent before the commit that decided it, so "counted" is never premature.
   Response topics live only in memory, in the commit they belong to.

Backpressure: while one commit runs (in the store's own thread) the next buffer fills; when
it is full, ingest waits for the commit, the transport's buffer fills, and the broker stops
sending at the Receive Maximum. Nothing grows without bound.

Store failures bend, they do not break: when a commit fails for a cause that can pass (a
full disk, a locked or read-only database, an I/O error, a database file removed under
us: :class:`~collector.errors.StoreUnavailable`), nothing of it was stored and nothing is
acknowledged. Ingest keeps the batch, stops taking messages (so the transport stops reading
the socket and the broker holds the rest), marks the store unavailable with its cause
(``/healthz`` answers 503, ``ldp_collector_store_available`` is 0, a warning names the
cause), and retries the same batch with capped, jittered exponential backoff. When a retry
commits, the batch is acknowledged and ingest resumes by itself. A crash loop under
``Restart=on-failure`` on a full disk is thus replaced by a collector that waits, visibly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import operator
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Self, TypeVar

import numpy as np

from collector.config import IngestConfig
from collector.errors import StoreUnavailable
from collector.metrics import IngestMetrics
from collector.store import CommitResult, Store
from collector.transport import Delivery, Transport, route_of
from protocol.catalog import Catalog, catalog_of
from protocol.errors import MalformedReportError
from protocol.receipts import MAX_CORRELATION_BYTES, Receipt, foreign_response_topic, valid_response_topic
from protocol.registry import Registry
from protocol.wire import DecodedReport, decode_report
from runtime.backoff import Backoff, Retry
from runtime.clock import SystemClock, WallClock
from runtime.closing import close_in_thread

__all__ = ["RETRY_MAX_S", "RETRY_MIN_S", "Ingest", "StoreThread", "period_windows"]

log = logging.getLogger(__name__)

T = TypeVar("T")
S_co = TypeVar("S_co", bound=Store, covariant=True)

RETRY_MIN_S = 0.1
"""First wait before retrying a commit the store could not take."""
RETRY_MAX_S = 30.0
"""Longest wait between retries (doubling from RETRY_MIN_S, with jitter)."""


def period_windows(
    catalog: Catalog, now: float, config: IngestConfig, low_water: Mapping[str, int]
) -> dict[str, tuple[int, int]]:
    """The accepted period indices ``(low, high)``, inclusive, per definition (by ref) at time ``now``.

    ``low`` never goes below the stored low-water mark, so a clock that jumps back cannot
    reopen a period whose report ids have been forgotten.
    """
    out = {}
    for ref, uc in catalog.use_cases.items():
        current = uc.period.index_at(now)
        low = max(current - config.retention_periods + 1, low_water.get(ref, 0), 0)
        out[ref] = (low, current + config.future_periods)
    return out


class StoreThread(Generic[S_co]):
    """Runs every operation of a checkpoint store (:class:`~collector.store.Store`) in one dedicated thread.

    SQLite and PostgreSQL calls block; running them in their own thread keeps the event loop
    receiving and decoding while a transaction commits.
    """

    def __init__(self, opener: Callable[[], S_co]) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._store: S_co = self._executor.submit(opener).result()

    @property
    def location(self) -> str:
        """Where the store is (a file or a URL)."""
        return self._store.location

    def submit(self, fn: Callable[[S_co], T]) -> asyncio.Future[T]:
        """Schedule ``fn(store)`` on the store thread; an awaitable of its result."""
        return asyncio.wrap_future(self._executor.submit(fn, self._store))

    async def call(self, fn: Callable[[S_co], T]) -> T:
        """Run ``fn(store)`` on the store thread and wait for it."""
        return await self.submit(fn)

    def close(self) -> None:
        """Close the database and stop the thread (waits for queued work)."""
        self._executor.submit(self._store.close).result()
        self._executor.shutdown(wait=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # The close waits for queued work: off the event loop, and to its end even when the
        # service is cancelled meanwhile (docs/design.md, convention 14).
        await close_in_thread(self.close)


class _Request(NamedTuple):
    """A receipt request waiting for its commit."""

    route: int
    """The broker that delivered the report: the receipt goes back through it."""
    topic: bytes
    """The response topic the agent asked for."""
    correlation: bytes
    """The agent's correlation data, returned with the receipt."""
    refused: str | None
    """Why the report was refused before the commit; None when the commit decides its fate."""
    report_id: bytes | None
    """The report whose fate the commit decides; None for a report refused before it."""


@dataclass
class _Commit:
    future: asyncio.Future[CommitResult]
    reports: list[DecodedReport]
    senders: list[bytes]
    tokens: list[int]
    counters: Counter[str]
    since: float
    requests: list[_Request]


class Ingest:
    """The ingest loop: transport -> decode -> shuffle buffer -> checkpoint -> acknowledge.

    Args:
        catalog: the definitions accepted (reports under any other are refused).
        transport: where messages come from and acknowledgements go.
        store: the checkpoint store's thread.
        config: limits and batching.
        metrics: counters to update.
        clock: the wall clock (for the period window).
        low_water: the stored low-water marks at start-up, by definition ref.
        on_commit: called with each commit's result once it is acknowledged (the service
            keeps its materialised aggregates current with it).
        receipt_prefix: response topics the collector answers (``mqtt.receipt_prefix``);
            a request for any other topic is counted and ignored.
    """

    def __init__(
        self,
        *,
        catalog: Catalog | Registry,
        transport: Transport,
        store: StoreThread[Store],
        config: IngestConfig,
        metrics: IngestMetrics,
        clock: WallClock | None = None,
        low_water: Mapping[str, int] | None = None,
        on_commit: Callable[[CommitResult], None] | None = None,
        receipt_prefix: str = "ldp/v1/receipts/",
    ) -> None:
        self.catalog = catalog = catalog_of(catalog)
        self.transport = transport
        self.store = store
        self.config = config
        self.metrics = metrics
        self.clock = clock or SystemClock()
        self.low_water = dict(low_water or {})
        self.on_commit = on_commit
        metrics.capacity = config.commit_max_reports
        # Collector-side randomness (the shuffle) needs no exact coins; the OS seeds it.
        self._rng = np.random.default_rng()
        self._reports: list[DecodedReport] = []
        self._senders: list[bytes] = []
        self._tokens: list[int] = []
        self._counters: Counter[str] = Counter()
        self._ids: set[bytes] = set()
        self._requests: list[_Request] = []
        self._receipt_prefix = receipt_prefix.encode()
        self._since = 0.0
        self._inflight: _Commit | None = None
        self._failed: _Commit | None = None  # a commit the store could not take, to retry
        self._windows = period_windows(catalog, self.clock.time(), config, self.low_water)
        self._windows_at = time.monotonic()
        # The first period refused as retired, per definition that has a retirement day.
        self._retired = {
            ref: first for ref, uc in catalog.use_cases.items() if (first := catalog.retired_from(uc)) is not None
        }

    def raise_low_water(self, marks: Mapping[str, int]) -> None:
        """Adopt higher low-water marks before the store prunes below them."""
        for name, mark in marks.items():
            self.low_water[name] = max(self.low_water.get(name, 0), mark)
        self._refresh_windows()

    def _refresh_windows(self) -> None:
        self._windows = period_windows(self.catalog, self.clock.time(), self.config, self.low_water)
        self._windows_at = time.monotonic()

    async def run(self) -> None:
        """Ingest until cancelled; on cancellation, commit and acknowledge what is buffered."""
        ended: Exception | None = None
        try:
            # The task that waits on the transport belongs to this group: it never outlives
            # run(). An exception of the loop is raised again below as itself, not wrapped in
            # the group's ExceptionGroup, after the waiting task is gone.
            async with asyncio.TaskGroup() as tasks:
                try:
                    await self._ingest(tasks)
                except Exception as exc:
                    ended = exc
            if ended is not None:
                raise ended
        finally:
            await self._drain()

    async def _ingest(self, tasks: asyncio.TaskGroup) -> None:
        """The loop of :meth:`run`: receive, accept, commit when due, acknowledge what committed."""
        receiving: asyncio.Task[list[Delivery]] | None = None
        try:
            while True:
                if self._failed is not None:
                    await self._recover()
                    continue
                if receiving is None:
                    room = self.config.commit_max_reports - len(self._tokens)
                    receiving = tasks.create_task(self.transport.receive(max(room, 1)), name="ingest-receive")
                waits: set[asyncio.Future[Any]] = {receiving}
                if self._inflight is not None:
                    waits.add(self._inflight.future)
                timeout = None
                if self._tokens:
                    timeout = max(0.0, self._since + self.config.commit_interval_s - time.monotonic())
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if self._inflight is not None and self._inflight.future.done():
                    self._finish(self._inflight)
                    self._inflight = None
                if receiving.done():
                    deliveries = receiving.result()
                    receiving = None
                    self._accept(deliveries)
                due = self._tokens and (
                    len(self._tokens) >= self.config.commit_max_reports
                    or time.monotonic() >= self._since + self.config.commit_interval_s
                )
                if due:
                    await self._start_commit()
        finally:
            if receiving is not None:
                receiving.cancel()  # the group awaits it

    async def _drain(self) -> None:
        """Finish the running commit and commit what is buffered (shutdown path).

        A second cancellation interrupts the wait; the commit still completes in the store
        thread, and its messages, unacknowledged, are redelivered and recognised later.
        """
        if self._inflight is not None:
            running, self._inflight = self._inflight, None
            with contextlib.suppress(Exception):
                await asyncio.shield(running.future)
            self._finish(running)
        if self._failed is not None or self.metrics.store_error:
            # The store cannot take commits: leave everything unacknowledged; the broker
            # redelivers it to the next collector session.
            log.warning("stopping with the store unavailable: %d messages left unacknowledged", self._pending())
            return
        if self._tokens:
            await self._start_commit()
            last = self._inflight
            self._inflight = None
            if last is not None:
                await asyncio.shield(last.future)
                self._finish(last)

    def _accept(self, deliveries: Sequence[Delivery]) -> None:
        """Buffer what ``deliveries`` bring: each message is judged, then refused or kept, and its
        receipt request noted; every token waits for the commit."""
        if time.monotonic() - self._windows_at > 1.0:
            self._refresh_windows()
        if not self._tokens and deliveries:
            self._since = time.monotonic()
            self.metrics.pending_since = self._since
        tokens = self._tokens
        for d in deliveries:
            tokens.append(d.token)
            receipt = self._receipt_to(d)
            judged = self._judge(d)
            if isinstance(judged, str):
                self._refuse(judged, receipt)
            else:
                self._keep(judged, d.sender, receipt)
        self._counters["messages"] += len(deliveries)
        self.metrics.messages += len(deliveries)
        self.metrics.pending = len(tokens)

    def _receipt_to(self, d: Delivery) -> tuple[int, bytes, bytes] | None:
        """Where a receipt for ``d`` goes (route, response topic, correlation); None when none was
        asked for or the request is not one the collector answers."""
        reply_to = d.reply_to
        correlation = d.correlation
        if reply_to is None and correlation is None:
            return None
        if (
            reply_to is None
            or not correlation
            or len(correlation) > MAX_CORRELATION_BYTES
            or not valid_response_topic(reply_to, self._receipt_prefix)
        ):
            # Never publish outside the receipt prefix: a device must not steer the
            # collector's writes (into report topics, say). The report itself is
            # still processed; only the receipt is withheld.
            self.metrics.receipt_requests_invalid += 1
            return None
        refused = foreign_response_topic(reply_to, self._receipt_prefix, d.sender)
        if refused is not None:
            # Another connection's receipt topic: answering would let a device speak to it
            # (forged refusals make the victim drop its reports). The report is processed;
            # only the receipt is withheld.
            self.metrics.receipt_requests_refused[refused] += 1
            return None
        return route_of(d.token), reply_to, correlation

    def _judge(self, d: Delivery) -> DecodedReport | str:
        """The decoded report of ``d``, or the reason it is refused."""
        if self.config.require_device_identity and not d.sender:
            return "no-identity"
        report = self._decode(d.payload)
        if isinstance(report, str):
            return report
        refused = self._outside_window(report)
        return report if refused is None else refused

    def _decode(self, payload: bytes) -> DecodedReport | str:
        """The decoded report, or the reason the payload is malformed."""
        try:
            return decode_report(payload, self.catalog, max_size=self.config.max_report_bytes)
        except MalformedReportError as exc:
            return exc.reason
        except Exception:
            # The decoder promises MalformedReportError for every bad input. Should it
            # break that promise, the message is still untrusted input, not a reason to
            # stop: a crash would be followed by the broker redelivering the same message,
            # forever (docs/design.md, invariant 7). It is counted under its own reason and logged.
            log.exception("the report decoder failed on a %d-byte message; rejected as decoder-error", len(payload))
            return "decoder-error"

    def _outside_window(self, report: DecodedReport) -> str | None:
        """Why the report's period is not accepted now, or None when it is."""
        ref = report.use_case.ref
        low, high = self._windows[ref]
        if report.period < low:
            return "period-expired"
        if report.period > high:
            return "period-future"
        retired = self._retired
        if retired and report.period >= retired.get(ref, report.period + 1):
            return "retired"
        return None

    def _refuse(self, reason: str, receipt: tuple[int, bytes, bytes] | None) -> None:
        """Count a refused message; its receipt says why."""
        self._counters["rejected:" + reason] += 1
        self.metrics.rejected[reason] += 1
        # A period ahead of our clock may be accepted later (one of the two clocks is
        # off): no receipt, so the agent resends until it is counted or too old.
        if receipt is not None and reason != "period-future":
            self._requests.append(_Request(*receipt, refused=reason, report_id=None))

    def _keep(self, report: DecodedReport, sender: bytes, receipt: tuple[int, bytes, bytes] | None) -> None:
        """Buffer an accepted report for the next commit, unless its id is buffered already."""
        if receipt is not None:
            # Decided by the commit: counted (fresh or already stored) unless expired there.
            self._requests.append(_Request(*receipt, refused=None, report_id=report.report_id))
        if report.report_id in self._ids:
            self._counters["duplicates"] += 1
            self.metrics.duplicates += 1
            return
        self._ids.add(report.report_id)
        self._reports.append(report)
        self._senders.append(sender)

    async def _start_commit(self) -> None:
        if self._inflight is not None:
            inflight, self._inflight = self._inflight, None
            with contextlib.suppress(Exception):
                await inflight.future
            self._finish(inflight)
        if self._failed is not None:
            return  # the buffer waits until the failed batch is in
        reports = self._reports
        # 003 §3.2.2: "randomly permutes the ordering of privatized records within each use
        # case" - the store concatenates records in this order.
        order = self._rng.permutation(len(reports)).tolist()  # Python ints index a list faster than numpy's
        shuffled = [reports[i] for i in order]
        senders = [self._senders[i] for i in order]
        counters = self._counters
        self._inflight = _Commit(
            future=self.store.submit(lambda s: s.commit(shuffled, counters, senders)),
            reports=shuffled,
            senders=senders,
            tokens=self._tokens,
            counters=counters,
            since=self._since,
            requests=self._requests,
        )
        self._reports, self._tokens, self._counters, self._ids = [], [], Counter(), set()
        self._senders = []
        self._requests = []
        self._since = 0.0
        self.metrics.pending = 0
        self.metrics.pending_since = 0.0

    def _pending(self) -> int:
        return len(self._tokens) + (len(self._failed.tokens) if self._failed is not None else 0)

    def _finish(self, commit: _Commit) -> None:
        try:
            result = commit.future.result()
        except StoreUnavailable as exc:
            self._unavailable(exc)
            self._failed = commit
            return
        # Any other failure ends ingest (and the service): the store is damaged or misused.
        self._acknowledge(commit, result)

    def _unavailable(self, exc: StoreUnavailable) -> None:
        m = self.metrics
        m.store_failures[exc.cause] += 1
        if m.store_error != exc.cause:
            log.warning(
                "checkpoint store unavailable (%s): %s; not acknowledging and not reading until a retry commits",
                exc.cause,
                exc,
            )
        m.store_error = exc.cause
        m.store_error_detail = str(exc)

    async def _recover(self) -> None:
        """Retry the failed batch with capped, jittered exponential backoff until it commits."""
        failed = self._failed
        assert failed is not None
        backoff = Retry(Backoff(initial=RETRY_MIN_S, cap=RETRY_MAX_S))
        began = time.monotonic()

        def retry(store: Store) -> CommitResult:
            assert failed is not None
            return store.commit(failed.reports, failed.counters, failed.senders)

        while True:
            await asyncio.sleep(backoff.next_delay())
            try:
                result = await self.store.call(retry)
            except StoreUnavailable as exc:
                self._unavailable(exc)
                continue
            break
        log.warning(
            "checkpoint store available again after %.1f s (%s); resuming",
            time.monotonic() - began,
            self.metrics.store_error,
        )
        self.metrics.store_error = ""
        self.metrics.store_error_detail = ""
        self._failed = None
        self._acknowledge(failed, result)

    def _acknowledge(self, commit: _Commit, result: CommitResult) -> None:
        # Acknowledge only now: the contribution and the report ids are durable.
        self.transport.ack(commit.tokens)
        for route, receipts in _receipts(commit.requests, result).items():
            self.transport.send_receipts(receipts, route=route)
        m = self.metrics
        m.commits += 1
        m.commit_seconds += result.seconds
        m.observe_commit(seconds=result.seconds, batch=len(commit.reports))
        # Each report's outcome, as its receipt states it (a duplicate of a stored id counts).
        m.use_case_reports.update(_outcomes(commit.reports, result))
        m.reports += result.reports
        m.records += result.records
        m.duplicates += result.duplicates
        if result.expired:
            m.rejected["period-expired"] += result.expired
        if result.over_allowance:
            m.rejected["over-allowance"] += result.over_allowance
        m.last_commit = time.time()
        m.lag_seconds = time.monotonic() - commit.since
        if self.on_commit is not None and result.keys:
            self.on_commit(result)


_REF: Callable[[DecodedReport], str] = operator.attrgetter("use_case.ref")


def _outcomes(reports: Sequence[DecodedReport], result: CommitResult) -> Counter[tuple[str, str]]:
    """How many of a commit's reports each definition has per outcome (``counted``,
    ``period-expired``, ``over-allowance``)."""
    expired, over = result.expired_ids, result.over_allowance_ids
    out: Counter[tuple[str, str]] = Counter()
    if not expired and not over:  # the common commit: everything counted
        for ref, n in Counter(map(_REF, reports)).items():
            out[ref, "counted"] = n
        return out
    for report in reports:
        if report.report_id in expired:
            outcome = "period-expired"
        elif report.report_id in over:
            outcome = "over-allowance"
        else:
            outcome = "counted"
        out[report.use_case.ref, outcome] += 1
    return out


def _receipts(requests: Sequence[_Request], result: CommitResult) -> dict[int, dict[bytes, list[Receipt]]]:
    """The committed outcome of each request, grouped by route (the broker that delivered the
    report), then by response topic (one message each)."""
    out: dict[int, dict[bytes, list[Receipt]]] = {}
    expired, over = result.expired_ids, result.over_allowance_ids
    # The list of the previous request's topic: requests of one connection come in runs.
    last: tuple[int, bytes] | None = None
    receipts: list[Receipt] = []
    for route, topic, correlation, refused, report_id in requests:
        if refused is not None:
            receipt = Receipt(correlation, counted=False, reason=refused)
        elif report_id in expired:
            receipt = Receipt(correlation, counted=False, reason="period-expired")
        elif report_id in over:
            receipt = Receipt(correlation, counted=False, reason="over-allowance")
        else:
            receipt = Receipt(correlation, counted=True)
        if last != (route, topic):
            last = (route, topic)
            receipts = out.setdefault(route, {}).setdefault(topic, [])
        receipts.append(receipt)
    return out
