"""The collector service: one root task group owning transport, ingest, maintenance, the
materialised aggregates (``collector.live``) and HTTP.

Start-up fails fast: a bad config or registry raises before anything connects. Every
long-lived task has a name and an owner (the root ``asyncio.TaskGroup``); an unexpected
exception in any of them ends the group and the process exits non-zero, so systemd restarts
it and the broker redelivers whatever was not acknowledged. ``SIGTERM`` stops cleanly:
ingest commits and acknowledges what it holds, then the MQTT session is closed with a
DISCONNECT (the session, and messages queued while we are down, stay on the broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from collector.config import CollectorConfig
from collector.definitions import load_catalog, load_registry
from collector.errors import ConfigError, StoreUnavailable, TransportError
from collector.http import serve_http
from collector.ingest import Ingest, StoreThread
from collector.live import LiveAggregates
from collector.metrics import IngestMetrics, metrics_registry
from collector.mqtt import READ_PAUSE_S, BrokerSet
from collector.store import Store, open_store
from protocol.catalog import Catalog, catalog_of
from protocol.registry import Registry
from runtime.clock import SystemClock, WallClock
from runtime.resources import ResourceShortageError
from runtime.sd_notify import Notifier

__all__ = ["MAINTENANCE_INTERVAL_S", "Service", "check_size_caps", "load_catalog", "load_registry", "run_service"]

log = logging.getLogger(__name__)

MAINTENANCE_INTERVAL_S = 5.0
"""How often retention pruning and compaction run."""


MQTT_FRAMING_BYTES = 1024
"""Room a PUBLISH packet needs beyond its payload: fixed header, topic
(``ldp/v1/reports/<name of up to 64 characters>``), packet id and MQTT 5 properties."""


def check_size_caps(config: CollectorConfig, catalog: Catalog | Registry) -> None:
    """Refuse a configuration that would reject reports any accepted definition allows.

    Raises:
        ConfigError: naming the config field, the use case and the figures.
    """
    catalog = catalog_of(catalog)
    largest = max(catalog.use_cases.values(), key=lambda uc: uc.max_report_bytes)
    need = largest.max_report_bytes
    if config.ingest.max_report_bytes < need:
        raise ConfigError(
            config.source,
            "ingest.max_report_bytes",
            f"{config.ingest.max_report_bytes:,} is below the {need:,} bytes of use case {largest.name!r}'s "
            f"largest report in {catalog.sources(largest)[0]}; raise it to at least {need:,}",
        )
    if config.mqtt.max_packet_bytes < config.ingest.max_report_bytes + MQTT_FRAMING_BYTES:
        raise ConfigError(
            config.source,
            "mqtt.max_packet_bytes",
            f"{config.mqtt.max_packet_bytes:,} cannot carry a {config.ingest.max_report_bytes:,}-byte report "
            f"(ingest.max_report_bytes) and its MQTT framing; raise it to at least "
            f"{config.ingest.max_report_bytes + MQTT_FRAMING_BYTES:,}",
        )


@dataclass
class Service:
    """The running parts, for the HTTP layer (a ``collector.http.ServiceView``) and tests.

    ``prometheus`` is this service's own registry: several services may run in one process.
    """

    config: CollectorConfig
    catalog: Catalog
    store: StoreThread[Store]
    metrics: IngestMetrics
    transport: BrokerSet
    ingest: Ingest
    live: LiveAggregates
    notifier: Notifier
    prometheus: CollectorRegistry


async def _maintenance(service: Service, clock: WallClock) -> None:
    """Retention (low-water marks, report-id pruning) and compaction, periodically."""
    while True:
        try:
            await _maintain(service, clock)
        except StoreUnavailable as exc:
            # Ingest reports the store's state (healthz, metrics, log); pruning and compaction
            # simply wait for the next round.
            log.debug("maintenance skipped: %s", exc)
        await asyncio.sleep(MAINTENANCE_INTERVAL_S)


async def _maintain(service: Service, clock: WallClock) -> None:
    """One round of retention and compaction."""
    cfg = service.config
    now = clock.time()
    marks = {
        ref: max(uc.period.index_at(now) - cfg.ingest.retention_periods + 1, 0)
        for ref, uc in service.catalog.use_cases.items()
    }
    # Raise the marks in ingest first: from now on it refuses those periods, so the ids
    # pruned next can never be needed again.
    service.ingest.raise_low_water(marks)
    service.metrics.pruned += await service.store.call(lambda s: s.prune(marks))
    keys = await service.store.call(lambda s: s.compaction_candidates(cfg.store.compact_after))
    for use_case, period in keys:
        folded = await service.store.call(functools.partial(_compact, use_case=use_case, period=period))
        if folded:
            service.metrics.compactions += 1


async def _check_store(service: Service) -> None:
    """The whole store checked as at start, every ``store.check_interval_s``: damage found
    raises :class:`~collector.errors.StoreDamaged`, which ends the service (exit 10) before it
    acknowledges another report; a store that cannot be read now waits for the next round."""
    while True:
        await asyncio.sleep(service.config.store.check_interval_s)
        try:
            await service.live.check()
        except StoreUnavailable as exc:
            log.warning("store check skipped: %s", exc)


def _broker_set(config: CollectorConfig, metrics: IngestMetrics) -> BrokerSet:
    """One session per broker, each with its TLS context built now, once (a reconnect opens no file).

    Raises:
        ConfigError: a TLS file or the password file cannot be used.
        TransportError: a file could not be read for want of a system resource (exit 1:
            systemd starts the service again; not the configuration's fault).
    """
    try:
        # The read pause (collector.mqtt.READ_PAUSE_S) stays well inside the commit interval.
        return BrokerSet(
            config.mqtt,
            read_pause_s=min(READ_PAUSE_S, config.ingest.commit_interval_s / 4),
            resources=metrics.resources,
        )
    except ResourceShortageError as exc:
        raise TransportError(f"cannot start the broker sessions: {exc} (a system resource ran out)") from exc


def _count_dropped(metrics: IngestMetrics, notifier: Notifier) -> None:
    metrics.sd_notify_dropped = notifier.dropped


def _compact(store: Store, *, use_case: str, period: int) -> int:
    return store.compact(use_case, period)


async def run_service(
    config: CollectorConfig,
    *,
    clock: WallClock | None = None,
    stop: asyncio.Event | None = None,
    http_starter: Callable[[Service], Coroutine[Any, Any, None]] | None = None,
    on_ready: Callable[[Service], None] | None = None,
) -> None:
    """Run the collector until ``stop`` is set (or SIGTERM / SIGINT arrive).

    Args:
        config: the decoded configuration.
        clock: the wall clock (tests fix it).
        stop: set it to stop cleanly; created (and wired to SIGTERM/SIGINT) if None.
        http_starter: serves the HTTP API for the running service (None: ``collector.http``
            when ``http.enabled``).
        on_ready: called once the broker has granted the subscription (tests, embedding).

    Raises:
        ConfigError: a registry file cannot be loaded.
        collector.errors.StoreError: the checkpoint database cannot be used.
        collector.errors.TransportError: the broker refused us for good.
    """
    clock = clock or SystemClock()
    catalog = load_catalog(config)
    check_size_caps(config, catalog)
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    # Every resource is closed whatever fails, the last opened first: the aggregates' reader,
    # then the store, then the notifier (docs/design.md, convention 14).
    async with contextlib.AsyncExitStack() as resources:
        service = await _open(config, catalog, clock, resources)
        if http_starter is None and config.http.enabled:
            http_starter = serve_http
        log.info(
            "collector %s: registry %s (%s; %d definitions from %d files), store %s, broker %s",
            config.instance,
            config.registry,
            catalog.hash_hex,
            len(catalog.use_cases),
            len(catalog.registries),
            config.store.location,
            ", ".join(s.address for s in service.transport.sessions),
        )
        await _run_tasks(service, clock, stop, http_starter, on_ready)


async def _open(
    config: CollectorConfig, catalog: Catalog, clock: WallClock, resources: contextlib.AsyncExitStack
) -> Service:
    """Open the service's parts, each closed by ``resources`` when the service ends."""
    notifier = resources.enter_context(contextlib.closing(Notifier()))
    store = await resources.enter_async_context(StoreThread(lambda: open_store(config, catalog)))
    low_water = await store.call(lambda s: s.low_water())
    metrics = IngestMetrics()
    # One session per broker (mqtt.addresses), all feeding this one ingest.
    transport = _broker_set(config, metrics)
    ingest = Ingest(
        catalog=catalog,
        transport=transport,
        store=store,
        config=config.ingest,
        metrics=metrics,
        clock=clock,
        low_water=low_water,
        receipt_prefix=config.mqtt.receipt_prefix,
    )
    # Opened after the store thread has created the database and registered the use cases.
    live = await resources.enter_async_context(LiveAggregates(config, catalog))
    ingest.on_commit = lambda result: live.committed(result.keys)
    prometheus = metrics_registry(
        metrics, transport=transport.statistics, instance=config.instance, registry_hash=catalog.hash_hex
    )
    return Service(config, catalog, store, metrics, transport, ingest, live, notifier, prometheus)


async def _run_tasks(
    service: Service,
    clock: WallClock,
    stop: asyncio.Event,
    http_starter: Callable[[Service], Coroutine[Any, Any, None]] | None,
    on_ready: Callable[[Service], None] | None,
) -> None:
    """Run the service's tasks until ``stop`` is set; then commit what is buffered and end them."""
    async with asyncio.TaskGroup() as tg:
        t_transport = tg.create_task(service.transport.run(), name="mqtt")
        t_ingest = tg.create_task(service.ingest.run(), name="ingest")
        t_maintenance = tg.create_task(_maintenance(service, clock), name="maintenance")
        t_live = tg.create_task(service.live.run(), name="materialise")
        t_check = tg.create_task(_check_store(service), name="store-check")
        # Its own task, not part of maintenance: a failing store must not stop the pings.
        t_watchdog = (
            tg.create_task(
                service.notifier.run_watchdog(lambda: _count_dropped(service.metrics, service.notifier)),
                name="watchdog",
            )
            if service.notifier.enabled and service.notifier.watchdog_interval is not None
            else None
        )
        t_http = tg.create_task(http_starter(service), name="http") if http_starter else None

        async def ready() -> None:
            # Serving once any broker has granted the subscription: a broker that is down at
            # start must not hold the unit in "activating" (docs/deploy.md, "Several brokers").
            await service.transport.wait_serving()
            service.notifier.notify("READY=1")
            await service.transport.wait_subscribed()
            if on_ready is not None:
                on_ready(service)

        t_ready = tg.create_task(ready(), name="ready")
        await stop.wait()
        service.notifier.notify("STOPPING=1")
        log.info("stopping: committing buffered reports")
        t_ingest.cancel()
        await asyncio.wait({t_ingest})
        await service.transport.close()
        for task in (t_transport, t_maintenance, t_live, t_check, t_watchdog, t_http, t_ready):
            if task is not None:
                task.cancel()
