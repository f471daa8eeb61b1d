"""The collector: MQTT ingest, validation, shuffling, durable aggregates, estimates, HTTP.

One sentence of architecture: :mod:`collector.mqtt` receives QoS 1 messages on a persistent
session and strips them to payloads; :mod:`collector.ingest` decodes them strictly
(``protocol.wire``), drops periods outside the retention window and repeated report ids,
shuffles a bounded buffer and hands it to :mod:`collector.store`, which folds it and records
the report ids in one SQLite transaction, after which the messages are acknowledged;
:mod:`collector.estimation` turns aggregates into estimates with standard errors under the
release rules, served by :mod:`collector.http` (JSON API, dashboard, Prometheus) and
:mod:`collector.cli`. :mod:`collector.service` owns the tasks.
"""

__all__ = [
    "cli",
    "config",
    "dashboard",
    "errors",
    "estimation",
    "folding",
    "http",
    "ingest",
    "metrics",
    "mqtt",
    "service",
    "store",
    "transport",
]
