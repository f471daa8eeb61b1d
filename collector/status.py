"""The collector's status: every use case with its definitions and their periods, and the
store's lifetime counters, as one typed value (:class:`collector.results.CollectorStatus`).

The CLI builds it from the store (:func:`store_status`); the running service from its
materialised view (``collector.live``), to which the HTTP API adds what only a running
service knows (:class:`collector.results.ServiceStatus`).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from collector.config import CollectorConfig
from collector.estimation import open_readonly, period_bounds
from collector.results import (
    CollectorStatus,
    DefinitionStatus,
    PeriodTotals,
    RegistrySource,
    ServiceStatus,
    UseCaseStatus,
)
from collector.store import KeyInfo
from collector.transport import BrokerStatistics
from protocol.catalog import Catalog
from protocol.registry import UseCase

__all__ = ["SERVICE_TIMEOUT_S", "running_brokers", "status_of", "store_status", "with_brokers"]

SERVICE_TIMEOUT_S = 2.0
"""How long ``status`` waits for the running service's ``/healthz`` before leaving the brokers out."""


def _definition_status(catalog: Catalog, uc: UseCase, totals: Sequence[KeyInfo], now: float) -> DefinitionStatus:
    """One definition: what it is, where it comes from, whether it is current or retired, who answers
    for it until when (expired past its end date: its data is kept and shown), its periods."""
    retired = catalog.retired.get(uc.ref)
    meta = uc.metadata
    return DefinitionStatus(
        definition=uc.ref,
        hash=uc.definition.hex(),
        current=catalog.is_current(uc),
        registries=tuple(catalog.sources(uc)),
        retired_from=None if retired is None else retired.isoformat(),
        mechanism=uc.mechanism.name,
        kind=uc.mechanism.kind.result,
        description=uc.description,
        epsilon=uc.epsilon,
        epsilon_report=uc.cost,
        period=uc.period.value,
        daily_limit=uc.daily_limit,
        lifetime_epsilon=uc.lifetime_epsilon,
        min_reports=uc.collector.min_reports,
        release_threshold=uc.collector.release_threshold,
        owner=meta.owner,
        expires=None if meta.expires is None else meta.expires.isoformat(),
        expired=meta.expired(now),
        data_review=meta.data_review,
        notification_emails=meta.notification_emails,
        periods=tuple(
            PeriodTotals(
                period=k.period,
                period_start=period_bounds(uc, k.period)[0],
                reports=k.reports,
                records=k.records,
            )
            for k in totals
            if k.use_case == uc.ref
        ),
    )


def _use_case_status(newest: DefinitionStatus, definitions: Sequence[DefinitionStatus]) -> UseCaseStatus:
    return UseCaseStatus(
        **{name: getattr(newest, name) for name in DefinitionStatus.__struct_fields__},
        in_current_registry=newest.current,
        definitions=tuple(definitions),
    )


def status_of(
    catalog: Catalog,
    totals: Sequence[KeyInfo],
    counters: Mapping[str, int],
    instances: Mapping[str, Mapping[str, int]],
    *,
    store_path: Path | str,
    now: float | None = None,
) -> CollectorStatus:
    """Every use case with its definitions and their periods, and the lifetime counters.

    Per use case name: the fields of its current definition (of its newest one, for a use
    case the current registry no longer has) and ``definitions``, each accepted definition
    with its own periods, current one first. A definition is ``expired`` when its registry's
    end date has passed at ``now`` (default: the time).
    """
    moment = time.time() if now is None else now
    use_cases: dict[str, UseCaseStatus] = {}
    for name in catalog.names():
        definitions = [_definition_status(catalog, uc, totals, moment) for uc in catalog.definitions_of(name)]
        use_cases[name] = _use_case_status(definitions[0], definitions)
    return CollectorStatus(
        registry_hash=catalog.hash_hex,
        registries=tuple(RegistrySource(source=r.source, hash=r.hash_hex) for r in catalog.registries),
        store=str(store_path),
        use_cases=use_cases,
        counters=dict(counters),
        instances={k: dict(v) for k, v in instances.items()},
    )


def store_status(config: CollectorConfig) -> CollectorStatus:
    """:func:`status_of` the store (the CLI's path)."""
    catalog, store = open_readonly(config)
    try:
        totals = store.totals()
        counters = store.counters()
        per_instance = {instance: store.counters(instance) for instance in store.instances()}
        # Damage that landed after the open's check and before the reads is refused too.
        store.check(report_ids=False)
    finally:
        store.close()
    return status_of(catalog, totals, counters, per_instance, store_path=config.store.location)


def running_brokers(config: CollectorConfig, *, timeout: float = SERVICE_TIMEOUT_S) -> tuple[BrokerStatistics, ...]:
    """The broker connections of the service this config runs, from its ``/healthz``.

    Empty when the HTTP API is off, nothing answers on its address, or what answers is
    another collector (its ``instance`` differs): the store's status stands on its own.
    """
    http = config.http
    if not http.enabled or http.port == 0:
        return ()
    host = f"[{http.host}]" if ":" in http.host else http.host
    try:
        with urllib.request.urlopen(f"http://{host}:{http.port}/healthz", timeout=timeout) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:  # 503 while the store is unavailable still lists the brokers
        body = json.loads(exc.read() or b"{}")
    except (OSError, ValueError):
        return ()
    if not isinstance(body, dict) or body.get("instance") != config.instance:
        return ()
    try:
        return msgspec.convert(body.get("brokers", []), tuple[BrokerStatistics, ...])
    except msgspec.ValidationError:
        return ()


def with_brokers(status: CollectorStatus, config: CollectorConfig) -> CollectorStatus:
    """``status`` with the running service's broker connections, when it answers (``ldp-collector status``)."""
    brokers = running_brokers(config)
    if not brokers:
        return status
    return ServiceStatus.of(status, instance=config.instance, brokers=brokers)
