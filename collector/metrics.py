"""Ingest counters and gauges, and their Prometheus exposition through ``prometheus_client``.

:class:`IngestMetrics` holds what ingest does as plain numbers (the API's ``/api/v1/status``
shows them as JSON) plus two histograms, commit latency and fold batch size. At scrape time a
custom collector (:class:`ServiceCollector`) reads them and the transport's statistics into
metric families, so ingest never formats anything and the values cannot drift between
``/metrics`` and the status document. :func:`metrics_registry` makes one
``CollectorRegistry`` per service (several services may run in one process, in tests and
when embedded) with the process and platform collectors and an info metric.

Counters start at zero with the process (Prometheus handles resets); the lifetime totals
live in the checkpoint database's ``counters`` table and are shown by ``/api/v1/status``.
Everything here is read and written from the event loop thread only.
"""

from __future__ import annotations

import importlib.metadata
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from collector.results import IngestSnapshot
from collector.transport import BrokerStatistics, TransportStatistics
from runtime.resources import ResourceErrors

__all__ = [
    "COMMIT_LATENCY_BUCKETS",
    "FOLD_BATCH_BUCKETS",
    "IngestMetrics",
    "ServiceCollector",
    "metrics_registry",
    "render_prometheus",
]

_log = logging.getLogger("collector.resources")

COMMIT_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds. A commit of a few hundred reports takes milliseconds on SQLite; the top buckets
catch a store that is slowing down (a full WAL, a busy PostgreSQL) before it fails."""

FOLD_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 4000, 10_000, 50_000)
"""Reports per commit, up to the shuffle buffer's bound (``ingest.commit_max_reports``, 4000
by default; at most 2^20). A batch that stays at 1 under load means commits outpace arrivals."""


def _commit_latency() -> Histogram:
    # registry=None: the histogram belongs to this IngestMetrics, and reaches a registry only
    # through the ServiceCollector, so two services in one process never share one.
    return Histogram(
        "ldp_collector_commit_latency_seconds",
        "Time each checkpoint transaction took.",
        buckets=COMMIT_LATENCY_BUCKETS,
        registry=None,
    )


def _fold_batch() -> Histogram:
    return Histogram(
        "ldp_collector_fold_batch_reports",
        "Reports handed to each checkpoint transaction (folded, duplicate or refused there).",
        buckets=FOLD_BATCH_BUCKETS,
        registry=None,
    )


@dataclass
class IngestMetrics:
    """What ingest has done since the process started.

    Attributes:
        messages: messages received from the broker.
        rejected: messages refused, by reason (``oversize``, ``registry-mismatch``,
            ``period-expired``, ...).
        duplicates: valid reports whose id was already folded (redeliveries, replays).
        reports: reports folded and committed.
        records: records in those reports.
        commits: checkpoint transactions.
        commit_seconds: total time spent in them.
        last_commit: wall-clock time of the last commit (0 before the first).
        lag_seconds: at the last commit, how long its oldest message had waited since receipt.
        pending: reports waiting in the shuffle buffer for the next commit.
        pending_since: monotonic receipt time of the oldest of them (0 if none).
        capacity: the shuffle buffer's bound (``ingest.commit_max_reports``).
        compactions: segment folds into base aggregates.
        pruned: report ids forgotten after their period left the retention window.
        store_error: the cause (``disk-full``, ``locked``, ...) while the checkpoint store cannot
            take commits, ``""`` while it can.
        store_error_detail: its message, naming the database file.
        store_failures: failed commit attempts, by cause.
        sd_notify_dropped: notifications to systemd dropped because they could not be sent
            without blocking (``runtime.sd_notify``).
        receipt_requests_invalid: receipt requests ignored (a response topic outside
            ``mqtt.receipt_prefix``, or missing or oversize Correlation Data).
        receipt_requests_refused: well-formed receipt requests refused because the response
            topic is not the sender's own (docs/wire-format.md, "Commit receipts"), by reason:
            ``other-identity`` (under another identity's receipt prefix) or
            ``previous-layout`` (``<receipt_prefix><client id>``, as agents of 0.1.0 ask).
        use_case_reports: reports settled by a commit, by (definition ref, outcome): ``counted``
            (folded now, or already folded by an earlier delivery), ``period-expired`` or
            ``over-allowance`` - what the report's receipt says.
        resources: the service's operations that failed for want of a system resource (a
            connection to the broker, an accepted HTTP connection), by operation and errno;
            each was retried (:mod:`runtime.resources`).
        commit_latency: a histogram of each commit's duration.
        fold_batch: a histogram of the reports handed to each commit.
    """

    messages: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    reports: int = 0
    records: int = 0
    commits: int = 0
    commit_seconds: float = 0.0
    last_commit: float = 0.0
    lag_seconds: float = 0.0
    pending: int = 0
    pending_since: float = 0.0
    capacity: int = 1
    compactions: int = 0
    pruned: int = 0
    sd_notify_dropped: int = 0
    store_error: str = ""
    store_error_detail: str = ""
    store_failures: Counter[str] = field(default_factory=Counter)
    receipt_requests_invalid: int = 0
    receipt_requests_refused: Counter[str] = field(default_factory=Counter)
    use_case_reports: Counter[tuple[str, str]] = field(default_factory=Counter)
    resources: ResourceErrors = field(default_factory=lambda: ResourceErrors(_log), repr=False, compare=False)
    started: float = field(default_factory=time.time)
    commit_latency: Histogram = field(default_factory=_commit_latency, repr=False, compare=False)
    fold_batch: Histogram = field(default_factory=_fold_batch, repr=False, compare=False)

    def observe_commit(self, *, seconds: float, batch: int) -> None:
        """Record one commit's duration and the number of reports it was handed."""
        self.commit_latency.observe(seconds)
        self.fold_batch.observe(batch)

    def snapshot(self, now: float | None = None) -> IngestSnapshot:
        """The counters now, rounded as a person reads them."""
        now = time.time() if now is None else now
        return IngestSnapshot(
            messages=self.messages,
            rejected=dict(sorted(self.rejected.items())),
            duplicates=self.duplicates,
            reports=self.reports,
            records=self.records,
            commits=self.commits,
            commit_seconds=round(self.commit_seconds, 6),
            checkpoint_age_seconds=round(now - self.last_commit, 3) if self.last_commit else None,
            aggregation_lag_seconds=round(self.current_lag(), 6),
            buffer_fill=round(self.pending / self.capacity, 6),
            compactions=self.compactions,
            pruned=self.pruned,
            store_available=not self.store_error,
            store_error=self.store_error_detail or None,
            store_failures=dict(sorted(self.store_failures.items())),
            receipt_requests_invalid=self.receipt_requests_invalid,
            uptime_seconds=round(now - self.started, 3),
        )

    def current_lag(self) -> float:
        """The larger of the last commit's lag and the age of the oldest pending report."""
        waiting = time.monotonic() - self.pending_since if self.pending_since else 0.0
        return max(self.lag_seconds, waiting)


_BROKER_METRICS: tuple[tuple[str, str, str, str], ...] = (
    (
        "$SYS/broker/publish/messages/dropped",
        "ldp_broker_messages_dropped_total",
        "counter",
        "Messages the broker dropped (full client queues) since it started ($SYS).",
    ),
    (
        "$SYS/broker/store/messages/count",
        "ldp_broker_stored_messages",
        "gauge",
        "Messages the broker holds: queued for clients, retained, in flight ($SYS).",
    ),
    (
        "$SYS/broker/store/messages/bytes",
        "ldp_broker_stored_bytes",
        "gauge",
        "Payload bytes the broker holds ($SYS).",
    ),
    ("$SYS/broker/clients/connected", "ldp_broker_clients_connected", "gauge", "Clients connected ($SYS)."),
)


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _labelled(name: str, help_text: str, label: str, values: Mapping[str, float]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class ServiceCollector(Collector):
    """The ingest metrics and the transport's statistics, read at each scrape.

    Args:
        metrics: ingest's numbers.
        transport: returns the transport's statistics, or None (a read-only API has no transport).
    """

    def __init__(self, metrics: IngestMetrics, transport: Callable[[], TransportStatistics | None]) -> None:
        self._metrics = metrics
        self._transport = transport

    def collect(self) -> Iterable[Metric]:
        """The metric families, from the values as they are now."""
        m = self._metrics
        now = time.time()
        yield _counter("ldp_collector_messages_total", "Messages received from the broker.", m.messages)
        yield _labelled("ldp_collector_rejected_total", "Messages refused, by reason.", "reason", m.rejected)
        yield _counter(
            "ldp_collector_duplicates_total", "Valid reports whose report id was already folded.", m.duplicates
        )
        yield _counter("ldp_collector_reports_folded_total", "Reports folded and committed.", m.reports)
        yield _counter("ldp_collector_records_folded_total", "Records folded and committed.", m.records)
        by_use_case = CounterMetricFamily(
            "ldp_collector_use_case_reports_total",
            "Reports settled by a commit, by use case, definition (the first 8 hex digits of its hash) and "
            "outcome (counted, or the reason it was refused).",
            labels=["use_case", "definition", "outcome"],
        )
        for (ref, outcome), value in sorted(m.use_case_reports.items()):
            name, _, definition = ref.partition("@")
            by_use_case.add_metric([name, definition, outcome], value)
        yield by_use_case
        yield _counter("ldp_collector_commits_total", "Checkpoint transactions committed.", m.commits)
        yield _counter("ldp_collector_commit_seconds_total", "Time spent in checkpoint transactions.", m.commit_seconds)
        yield from m.commit_latency.collect()
        yield from m.fold_batch.collect()
        yield _gauge(
            "ldp_collector_aggregation_lag_seconds",
            "How long the oldest uncommitted (or last committed) message has waited since receipt.",
            m.current_lag(),
        )
        age = now - m.last_commit if m.last_commit else now - m.started
        yield _gauge("ldp_collector_checkpoint_age_seconds", "Seconds since the last checkpoint commit.", age)
        yield _gauge(
            "ldp_collector_buffer_fill_ratio",
            "Fill of the shuffle buffer (pending reports / its bound).",
            m.pending / m.capacity,
        )
        yield _gauge("ldp_collector_buffer_reports", "Reports waiting in the shuffle buffer.", m.pending)
        yield _counter("ldp_collector_compactions_total", "Segment folds into base aggregates.", m.compactions)
        yield _counter("ldp_collector_pruned_ids_total", "Report ids forgotten after retention.", m.pruned)
        yield _gauge(
            "ldp_collector_store_available",
            "1 while the checkpoint store takes commits; 0 while ingest waits for it (see store failures).",
            int(not m.store_error),
        )
        yield _labelled(
            "ldp_collector_store_failures_total",
            "Commit attempts the checkpoint store could not take, by cause.",
            "cause",
            m.store_failures,
        )
        yield _counter(
            "ldp_collector_sd_notify_dropped_total",
            "Notifications to systemd dropped rather than block the event loop.",
            m.sd_notify_dropped,
        )
        yield _counter(
            "ldp_collector_receipt_requests_invalid_total",
            "Receipt requests ignored (response topic outside the receipt prefix, bad correlation data).",
            m.receipt_requests_invalid,
        )
        yield _labelled(
            "ldp_collector_receipt_requests_refused_total",
            "Receipt requests refused because the response topic is not the sender's own, by reason.",
            "reason",
            m.receipt_requests_refused,
        )
        resources = CounterMetricFamily(
            "ldp_collector_resource_errors_total",
            "Operations that failed for want of a system resource and were retried, by operation "
            "(mqtt-connect, mqtt-session, http-accept) and errno (EMFILE, ENFILE, ENOMEM, ENOBUFS).",
            labels=["operation", "errno"],
        )
        for (operation, name), value in sorted(m.resources.counts.items()):
            resources.add_metric([operation, name], value)
        yield resources
        transport = self._transport()
        if transport is not None:
            yield from _transport_families(transport)

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: the families depend on the transport (the registry then skips the name check)."""
        return []


def _transport_families(t: TransportStatistics) -> Iterable[Metric]:
    yield _gauge("ldp_collector_broker_connected", "1 if subscribed to the broker.", int(t.connected))
    yield _counter("ldp_collector_broker_connects_total", "Broker connections made.", t.connects)
    yield _gauge("ldp_collector_transport_buffered", "Messages received and not yet taken by ingest.", t.buffered)
    yield _gauge("ldp_collector_transport_unacked", "QoS 1 messages received and not yet acknowledged.", t.unacked)
    yield _gauge(
        "ldp_collector_transport_capacity",
        "Most unacknowledged messages the broker may send (Receive Maximum).",
        t.capacity,
    )
    yield _counter(
        "ldp_collector_stale_acks_total", "Acknowledgements dropped because their connection had ended.", t.stale_acks
    )
    yield _counter("ldp_collector_dropped_total", "QoS 0 messages dropped on a full buffer.", t.dropped)
    yield _counter(
        "ldp_collector_transport_protocol_errors_total",
        "Broker connections dropped for invalid MQTT or a broken limit (then reconnected).",
        t.protocol_errors,
    )
    yield _counter(
        "ldp_collector_transport_over_receive_maximum_total",
        "QoS 1 messages the broker sent beyond our Receive Maximum.",
        t.over_receive_maximum,
    )
    yield _counter(
        "ldp_collector_receipts_sent_total", "Commit receipts published (one per answered report).", t.receipts_sent
    )
    yield _counter(
        "ldp_collector_receipts_dropped_total",
        "Commit receipts not sent because the broker connection was down (the agent resends).",
        t.receipts_dropped,
    )
    yield from _broker_families(t.brokers)
    # The broker's own counters ($SYS/broker/..., see collector.mqtt.BROKER_COUNTERS): a
    # growing dropped count means reports were lost at the broker (full queues).
    for topic, name, kind, help_text in _BROKER_METRICS:
        if topic in t.broker:
            value = t.broker[topic]
            yield _counter(name, help_text, value) if kind == "counter" else _gauge(name, help_text, value)


def _broker_families(brokers: Sequence[BrokerStatistics]) -> Iterable[Metric]:
    """Each broker's session, labelled ``broker="host:port"`` (the unlabelled families above
    are the sums; ``ldp_collector_broker_connected`` is 1 only while every broker is)."""
    if not brokers:
        return
    families = (
        (GaugeMetricFamily, "ldp_collector_broker_session_connected", "1 if subscribed to this broker.", "connected"),
        (CounterMetricFamily, "ldp_collector_broker_session_connects", "Connections made to this broker.", "connects"),
        (
            CounterMetricFamily,
            "ldp_collector_broker_session_received",
            "Messages received from this broker.",
            "received",
        ),
        (CounterMetricFamily, "ldp_collector_broker_session_acked", "Acknowledgements sent to this broker.", "acked"),
        (
            CounterMetricFamily,
            "ldp_collector_broker_session_receipts_sent",
            "Commit receipts published through this broker.",
            "receipts_sent",
        ),
    )
    for kind, name, help_text, attribute in families:
        family = kind(name, help_text, labels=["broker"])
        for b in brokers:
            family.add_metric([b.address], float(getattr(b, attribute)))
        yield family
    since = GaugeMetricFamily(
        "ldp_collector_broker_session_since_seconds",
        "When this broker's session last came up or went down (Unix time).",
        labels=["broker"],
    )
    for b in brokers:
        if b.since is not None:
            since.add_metric([b.address], b.since)
    yield since


class _ProcessCollector(ProcessCollector):
    """prometheus_client's process metrics, also under the unit's ``ProcSubset=pid``.

    The library reads the boot time from ``/proc/stat``, which ``ProcSubset=pid`` hides;
    without it the collector reports nothing at all (seen in tests/deploy/test_container.py).
    The boot time is also the wall clock minus ``CLOCK_BOOTTIME``, which any process can read;
    ``/proc/self`` (memory, CPU, open files) stays visible under that sandbox.
    """

    def _boot_time(self) -> float:
        try:
            return float(super()._boot_time())  # type: ignore[no-untyped-call]
        except OSError:
            return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def _version() -> str:
    try:
        return importlib.metadata.version("ldp-telemetry")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def metrics_registry(
    metrics: IngestMetrics,
    *,
    transport: Callable[[], TransportStatistics | None],
    instance: str,
    registry_hash: str = "",
    process: bool = True,
) -> CollectorRegistry:
    """One service's Prometheus registry.

    Args:
        metrics: the service's ingest metrics (read at each scrape).
        transport: returns the transport's statistics at each scrape (or None).
        instance: the collector's instance name (``instance`` in the config).
        registry_hash: the canonical hash of the use-case registry in force.
        process: add the process, platform and garbage-collector collectors (CPU, memory,
            open files, Python version); off for a rendering of the ingest numbers alone.
    """
    registry = CollectorRegistry()
    registry.register(ServiceCollector(metrics, transport))
    Info("ldp_collector", "The collector: its instance, use-case registry and version.", registry=registry).info(
        {"instance": instance, "registry_hash": registry_hash, "version": _version()}
    )
    if process:
        _ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        # The garbage collector's counters are process-wide; the module's own instance reads them.
        registry.register(GC_COLLECTOR)
    return registry


def render_prometheus(
    metrics: IngestMetrics,
    transport: TransportStatistics | None,
    *,
    instance: str,
) -> str:
    """The ingest and transport metrics in the Prometheus text format (a one-off registry)."""
    registry = metrics_registry(metrics, transport=lambda: transport, instance=instance, process=False)
    return generate_latest(registry).decode()
