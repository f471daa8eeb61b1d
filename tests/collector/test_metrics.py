"""The Prometheus exposition: one registry per service, read back with prometheus_client's own parser."""

from __future__ import annotations

import importlib.metadata
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collector.metrics import IngestMetrics, _ProcessCollector, metrics_registry, render_prometheus
from collector.transport import TransportStatistics


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _stats(*, receipts_sent: int = 0) -> TransportStatistics:
    return TransportStatistics(
        connected=True,
        connects=1,
        buffered=0,
        capacity=10,
        unacked=0,
        received=0,
        acked=0,
        stale_acks=0,
        dropped=0,
        receipts_sent=receipts_sent,
        broker={"$SYS/broker/clients/connected": 3.0},
    )


def test_two_services_in_one_process_keep_their_own_numbers() -> None:
    """Two registries side by side: each shows its own counters, histograms and info; process metrics in both."""
    a, b = IngestMetrics(), IngestMetrics()
    a.messages, b.messages = 7, 2
    a.rejected["oversize"] = 3
    a.observe_commit(seconds=0.003, batch=40)
    a.observe_commit(seconds=0.2, batch=1)
    a.use_case_reports["usage@2ce04c5c", "counted"] += 40
    a.use_case_reports["usage@2ce04c5c", "period-expired"] += 1
    ra = metrics_registry(a, transport=lambda: _stats(receipts_sent=5), instance="a", registry_hash="ab12")
    rb = metrics_registry(b, transport=lambda: None, instance="b", registry_hash="cd34")
    sa = _samples(generate_latest(ra).decode())
    sb = _samples(generate_latest(rb).decode())
    assert sa["ldp_collector_messages_total", ()] == 7
    assert sb["ldp_collector_messages_total", ()] == 2
    assert sa["ldp_collector_rejected_total", (("reason", "oversize"),)] == 3
    assert sa["ldp_collector_commit_latency_seconds_count", ()] == 2
    assert sa["ldp_collector_commit_latency_seconds_bucket", (("le", "0.005"),)] == 1
    assert sa["ldp_collector_fold_batch_reports_sum", ()] == 41
    assert sb["ldp_collector_fold_batch_reports_count", ()] == 0
    labels = (("definition", "2ce04c5c"), ("outcome", "counted"), ("use_case", "usage"))
    assert sa["ldp_collector_use_case_reports_total", labels] == 40
    assert sa["ldp_collector_receipts_sent_total", ()] == 5
    assert sa["ldp_broker_clients_connected", ()] == 3
    assert ("ldp_collector_broker_connected", ()) not in sb  # no transport, no transport metrics
    version = importlib.metadata.version("ldp-telemetry")
    assert sa["ldp_collector_info", (("instance", "a"), ("registry_hash", "ab12"), ("version", version))] == 1
    for samples in (sa, sb):
        assert ("process_resident_memory_bytes", ()) in samples
        assert any(name == "python_info" for name, _ in samples)


def test_every_family_has_help_and_type() -> None:
    """The text format names each family with HELP and TYPE, the info metric included."""
    text = render_prometheus(IngestMetrics(), _stats(), instance="t")
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    helped = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}
    assert names == helped
    assert {"ldp_collector_info", "ldp_collector_messages_total", "ldp_collector_commit_latency_seconds"} <= names


def test_process_metrics_survive_a_hidden_proc_stat(tmp_path: Path) -> None:
    """With /proc/stat unreadable (the unit's ProcSubset=pid), the process metrics are still there."""
    proc = tmp_path / "proc"
    (proc / "stat").mkdir(parents=True)  # a directory: reading it fails as a hidden file does
    (proc / "self").symlink_to(Path("/proc/self").resolve())
    registry = CollectorRegistry()
    collector = _ProcessCollector(proc=str(proc), registry=registry)
    samples = _samples(generate_latest(registry).decode())
    assert samples["process_resident_memory_bytes", ()] > 0
    assert 0 < samples["process_start_time_seconds", ()] <= time.time()
    assert collector.collect()
