"""Ingest counters and gauges, and their Prometheus text exposition.

Counters start at zero with the process (Prometheus handles resets); the lifetime totals
live in the checkpoint database's ``counters`` table and are shown by ``/api/v1/status``.
Everything here is read and written from the event loop thread only.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from collector.transport import TransportStatistics

__all__ = ["IngestMetrics", "render_prometheus"]


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
    started: float = field(default_factory=time.time)

    def snapshot(self, now: float | None = None) -> dict[str, object]:
        """Plain, JSON-ready values."""
        now = time.time() if now is None else now
        return {
            "messages": self.messages,
            "rejected": dict(sorted(self.rejected.items())),
            "duplicates": self.duplicates,
            "reports": self.reports,
            "records": self.records,
            "commits": self.commits,
            "commit_seconds": round(self.commit_seconds, 6),
            "checkpoint_age_seconds": round(now - self.last_commit, 3) if self.last_commit else None,
            "aggregation_lag_seconds": round(self.current_lag(), 6),
            "buffer_fill": round(self.pending / self.capacity, 6),
            "compactions": self.compactions,
            "pruned": self.pruned,
            "store_available": not self.store_error,
            "store_error": self.store_error_detail or None,
            "store_failures": dict(sorted(self.store_failures.items())),
            "receipt_requests_invalid": self.receipt_requests_invalid,
            "uptime_seconds": round(now - self.started, 3),
        }

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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_prometheus(
    metrics: IngestMetrics,
    transport: TransportStatistics | None,
    *,
    instance: str,
    extra: Mapping[str, float] | None = None,
    now: float | None = None,
) -> str:
    """The Prometheus text exposition format (version 0.0.4)."""
    now = time.time() if now is None else now
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(f"{name}{labels} {value:.17g}" if isinstance(value, float) else f"{name}{labels} {value}")

    metric("ldp_collector_messages_total", "counter", "Messages received from the broker.", [("", metrics.messages)])
    reasons = sorted(metrics.rejected.items())
    metric(
        "ldp_collector_rejected_total",
        "counter",
        "Messages refused, by reason.",
        [(f'{{reason="{_escape(r)}"}}', v) for r, v in reasons],
    )
    metric(
        "ldp_collector_duplicates_total",
        "counter",
        "Valid reports whose report id was already folded.",
        [("", metrics.duplicates)],
    )
    metric("ldp_collector_reports_folded_total", "counter", "Reports folded and committed.", [("", metrics.reports)])
    metric("ldp_collector_records_folded_total", "counter", "Records folded and committed.", [("", metrics.records)])
    metric("ldp_collector_commits_total", "counter", "Checkpoint transactions committed.", [("", metrics.commits)])
    metric(
        "ldp_collector_commit_seconds_total",
        "counter",
        "Time spent in checkpoint transactions.",
        [("", metrics.commit_seconds)],
    )
    metric(
        "ldp_collector_aggregation_lag_seconds",
        "gauge",
        "How long the oldest uncommitted (or last committed) message has waited since receipt.",
        [("", metrics.current_lag())],
    )
    age = now - metrics.last_commit if metrics.last_commit else now - metrics.started
    metric("ldp_collector_checkpoint_age_seconds", "gauge", "Seconds since the last checkpoint commit.", [("", age)])
    metric(
        "ldp_collector_buffer_fill_ratio",
        "gauge",
        "Fill of the shuffle buffer (pending reports / its bound).",
        [("", metrics.pending / metrics.capacity)],
    )
    metric("ldp_collector_buffer_reports", "gauge", "Reports waiting in the shuffle buffer.", [("", metrics.pending)])
    metric(
        "ldp_collector_compactions_total", "counter", "Segment folds into base aggregates.", [("", metrics.compactions)]
    )
    metric("ldp_collector_pruned_ids_total", "counter", "Report ids forgotten after retention.", [("", metrics.pruned)])
    metric(
        "ldp_collector_store_available",
        "gauge",
        "1 while the checkpoint store takes commits; 0 while ingest waits for it (see store failures).",
        [("", int(not metrics.store_error))],
    )
    metric(
        "ldp_collector_store_failures_total",
        "counter",
        "Commit attempts the checkpoint store could not take, by cause.",
        [(f'{{cause="{_escape(c)}"}}', v) for c, v in sorted(metrics.store_failures.items())],
    )
    metric(
        "ldp_collector_sd_notify_dropped_total",
        "counter",
        "Notifications to systemd dropped rather than block the event loop.",
        [("", metrics.sd_notify_dropped)],
    )
    metric(
        "ldp_collector_receipt_requests_invalid_total",
        "counter",
        "Receipt requests ignored (response topic outside the receipt prefix, bad correlation data).",
        [("", metrics.receipt_requests_invalid)],
    )
    if transport is not None:
        metric(
            "ldp_collector_broker_connected",
            "gauge",
            "1 if subscribed to the broker.",
            [("", int(transport.connected))],
        )
        metric("ldp_collector_broker_connects_total", "counter", "Broker connections made.", [("", transport.connects)])
        metric(
            "ldp_collector_transport_buffered",
            "gauge",
            "Messages received and not yet taken by ingest.",
            [("", transport.buffered)],
        )
        metric(
            "ldp_collector_transport_unacked",
            "gauge",
            "QoS 1 messages received and not yet acknowledged.",
            [("", transport.unacked)],
        )
        metric(
            "ldp_collector_transport_capacity",
            "gauge",
            "Most unacknowledged messages the broker may send (Receive Maximum).",
            [("", transport.capacity)],
        )
        metric(
            "ldp_collector_stale_acks_total",
            "counter",
            "Acknowledgements dropped because their connection had ended.",
            [("", transport.stale_acks)],
        )
        metric(
            "ldp_collector_dropped_total",
            "counter",
            "QoS 0 messages dropped on a full buffer.",
            [("", transport.dropped)],
        )
        metric(
            "ldp_collector_transport_protocol_errors_total",
            "counter",
            "Broker connections dropped for invalid MQTT or a broken limit (then reconnected).",
            [("", transport.protocol_errors)],
        )
        metric(
            "ldp_collector_transport_over_receive_maximum_total",
            "counter",
            "QoS 1 messages the broker sent beyond our Receive Maximum.",
            [("", transport.over_receive_maximum)],
        )
        metric(
            "ldp_collector_receipts_sent_total",
            "counter",
            "Commit receipts published (one per answered report).",
            [("", transport.receipts_sent)],
        )
        metric(
            "ldp_collector_receipts_dropped_total",
            "counter",
            "Commit receipts not sent because the broker connection was down (the agent resends).",
            [("", transport.receipts_dropped)],
        )
    if transport is not None and transport.broker:
        # The broker's own counters ($SYS/broker/..., see collector.mqtt.BROKER_COUNTERS): a
        # growing dropped count means reports were lost at the broker (full queues).
        for topic, name, kind, help_text in _BROKER_METRICS:
            if topic in transport.broker:
                metric(name, kind, help_text, [("", transport.broker[topic])])
    for name, value in sorted((extra or {}).items()):
        metric(name, "gauge", name.replace("_", " "), [("", value)])
    lines.append(f'ldp_collector_info{{instance="{_escape(instance)}"}} 1')
    return "\n".join(lines) + "\n"
