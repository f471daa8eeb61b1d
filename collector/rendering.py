"""Estimates and status as text for a person at a terminal (``ldp-collector estimate`` and
``status``): the typed results of :mod:`collector.results`, with every number formatted by
:func:`collector.numbers.format_number` so a reader never miscounts digits."""

from __future__ import annotations

import datetime as dt

from collector.numbers import format_number
from collector.results import (
    CentralGuarantee,
    CollectorStatus,
    DefinitionStatus,
    EstimateResult,
    FitFigures,
    FrequencyEntry,
    HistogramEstimate,
    ReleaseDecision,
    ServiceStatus,
)
from collector.transport import BrokerStatistics

__all__ = ["fit_text", "format_estimate", "format_status"]


def _fmt(x: float | None) -> str:
    return format_number(x)


def format_estimate(result: EstimateResult) -> str:
    """A human-readable rendering of an estimate."""
    head = (
        f"{result.definition} ({result.mechanism}), period {result.period} "
        f"[{result.period_start} .. {result.period_end}): "
        f"{_fmt(result.reports)} reports, {_fmt(result.records)} records"
    )
    lines = [head]
    if result.central is not None:
        lines.append(_central_line(result.central))
    est = result.estimate
    if not result.released or est is None:
        lines.append(f"  not released: {result.withheld_reason}")
        return "\n".join(lines)
    level = f"{100 * result.confidence:g}% CI"
    if isinstance(est, HistogramEstimate):
        lines.append(f"  {'bucket':>24s}  {'share':>10s}  {'SE':>10s}  {'consistent':>10s}")
        for b in est.buckets:
            label = f"[{_fmt(b.low)}, {_fmt(b.high)})"
            lines.append(
                f"  {label:>24s}  {_fmt(b.value):>10s}  {_fmt(b.standard_error):>10s}  {_fmt(b.consistent):>10s}"
            )
    elif isinstance(est, ReleaseDecision):
        lines.extend(_release_lines(est))
    else:
        lines.append(
            f"  {result.kind}: {_fmt(est.value)} ± {_fmt(est.standard_error)} (SE); "
            f"{level} {_fmt(est.ci[0])} .. {_fmt(est.ci[1])}"
        )
        if est.count is not None:
            lines.append(f"  count: {_fmt(est.count.value)} ± {_fmt(est.count.standard_error)} (SE)")
    return "\n".join(lines)


def _central_line(g: CentralGuarantee) -> str:
    # docs/privacy-accounting.md, "The central guarantee": the shuffled batch's (ε, δ) for one
    # record, next to the ε the record costs on the device.
    amplified = "no amplified ε stated" if g.epsilon is None else f"(ε {_fmt(g.epsilon)}, δ {_fmt(g.delta)})"
    line = (
        f"  central guarantee: {amplified} for {g.unit} among {_fmt(g.n)} shuffled reports; "
        f"ε {_fmt(g.epsilon_local)} per record on the device ({g.bound})"
    )
    return line + (f"; {g.note}" if g.note else "")


def _entry_line(item: FrequencyEntry) -> str:
    ci = f"{_fmt(item.ci[0])} .. {_fmt(item.ci[1])}"
    # A released entry's SE is the spread of its conditional interval; one that barely crossed
    # the cutoff is shown by that interval alone (docs/estimation.md, "What is shown").
    se = item.standard_error if item.selection_standard_error is None else item.selection_standard_error
    count, spread = ("near cutoff", "-") if item.near_cutoff else (_fmt(item.count), _fmt(se))
    # The p-value with two significant digits, as the dashboard shows it (collector/dashboard.py).
    p = format_number(item.p_value, 2)
    return f"  {item.value[:40]:40s}  {count:>12s}  {spread:>10s}  {ci:>25s}  {p:>9s}"


def _release_lines(est: ReleaseDecision) -> list[str]:
    lines = [f"  {'value':40s}  {'count':>12s}  {'SE':>10s}  {'CI':>25s}  {'p-value':>9s}"]
    lines.extend(_entry_line(item) for item in est.items)
    if est.items and est.interval:
        # A released entry was read because its estimate crossed the cutoff: its interval
        # is the one that covers among released entries (docs/estimation.md).
        lines.append(f"  (SE and CI: {est.interval})")
    if est.near_cutoff:
        lines.append(f"  ({est.near_cutoff})")
    if est.withheld:
        threshold = _fmt(est.threshold)
        lines.append(f"  ({_fmt(est.withheld)} entries withheld: below the threshold {threshold} or not significant)")
    if est.correction and est.alpha is not None:
        lines.append(f"  ({est.tested} entries tested; {_correction_text(est.correction, est.alpha)})")
    if est.fit is not None:
        lines.append(f"  ({fit_text(est.fit)})")
    if est.withheld_items is not None:
        lines.append(f"  withheld (not released): {len(est.withheld_items)}")
        lines.append(
            f"  {'value':40s}  {'count':>12s}  {'SE':>10s}  {'CI (not conditional)':>25s}  {'p-value':>9s}  reason"
        )
        lines.extend(f"{_entry_line(item)}  {item.withheld_reason}" for item in est.withheld_items)
    return lines


def fit_text(fit: FitFigures) -> str:
    """How much of the reports the fitted entries leave unexplained, in words (docs/estimation.md,
    "RAPPOR: what the candidates do not explain")."""
    share = "unknown" if fit.unexplained_share is None else format_number(100 * fit.unexplained_share, 2) + " %"
    spread = fit.unexplained_share_standard_error
    if spread is not None and fit.unexplained_share is not None:
        share += f" ± {format_number(100 * spread, 2)} %"
    text = f"unexplained: {share} of the reports, by the {_fmt(fit.fitted)} fitted entries"
    if fit.dispersion is not None:
        text += f"; dispersion {format_number(fit.dispersion, 3)}"
    if fit.widened:
        text += f"; {_fmt(fit.widened)} standard errors widened by the residuals"
    return text


def _correction_text(correction: str, alpha: float) -> str:
    # pfer's level counts false releases; the others' is a rate (collector.decoding.stats).
    if correction == "pfer":
        return f"pfer: at most {alpha:g} false releases expected"
    return f"{correction} at alpha = {alpha:g}"


def format_status(status: CollectorStatus) -> str:
    """Every definition with its periods, and the counters (of each collector sharing the store)."""
    lines = [f"registry {status.registry_hash}  store {status.store}"]
    for info in status.use_cases.values():
        for d in info.definitions:
            latest = d.periods[-1] if d.periods else None
            tail = (
                f"latest from {latest.period_start}: {latest.reports:,} reports, {latest.records:,} records"
                if latest
                else "no data"
            )
            count = f"{len(d.periods):,} period{'' if len(d.periods) == 1 else 's'}"
            role = "current" if d.current else "earlier"
            if d.retired_from:
                role += f", retired from {d.retired_from}"
            lines.append(f"  {d.definition:40s} {d.mechanism:13s} {count:<11s} {tail}  ({role}; {_ownership(d)})")
    instances = status.instances
    whose = f" (all of {', '.join(sorted(instances))})" if len(instances) > 1 else ""
    lines.append(f"counters{whose}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(status.counters.items())))
    if len(instances) > 1:
        # A group shares one store: each member's own share, so an idle or stuck member shows.
        lines.extend(
            f"  {instance}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(counters.items()))
            for instance, counters in sorted(instances.items())
        )
    if isinstance(status, ServiceStatus) and status.brokers:
        lines.extend(_broker_line(b) for b in status.brokers)
    return "\n".join(lines)


def _ownership(d: DefinitionStatus) -> str:
    """Who answers for a definition and until when; an expired one says so first (its data is kept)."""
    owner = f"owner {d.owner}" if d.owner else "no owner"
    if d.expires is None:
        return f"{owner}, no end date"
    if d.expired:
        return f"EXPIRED on {d.expires}, agents record nothing more; {owner}"
    return f"{owner}, expires {d.expires}"


def _broker_line(b: BrokerStatistics) -> str:
    state = "connected" if b.connected else "disconnected"
    if b.since is not None:
        when = dt.datetime.fromtimestamp(b.since, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        state += f" since {when}"
    return (
        f"broker {b.address}: {state}; {format_number(b.received)} received, {format_number(b.acked)} acknowledged, "
        f"{format_number(b.receipts_sent)} receipts, {format_number(b.connects)} "
        f"connection{'' if b.connects == 1 else 's'}"
    )
