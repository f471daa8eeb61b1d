"""Estimates for an operator's tools: one period as rows (CSV or JSON lines), and the latest
estimate of every mean and proportion as Prometheus gauges.

The rows are read off the :class:`~collector.results.EstimateResult` the API's ``/estimate``
serves for the same period (``collector.estimation``'s result, computed once per version of
the aggregate by ``collector.live``), so an export and the dashboard never disagree: this
module only lays the result out, it computes nothing.

One row per frequency entry (released ones first, then the withheld ones with their reason),
per histogram bucket, or one row for a mean or proportion. Every row repeats the use case,
definition and period, so files of several periods concatenate into one table
(docs/deploy.md, "Exporting estimates").

The gauges (:class:`EstimateGauges`, in ``/metrics``) carry only means and proportions, one
series per current use case: labels ``use_case`` and ``definition``, and only the period the
API calls latest (``/estimate`` without ``?period``: the latest period that can be released,
else the latest with reports; :func:`collector.estimation.default_period`), so a gauge and the
API never show two different periods as "the latest", the label set is bounded by the
registry, and a scrape never carries a frequency table (those are the export's).
"""

from __future__ import annotations

import calendar
import csv
import io
import time
from collections.abc import Iterable, Iterator, Sequence

import msgspec
from msgspec.structs import replace as struct_replace
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from collector.live import LiveAggregates
from collector.results import (
    EstimateResult,
    FrequencyEntry,
    HistogramEstimate,
    Interval,
    Number,
    ReleaseDecision,
    ScalarEstimate,
)

__all__ = [
    "EXPORT_COLUMNS",
    "EXPORT_FORMATS",
    "GAUGED_KINDS",
    "EstimateGauges",
    "ExportRow",
    "export_rows",
    "export_text",
    "latest_estimates",
]

GAUGED_KINDS = ("mean", "proportion")
"""The kinds of estimate ``/metrics`` carries as gauges (one number per period)."""

EXPORT_FORMATS = {"csv": "text/csv", "jsonl": "application/x-ndjson"}
"""The formats an export is written in, with their media types."""

Cell = str | int | float | bool | None
"""One cell of a row (``None``: the column does not apply to the kind)."""


class ExportRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row of an export: the period's identity, then one entry's, bucket's or estimate's
    figures (a field that does not apply to the kind is ``None``, an empty cell)."""

    use_case: str
    definition: str
    period: int
    period_start: str
    period_end: str
    reports: int
    kind: str
    item: str | None = None
    low: float | None = None
    high: float | None = None
    value: float | None = None
    standard_error: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    released: bool | None = None
    withheld_reason: str | None = None


EXPORT_COLUMNS: tuple[str, ...] = ExportRow.__struct_fields__
"""The columns of every row, in order (a field that does not apply to the kind is empty)."""

_LINE_ENCODER = msgspec.json.Encoder()  # the columns in their order, as the CSV header has them


def _figures(base: ExportRow, value: Number, se: Number, ci: Interval, **more: Cell) -> ExportRow:
    """``base`` with one estimate's value, standard error and interval (and ``more`` columns)."""
    return struct_replace(base, value=value, standard_error=se, ci_low=ci[0], ci_high=ci[1], **more)


def _entry(base: ExportRow, e: FrequencyEntry) -> ExportRow:
    # A released entry's SE is the spread of its interval conditional on release (docs/estimation.md).
    se = e.selection_standard_error if e.selection_standard_error is not None else e.standard_error
    return _figures(
        base, e.count, se, e.ci, item=e.value, p_value=e.p_value, released=e.released, withheld_reason=e.withheld_reason
    )


def export_rows(result: EstimateResult) -> Iterator[ExportRow]:
    """The rows of ``result``, each with every column of :data:`EXPORT_COLUMNS`.

    A period that is not released as a whole (too few reports) is one row saying why.
    """
    base = ExportRow(
        use_case=result.use_case,
        definition=result.definition,
        period=result.period,
        period_start=result.period_start,
        period_end=result.period_end,
        reports=result.reports,
        kind=result.kind,
    )
    est = result.estimate
    if not result.released or est is None:
        yield struct_replace(base, released=False, withheld_reason=result.withheld_reason)
    elif isinstance(est, ScalarEstimate):
        yield _figures(base, est.value, est.standard_error, est.ci, released=True)
    elif isinstance(est, HistogramEstimate):
        for i, b in enumerate(est.buckets):
            yield _figures(base, b.value, b.standard_error, b.ci, item=str(i), low=b.low, high=b.high, released=True)
    else:
        assert isinstance(est, ReleaseDecision)
        for e in est.items + (est.withheld_items or ()):
            yield _entry(base, e)


def _cell(value: Cell) -> str | int | float:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def export_text(result: EstimateResult, fmt: str) -> str:
    """``result``'s rows as CSV (a header line, then one line per row) or JSON lines.

    Raises:
        ValueError: ``fmt`` is not one of :data:`EXPORT_FORMATS`.
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(EXPORT_FORMATS)}; got {fmt[:40]!r}")
    rows = list(export_rows(result))
    if fmt == "jsonl":
        return "".join(_LINE_ENCODER.encode(r).decode() + "\n" for r in rows)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(EXPORT_COLUMNS)
    # Undefined numbers (None) are empty cells, flags are true/false as in the JSON lines;
    # str of a float keeps every digit.
    writer.writerows([_cell(v) for v in msgspec.structs.astuple(r)] for r in rows)
    return out.getvalue()


async def latest_estimates(live: LiveAggregates) -> list[EstimateResult]:
    """The latest estimate of every current mean and proportion use case: what ``/estimate``
    answers without ``?period`` (the same call, so the same period and the same numbers)."""
    out = []
    for name in live.catalog.names():
        uc = live.catalog.current_of(name)
        if uc is None or uc.mechanism.kind.result not in GAUGED_KINDS:
            continue
        _, result = await live.estimate(name)
        out.append(result)
    return out


class EstimateGauges(Collector):
    """The gauges of :func:`latest_estimates`, set before each scrape (:meth:`update`).

    ``ldp_estimate_reports`` is there for every gauged use case; the value, its standard error
    and its interval only when the period is released (a withheld period has no number to show).
    """

    def __init__(self) -> None:
        self._results: tuple[EstimateResult, ...] = ()

    def update(self, results: Sequence[EstimateResult]) -> None:
        """The estimates the next scrape shows."""
        self._results = tuple(results)

    def collect(self) -> Iterable[Metric]:
        """The gauge families, one series per use case."""
        labels = ["use_case", "definition"]
        families = {
            "reports": GaugeMetricFamily(
                "ldp_estimate_reports", "Reports in the period of the latest estimate of the use case", labels=labels
            ),
            "period_start": GaugeMetricFamily(
                "ldp_estimate_period_start_seconds", "Start of the period the estimate is of (Unix time)", labels=labels
            ),
            "value": GaugeMetricFamily(
                "ldp_estimate_value", "Mean or proportion of the latest estimate, when released", labels=labels
            ),
            "se": GaugeMetricFamily("ldp_estimate_standard_error", "Standard error of the estimate", labels=labels),
            "low": GaugeMetricFamily("ldp_estimate_ci_low", "Lower end of the confidence interval", labels=labels),
            "high": GaugeMetricFamily("ldp_estimate_ci_high", "Upper end of the confidence interval", labels=labels),
        }
        for r in self._results:
            key = [r.use_case, r.definition]
            families["reports"].add_metric(key, r.reports)
            start = calendar.timegm(time.strptime(r.period_start, "%Y-%m-%dT%H:%M:%SZ"))
            families["period_start"].add_metric(key, start)
            est = r.estimate
            if r.released and isinstance(est, ScalarEstimate):
                figures = {"value": est.value, "se": est.standard_error, "low": est.ci[0], "high": est.ci[1]}
                for field, value in figures.items():
                    if value is not None:
                        families[field].add_metric(key, value)
        yield from families.values()

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: the families depend on the registry (prometheus_client's custom collectors)."""
        return []
