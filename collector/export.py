"""One period's estimate as rows for an operator's tools: CSV or JSON lines.

The rows are read off the :class:`~collector.results.EstimateResult` the API's ``/estimate``
serves for the same period (``collector.estimation``'s result, computed once per version of
the aggregate by ``collector.live``), so an export and the dashboard never disagree: this
module only lays the result out, it computes nothing.

One row per frequency entry (released ones first, then the withheld ones with their reason),
per histogram bucket, or one row for a mean or proportion. Every row repeats the use case,
definition and period, so files of several periods concatenate into one table
(docs/deploy.md, "Exporting estimates").
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

from collector.results import EstimateResult, FrequencyEntry, HistogramEstimate, ReleaseDecision, ScalarEstimate

__all__ = ["EXPORT_COLUMNS", "EXPORT_FORMATS", "export_rows", "export_text"]

EXPORT_FORMATS = {"csv": "text/csv", "jsonl": "application/x-ndjson"}
"""The formats an export is written in, with their media types."""

EXPORT_COLUMNS = (
    "use_case",
    "definition",
    "period",
    "period_start",
    "period_end",
    "reports",
    "kind",
    "item",
    "low",
    "high",
    "value",
    "standard_error",
    "ci_low",
    "ci_high",
    "p_value",
    "released",
    "withheld_reason",
)
"""The columns of every row, in order (a field that does not apply to the kind is empty)."""

Row = dict[str, str | int | float | bool | None]


def _entry(base: Row, e: FrequencyEntry) -> Row:
    # A released entry's SE is the spread of its interval conditional on release (docs/estimation.md).
    se = e.selection_standard_error if e.selection_standard_error is not None else e.standard_error
    return base | {
        "item": e.value,
        "value": e.count,
        "standard_error": se,
        "ci_low": e.ci[0],
        "ci_high": e.ci[1],
        "p_value": e.p_value,
        "released": e.released,
        "withheld_reason": e.withheld_reason,
    }


def export_rows(result: EstimateResult) -> Iterator[Row]:
    """The rows of ``result``, each with every column of :data:`EXPORT_COLUMNS`.

    A period that is not released as a whole (too few reports) is one row saying why.
    """
    base: Row = dict.fromkeys(EXPORT_COLUMNS)
    base.update(
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
        yield base | {"released": False, "withheld_reason": result.withheld_reason}
    elif isinstance(est, ScalarEstimate):
        yield base | {
            "value": est.value,
            "standard_error": est.standard_error,
            "ci_low": est.ci[0],
            "ci_high": est.ci[1],
            "released": True,
        }
    elif isinstance(est, HistogramEstimate):
        for i, b in enumerate(est.buckets):
            yield base | {
                "item": str(i),
                "low": b.low,
                "high": b.high,
                "value": b.value,
                "standard_error": b.standard_error,
                "ci_low": b.ci[0],
                "ci_high": b.ci[1],
                "released": True,
            }
    else:
        assert isinstance(est, ReleaseDecision)
        for e in est.items + (est.withheld_items or ()):
            yield _entry(base, e)


def export_text(result: EstimateResult, fmt: str) -> str:
    """``result``'s rows as CSV (a header line, then one line per row) or JSON lines.

    Raises:
        ValueError: ``fmt`` is not one of :data:`EXPORT_FORMATS`.
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {', '.join(EXPORT_FORMATS)}; got {fmt[:40]!r}")
    rows = list(export_rows(result))
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=EXPORT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    # Undefined numbers (None) are empty cells; repr of a float keeps every digit.
    writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)
    return out.getvalue()
