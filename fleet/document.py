"""The results of a fleet run, as one typed document (``--json``, ``--output``), and the
sentences said about what was not sent or not counted.

The document holds the run's configuration, its timing, what the receipts said, the ε audit,
and per use-case definition the truth of every period and (with a collector) the comparison
of every estimate with it (:class:`fleet.report.UseCaseSummary`). It is built once here and
written as JSON by :func:`collector.results.to_json` (numbers that are not finite become
``null``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import msgspec

from fleet.plan import SLOT_SECONDS, FleetPlan
from fleet.report import UseCaseSummary
from fleet.tally import ShardResult, Tally, tally_kind
from fleet.values import GeneratorError, load_population
from protocol.catalog import Catalog
from protocol.registry import Registry, UseCase

__all__ = [
    "FleetResults",
    "Truth",
    "UnusedRows",
    "build_document",
    "dropped_lines",
    "labels_of",
    "receipt_lines",
    "simulated_refs",
    "truth_of",
    "undelivered",
    "unused_series_rows",
]


class Truth(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the reporting devices held in one period: the mean (proportions and means), the
    share per bucket (histograms), or the count per value, largest first (frequencies)."""

    reports: int
    mean: float | None = None
    shares: tuple[float, ...] | None = None
    counts: dict[str, int] | None = None


class UnusedRows(msgspec.Struct, frozen=True):
    """Rows of a replayed time series the plan does not reach."""

    past_days: int
    past_devices: int


class RegistryChangeConfig(msgspec.Struct, frozen=True):
    """The second registry half the fleet moves to, and the day it does."""

    registry: str
    registry_hash: str
    at_day: int


class RunConfig(msgspec.Struct, frozen=True):
    """What was simulated."""

    devices: int
    days: int
    start: str
    seed: int
    registry: str
    registry_hash: str
    registry_change: RegistryChangeConfig | None
    workers: int
    generators: dict[str, str]
    populations: dict[str, str]


class Timing(msgspec.Struct, frozen=True):
    """How long the run took, and how many reports the broker acknowledged."""

    simulate_seconds: float | None
    setup_seconds: float
    ingest_wait_seconds: float | None
    reports: int
    retries: int


class Receipts(msgspec.Struct, frozen=True):
    """What the collector's commit receipts said of the fleet's reports, per definition."""

    counted: int
    missing: int
    by_definition: dict[str, dict[str, int]]


class EpsilonAudit(msgspec.Struct, frozen=True):
    """The (device, use case) ledgers audited at the end, and what the audit found."""

    checked: int
    problems: tuple[str, ...]


class UseCaseResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """One use-case definition: what it is, its truth per period, and (with a collector) the
    comparison of its estimates with the truth."""

    definition: str
    current: bool
    mechanism: str
    epsilon_per_report: float
    period: str
    truth: dict[str, Truth]
    comparison: UseCaseSummary | None = None


class FleetResults(msgspec.Struct, frozen=True):
    """The whole run. ``ok`` is ``None`` when no collector was compared."""

    ok: bool | None
    tolerance_se: float
    config: RunConfig
    timing: Timing
    receipts: Receipts | None
    epsilon_audit: EpsilonAudit
    unsent: dict[str, int]
    refused: dict[str, int]
    unused_population_rows: dict[str, UnusedRows]
    use_cases: dict[str, UseCaseResult]


def truth_of(use_case: UseCase, tally: Tally) -> Truth:
    """The truth of one period, by the kind of estimate the use case has."""
    kind = tally_kind(use_case)
    if kind == "mean":
        return Truth(reports=tally.n, mean=tally.total / tally.n if tally.n else None)
    if kind == "histogram":
        return Truth(reports=tally.n, shares=tuple(b / tally.n for b in tally.buckets) if tally.n else ())
    return Truth(reports=tally.n, counts=dict(sorted(tally.counts.items(), key=lambda kv: -kv[1])))


def labels_of(catalog: Catalog, refs: Sequence[str]) -> dict[str, str]:
    """How the results name each definition: its use case's name, or its ref where the
    simulation reported under several definitions of that use case."""
    names = [catalog.use_cases[r].name for r in refs]
    return {r: r if names.count(catalog.use_cases[r].name) > 1 else catalog.use_cases[r].name for r in refs}


def simulated_refs(plan: FleetPlan, catalog: Catalog, result: ShardResult) -> list[str]:
    """The definitions with a truth, in the catalog's order (the current registry's first)."""
    return [
        ref
        for ref, uc in catalog.use_cases.items()
        if uc.name in plan.use_cases and (ref in result.truth or ref in result.outcomes)
    ]


def receipt_lines(result: ShardResult, labels: dict[str, str]) -> list[str]:
    """What the collector's receipts said of the fleet's own reports, per definition."""
    total = sum(sum(said.values()) for said in result.outcomes.values())
    lines = [
        f"receipts: {result.counted:,} of the fleet's {total + result.missing:,} reports counted"
        + (f", {result.missing:,} without a receipt" if result.missing else "")
    ]
    for ref, said in result.outcomes.items():
        refused = {k: v for k, v in said.items() if k != "counted"}
        if refused:
            parts = ", ".join(f"{v:,} {k}" for k, v in sorted(refused.items()))
            lines.append(f"  {labels.get(ref, ref)}: {said.get('counted', 0):,} counted, {parts}")
    return lines


def undelivered(result: ShardResult) -> str | None:
    """Why the fleet's reports were not all counted (None when they were, or were refused only as retired).

    The count is of the fleet's own reports, by their receipts (or the broker's refusal), never
    the collector's per-period totals, which other devices' reports may fill.
    """
    unexpected: dict[str, int] = {}
    for said in result.outcomes.values():
        for status, n in said.items():
            if status not in ("counted", "refused: retired"):
                unexpected[status] = unexpected.get(status, 0) + n
    if not result.missing and not unexpected:
        return None
    total = sum(sum(said.values()) for said in result.outcomes.values()) + result.missing
    why = []
    if result.missing:
        why.append(f"{result.missing:,} without a commit receipt (the collector did not count them in time)")
    why += [f"{n:,} {status}" for status, n in sorted(unexpected.items())]
    return f"{result.counted:,} of the fleet's {total:,} reports counted; " + ", ".join(why)


def _run_config(plan: FleetPlan, registry: Registry, workers: int) -> RunConfig:
    change = plan.change
    return RunConfig(
        devices=plan.devices,
        days=plan.days,
        start=dt.datetime.fromtimestamp(plan.start, dt.UTC).isoformat().replace("+00:00", "Z"),
        seed=plan.seed,
        registry=plan.registry_path,
        registry_hash=registry.hash_hex,
        registry_change=None
        if change is None
        else RegistryChangeConfig(
            registry=change.registry_path,
            registry_hash=change.registry().hash_hex,
            at_day=change.at_slot * SLOT_SECONDS // 86_400 + 1,
        ),
        workers=workers,
        generators={n: str(s) for n, s in plan.generators.items()},
        populations=dict(plan.populations),
    )


def build_document(
    plan: FleetPlan,
    registry: Registry,
    catalog: Catalog,
    result: ShardResult,
    *,
    ok: bool | None,
    tolerance: float,
    workers: int,
    labels: dict[str, str],
    refs: Sequence[str],
    summaries: Sequence[UseCaseSummary],
    timing: tuple[float | None, float | None],
    unused_rows: dict[str, UnusedRows],
) -> FleetResults:
    """The results document of a run (``timing``: seconds simulating, seconds waiting for ingest)."""
    compared = {s.definition: s for s in summaries}
    return FleetResults(
        ok=ok,
        tolerance_se=tolerance,
        config=_run_config(plan, registry, workers),
        timing=Timing(
            simulate_seconds=timing[0],
            setup_seconds=result.setup_seconds,
            ingest_wait_seconds=timing[1],
            reports=result.messages,
            retries=result.retries,
        ),
        receipts=Receipts(counted=result.counted, missing=result.missing, by_definition=result.outcomes)
        if plan.receipts
        else None,
        epsilon_audit=EpsilonAudit(checked=result.epsilon_checked, problems=tuple(result.epsilon_problems)),
        unsent=result.unsent,
        refused=result.refused,
        unused_population_rows=unused_rows,
        use_cases={
            labels[ref]: UseCaseResult(
                definition=ref,
                current=catalog.is_current(catalog.use_cases[ref]),
                mechanism=catalog.use_cases[ref].mechanism.name,
                epsilon_per_report=catalog.use_cases[ref].cost,
                period=catalog.use_cases[ref].period.value,
                truth={
                    str(p): truth_of(catalog.use_cases[ref], t) for p, t in sorted(result.truth.get(ref, {}).items())
                },
                comparison=compared.get(ref),
            )
            for ref in refs
        },
    )


def dropped_lines(result: ShardResult, unused_rows: dict[str, UnusedRows]) -> list[str]:
    """One sentence per kind of value that was not sent: refused, held back, or never used."""
    lines = []
    refused = {k: v for k, v in result.refused.items() if v}
    if refused:
        lines.append(
            f"{sum(refused.values()):,} values refused by the agents (a value its use case does not take, or a "
            f"stopped use case), not sent: {_per_use_case(refused)}"
        )
    unsent = {k: v for k, v in result.unsent.items() if v}
    if unsent:
        lines.append(
            f"{sum(unsent.values()):,} values recorded but not sent (the daily record limit, the lifetime ε cap, "
            f"outbox drops, or a use case a registry change removed): {_per_use_case(unsent)}"
        )
    for name, counts in unused_rows.items():
        parts = []
        if counts.past_days:
            parts.append(f"{counts.past_days:,} rows past the simulated days (--days)")
        if counts.past_devices:
            parts.append(f"{counts.past_devices:,} rows of devices beyond --devices")
        if parts:
            lines.append(f"{name}: its time series has {' and '.join(parts)}; those rows were not used")
    return lines


def _per_use_case(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n:,}" for name, n in sorted(counts.items()))


def unused_series_rows(plan: FleetPlan, registry: Registry) -> dict[str, UnusedRows]:
    """Per use case replaying a time series: its rows the plan does not reach (past --days, past --devices)."""
    out: dict[str, UnusedRows] = {}
    for name, path in plan.populations.items():
        try:
            pop = load_population(Path(path))
        except GeneratorError:
            continue  # build_plan has read it already; nothing more to say here
        if pop.series is None:
            continue
        periods = plan.days * 86_400 // registry.use_cases[name].period.seconds
        past_days = sum(1 for row in pop.series[: plan.devices] for offset in row if offset >= periods)
        past_devices = sum(len(row) for row in pop.series[plan.devices :])
        if past_days or past_devices:
            out[name] = UnusedRows(past_days=past_days, past_devices=past_devices)
    return out
