"""The fleet simulator's results: the collector's estimates next to the truth.

The estimates are read from the collector's HTTP JSON API (``/api/v1/use-cases/{name}/
estimate?period=P``), the same endpoint its dashboard draws from, so the numbers printed
here are the numbers the dashboard shows. The agent package never imports the collector;
it only speaks HTTP to it.

For every (use case, period) the truth is what the devices that reported actually held:

* proportion and mean use cases (randomized response, 1BitMean): the mean of the reported
  values; the error is ``estimate - truth`` and ``z = error / SE``;
* histograms (dBitFlip): the share of reporting devices per bucket, compared bucket by bucket;
* frequencies (CMS, HCMS, RAPPOR, SFP): the number of reports of each value, compared for
  every entry the collector estimated, released or withheld: the client asks for the
  withheld entries too (``&withheld=1``), so an underestimate the release rule hides is
  still caught. Each compared entry says whether it was released; reported values the
  collector did not estimate at all (outside the dictionary) are counted and listed.

A use case passes when every compared ``|z|`` is at most the tolerance (5 by default): with
an unbiased estimator and a correct standard error, a normal error beyond 5 SE has
probability below 6e-7 per comparison.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import msgspec

from collector.results import (
    EstimateResult,
    HistogramEstimate,
    ReleaseDecision,
    ScalarEstimate,
    ServiceStatus,
    from_json,
)
from fleet.tally import ShardResult, Tally, tally_kind
from protocol.catalog import Catalog
from protocol.interfaces import EstimateKind, as_discovery
from protocol.registry import UseCase

__all__ = [
    "CollectorClient",
    "CollectorUnavailableError",
    "Comparison",
    "NotReleased",
    "PeriodComparison",
    "UseCaseSummary",
    "check_counted_under_own_definition",
    "compare_period",
    "compare_with_collector",
    "format_results",
    "summarize",
    "write_plots",
]


class CollectorUnavailableError(RuntimeError):
    """The collector's HTTP API did not answer, or did not ingest what was published in time."""


class Health(msgspec.Struct, frozen=True):
    """What ``/healthz`` says (only what the simulator reads of it)."""

    status: str
    connected: bool = True


ResponseT = TypeVar("ResponseT")


class CollectorClient:
    """A small client of the collector's HTTP JSON API.

    Args:
        url: the collector's base URL (``http://127.0.0.1:8650``).
        timeout: seconds per request.
    """

    def __init__(self, url: str, *, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str, kind: type[ResponseT], **query: object) -> ResponseT:
        """GET ``path`` and read its JSON as ``kind`` (the collector's own result types).

        Raises:
            CollectorUnavailableError: on a connection failure, an HTTP error, or an answer
                that is not a ``kind``.
        """
        target = self.url + path
        if query:
            target += "?" + urllib.parse.urlencode({k: str(v) for k, v in query.items()})
        try:
            with urllib.request.urlopen(target, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:500]
            raise CollectorUnavailableError(f"GET {target}: HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise CollectorUnavailableError(f"GET {target}: {e}") from None
        try:
            return from_json(body, kind)
        except msgspec.ValidationError as e:
            raise CollectorUnavailableError(f"GET {target}: not the answer expected: {e}") from None
        except msgspec.DecodeError as e:
            raise CollectorUnavailableError(f"GET {target}: not JSON: {e}") from None

    def wait_connected(self, timeout: float) -> None:
        """Wait until the collector reports a live broker subscription.

        Raises:
            CollectorUnavailableError: if it does not within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                health = self.get("/healthz", Health)
            except CollectorUnavailableError as e:
                last = str(e)
            else:
                if health.connected:
                    return
                last = f"collector not connected to its broker: {health}"
            time.sleep(0.2)
        raise CollectorUnavailableError(f"collector at {self.url} not ready after {timeout:g} s: {last}")

    def status(self) -> ServiceStatus:
        """The collector's status."""
        return self.get("/api/v1/status", ServiceStatus)

    def report_counts(self) -> tuple[dict[str, dict[int, int]], ServiceStatus]:
        """Reports committed per use-case definition (by ref) and period, and the collector's status."""
        status = self.status()
        counts = {
            d.definition: {p.period: p.reports for p in d.periods}
            for info in status.use_cases.values()
            for d in info.definitions
        }
        return counts, status

    def wait_ingested(
        self,
        expected: Mapping[str, Mapping[int, int]],
        *,
        timeout: float,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, dict[int, int]]:
        """Wait until the collector has committed at least the ``expected`` reports per (use case, period).

        Raises:
            CollectorUnavailableError: if they are not all committed within ``timeout`` seconds
                (the message includes the collector's rejection counters).
        """
        want = sum(n for periods in expected.values() for n in periods.values())
        deadline = time.monotonic() + timeout
        while True:
            counts, status = self.report_counts()
            have = sum(
                min(counts.get(uc, {}).get(p, 0), n) for uc, periods in expected.items() for p, n in periods.items()
            )
            if progress is not None:
                progress(have, want)
            if have >= want:
                return counts
            if time.monotonic() > deadline:
                raise CollectorUnavailableError(
                    f"the collector committed {have} of the {want} reports the broker acknowledged within "
                    f"{timeout:g} s; collector counters: {json.dumps(status.counters)}, "
                    f"rejected: {json.dumps(status.live.rejected if status.live else {})}"
                )
            time.sleep(0.5)

    def estimate(self, use_case: str, period: int) -> EstimateResult:
        """The collector's estimate of one (use case or definition ref, period), withheld entries
        included (flagged)."""
        path = f"/api/v1/use-cases/{urllib.parse.quote(use_case)}/estimate"
        return self.get(path, EstimateResult, period=period, withheld=1)


# --------------------------------------------------------------------------- comparison


class Comparison(msgspec.Struct, frozen=True):
    """One estimated number next to its truth: ``error = estimate - truth``, ``z = error / SE``."""

    key: str
    estimate: float | None
    truth: float
    error: float | None
    standard_error: float | None
    z: float | None
    released: bool = True


class NotReleased(msgspec.Struct, frozen=True):
    """A reported value the collector did not release, with its true count."""

    key: str
    truth: int
    estimated: bool


class PeriodComparison(msgspec.Struct, frozen=True):
    """The collector's estimate of one (use case, period) next to what the devices held.

    Scalar estimates fill ``comparison``; histograms and frequencies fill ``items`` (one per
    bucket or estimated value, each flagged ``released``) and ``worst``; frequencies also say
    what was not released. ``max_abs_z`` is the largest ``|z|`` compared (``None``: nothing).
    """

    period: int
    period_start: str
    reports: int
    truth_reports: int
    released: bool
    withheld_reason: str | None
    kind: str
    max_abs_z: float | None = None
    comparison: Comparison | None = None
    items: tuple[Comparison, ...] = ()
    worst: Comparison | None = None
    withheld: int | None = None
    tested: int | None = None
    not_released: tuple[NotReleased, ...] = ()
    not_released_count: int = 0
    not_estimated_count: int = 0
    note: str | None = None

    def compared(self) -> list[Comparison]:
        """Every comparison of the period."""
        return [self.comparison] if self.comparison is not None else list(self.items)


def _z(error: float, se: float | None) -> float | None:
    if se is None or not math.isfinite(se):
        return None
    if se == 0:
        return 0.0 if error == 0 else math.inf
    return error / se


def _compare(key: str, estimate: float | None, truth: float, se: float | None, *, released: bool = True) -> Comparison:
    est = float("nan") if estimate is None else float(estimate)
    error = est - truth
    return Comparison(
        key=key,
        estimate=estimate,
        truth=truth,
        error=None if math.isnan(error) else error,
        standard_error=se,
        z=None if math.isnan(error) else _z(error, se),
        released=released,
    )


def _worst(items: Iterable[Comparison]) -> Comparison | None:
    return max((it for it in items if it.z is not None), key=lambda it: abs(it.z or 0.0), default=None)


def compare_period(use_case: UseCase, tally: Tally, result: EstimateResult) -> PeriodComparison:
    """Compare the collector's estimate of one (use case, period) with its truth.

    Args:
        use_case: the use case.
        tally: what the reporting devices held.
        result: the collector's estimate.
    """
    row = PeriodComparison(
        period=result.period,
        period_start=result.period_start,
        reports=result.reports,
        truth_reports=tally.n,
        released=result.released,
        withheld_reason=result.withheld_reason,
        kind=result.kind,
    )
    est = result.estimate
    if not result.released or est is None:
        return row
    if isinstance(est, ScalarEstimate):
        truth = tally.total / tally.n if tally.n else float("nan")
        one = _compare(use_case.name, est.value, truth, est.standard_error)
        return msgspec.structs.replace(row, comparison=one, max_abs_z=None if one.z is None else abs(one.z))
    if isinstance(est, HistogramEstimate):
        items = tuple(
            _compare(
                f"[{bucket.low:g}, {bucket.high:g})",
                bucket.value,
                tally.buckets[i] / tally.n if tally.n and tally.buckets else 0.0,
                bucket.standard_error,
            )
            for i, bucket in enumerate(est.buckets)
        )
        return _with_items(row, items)
    return _frequencies(row, use_case, tally, est)


def _with_items(row: PeriodComparison, items: tuple[Comparison, ...], **more: object) -> PeriodComparison:
    zs = [abs(it.z) for it in items if it.z is not None]
    return msgspec.structs.replace(row, items=items, worst=_worst(items), max_abs_z=max(zs) if zs else None, **more)


def _frequencies(row: PeriodComparison, use_case: UseCase, tally: Tally, est: ReleaseDecision) -> PeriodComparison:
    mech = use_case.mechanism
    discovery = as_discovery(mech) if mech.kind is EstimateKind.DISCOVERY else None
    truth_counts: dict[str, int] = {}
    for value, count in tally.counts.items():
        # A discovery mechanism reports strings as it can find them (SFP: truncated, unpadded).
        key = discovery.reported_as(value) if discovery is not None else value
        truth_counts[key] = truth_counts.get(key, 0) + count
    # Every entry the collector estimated, released or not (a collector that does not list
    # withheld entries gives only the released ones).
    entries = est.items + (est.withheld_items or ())
    items = tuple(
        _compare(it.value, it.count, float(truth_counts.get(it.value, 0)), it.standard_error, released=it.released)
        for it in entries
    )
    released = {it.key for it in items if it.released}
    estimated = {it.key for it in items}
    missing = sorted(((v, c) for v, c in truth_counts.items() if v not in released), key=lambda vc: -vc[1])
    return _with_items(
        row,
        items,
        withheld=est.withheld,
        tested=est.tested,
        not_released=tuple(NotReleased(key=v, truth=c, estimated=v in estimated) for v, c in missing[:20]),
        not_released_count=len(missing),
        not_estimated_count=sum(1 for v in truth_counts if v not in estimated),
    )


class UseCaseSummary(msgspec.Struct, frozen=True):
    """One use-case definition's comparison over all periods.

    Attributes:
        name: how the report names it: the use case's name, or its definition's ref where the
            simulation used several definitions of it.
        definition: the definition's ref (``name@hex``).
        current: the definition is the current registry's (the collector's ``registry``).
    """

    name: str
    mechanism: str
    kind: str
    definition: str
    current: bool
    periods: tuple[PeriodComparison, ...]
    max_abs_z: float | None
    compared: int
    beyond: int
    ok: bool


def summarize(
    name: str, use_case: UseCase, rows: Sequence[PeriodComparison], tolerance: float, *, current: bool = True
) -> UseCaseSummary:
    """Count comparisons and those beyond ``tolerance`` standard errors."""
    zs = [abs(it.z) for row in rows for it in row.compared() if it.z is not None]
    beyond = sum(1 for z in zs if z > tolerance)
    return UseCaseSummary(
        name=name,
        mechanism=use_case.mechanism.name,
        kind=tally_kind(use_case),
        definition=use_case.ref,
        current=current,
        periods=tuple(rows),
        max_abs_z=max(zs) if zs else None,
        compared=len(zs),
        beyond=beyond,
        ok=beyond == 0 and bool(zs),
    )


def compare_with_collector(
    client: CollectorClient,
    catalog: Catalog,
    refs: Sequence[str],
    result: ShardResult,
    *,
    timeout: float,
    receipts: bool,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, list[PeriodComparison]], float]:
    """Compare the collector's estimates with the truth, per definition and period.

    With receipts every report's fate is known already (the run ends when each has its
    receipt); without, this first waits until the collector holds as many reports as the
    broker acknowledged. Returns the comparisons per definition ref and the seconds spent
    waiting for ingest.
    """
    t0 = time.monotonic()
    counts: dict[str, dict[int, int]] | None = None
    if receipts:
        check_counted_under_own_definition(client, result)
    else:
        expected = {ref: {p: v[0] for p, v in periods.items()} for ref, periods in result.published.items()}
        counts = client.wait_ingested(expected, timeout=timeout, progress=progress)
    ingest_seconds = time.monotonic() - t0
    rows: dict[str, list[PeriodComparison]] = {}
    for ref in refs:
        uc = catalog.use_cases[ref]
        rows[ref] = []
        for period in sorted(result.truth.get(ref, {})):
            tally = result.truth[ref][period]
            estimate = client.estimate(ref, period)
            row = compare_period(uc, tally, estimate)
            held = estimate.reports if counts is None else counts.get(ref, {}).get(period, 0)
            if held != tally.n:
                row = msgspec.structs.replace(
                    row,
                    note=f"the collector holds {held} reports for this period, the fleet's counted reports carry "
                    f"{tally.n} values: the store has data from elsewhere",
                )
            rows[ref].append(row)
    return rows, ingest_seconds


def check_counted_under_own_definition(client: CollectorClient, result: ShardResult) -> None:
    """Every report a receipt said was counted is held under the definition it was made with.

    The collector may hold more (data from elsewhere in its store), never fewer.

    Raises:
        CollectorUnavailableError: naming the first definition and period that hold fewer.
    """
    held, _ = client.report_counts()
    for ref, periods in sorted(result.counted_periods.items()):
        for period, n in sorted(periods.items()):
            have = held.get(ref, {}).get(period, 0)
            if have < n:
                raise CollectorUnavailableError(
                    f"the collector holds {have:,} reports of {ref} for period {period}, where {n:,} of the fleet's "
                    "were counted under that definition"
                )


# --------------------------------------------------------------------------- text


def _f(x: float | None, digits: int = 5) -> str:
    if x is None:
        return "n/a"
    if not math.isfinite(x):
        return str(x)
    if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _withheld_row(r: PeriodComparison) -> str:
    """The line of a period the collector did not release: its start, reports and the reason."""
    return f"  {r.period_start or r.period!s:20s} {r.reports!s:>8s}  not released: {r.withheld_reason}"


def _mean_lines(s: UseCaseSummary, uc: UseCase) -> list[str]:
    """A mean's (or proportion's) periods, one line each."""
    lines: list[str] = []
    label = uc.mechanism.kind.value  # "proportion" or "mean"
    lines.append(
        f"  {'period start':20s} {'reports':>8s} {label + ' est.':>12s} {'truth':>12s} {'error':>11s} "
        f"{'SE':>10s} {'error/SE':>9s}"
    )
    for r in s.periods:
        c = r.comparison
        if c is None:
            lines.append(_withheld_row(r))
            continue
        lines.append(
            f"  {r.period_start:20s} {r.reports:>8d} {_f(c.estimate):>12s} {_f(c.truth):>12s} "
            f"{_f(c.error, 3):>11s} {_f(c.standard_error, 3):>10s} {_f(c.z, 2):>9s}"
        )
    return lines


def _distribution_lines(s: UseCaseSummary, detail: int) -> list[str]:
    """A histogram's or frequencies' periods, each with its worst entry; then the latest period's entries."""
    lines: list[str] = []
    what = "bucket" if s.kind == "histogram" else "value"
    lines.append(
        f"  {'period start':20s} {'reports':>8s} {'compared':>8s}  worst {what:12s} {'estimate':>10s} "
        f"{'truth':>10s} {'error':>10s} {'SE':>9s} {'error/SE':>8s}"
    )
    for r in s.periods:
        if not r.released:
            lines.append(_withheld_row(r))
            continue
        w = r.worst
        lines.append(
            f"  {r.period_start:20s} {r.reports:>8d} {len(r.items):>8d}  "
            + (
                f"{_short(w.key, 18):18s} {_f(w.estimate, 4):>10s} {_f(w.truth, 4):>10s} {_f(w.error, 3):>10s} "
                f"{_f(w.standard_error, 3):>9s} {_f(w.z, 2):>8s}"
                if w is not None
                else f"{'-':18s} {_f(None, 4):>10s} {_f(None, 4):>10s} {_f(None, 3):>10s} {_f(None, 3):>9s} "
                f"{_f(None, 2):>8s}"
            )
        )
    latest = next((r for r in reversed(s.periods) if r.released), None)
    if latest is not None and detail > 0:
        lines += _latest_lines(s, latest, what, detail)
    return lines


def _latest_lines(s: UseCaseSummary, latest: PeriodComparison, what: str, detail: int) -> list[str]:
    """The latest released period's entries: every bucket, or the top values by true count."""
    items = list(latest.items)
    if s.kind == "frequencies":
        items = sorted(items, key=lambda it: -(it.truth or 0))[:detail]
        heading = f"top {len(items)} by true count"
    else:
        heading = "every bucket (shares of devices)"
    lines = [
        f"  latest period {latest.period_start}, {heading}:",
        f"    {what:24s} {'estimate':>10s} {'truth':>10s} {'error':>10s} {'SE':>9s} {'error/SE':>8s}  released",
    ]
    for it in items:
        flag = "yes" if it.released else "withheld"
        lines.append(
            f"    {_short(it.key, 24):24s} {_f(it.estimate, 4):>10s} {_f(it.truth, 4):>10s} "
            f"{_f(it.error, 3):>10s} {_f(it.standard_error, 3):>9s} {_f(it.z, 2):>8s}  {flag}"
        )
    if latest.not_released_count:
        lines.append(
            f"    ({latest.not_released_count} reported values not released by the collector; "
            f"{latest.not_estimated_count} of them outside its dictionary, the rest "
            "withheld by its release rule and compared above)"
        )
    return lines


def format_results(
    summaries: list[UseCaseSummary], use_cases: Mapping[str, UseCase], *, tolerance: float, detail: int = 8
) -> str:
    """A readable report: per use-case definition and period the estimate, truth, error and SE.

    ``use_cases`` maps each summary's definition ref (or its name) to the definition.
    """
    out: list[str] = []
    for s in summaries:
        uc = use_cases[s.definition or s.name]
        out.append("")
        role = ""
        if s.name != uc.name:  # one of several definitions of the use case
            role = "current definition, " if s.current else "earlier definition, "
        out.append(
            f"{s.name} ({role}{s.mechanism}, ε = {uc.cost:.4g} per report, period {uc.period.value}, "
            f"daily limit {uc.daily_limit})"
        )
        if s.kind == "mean":
            out += _mean_lines(s, uc)
        else:
            out += _distribution_lines(s, detail)
        verdict = (
            f"every error within {tolerance:g} SE"
            if s.ok
            else f"{s.beyond} of {s.compared} errors beyond {tolerance:g} SE"
        )
        if s.compared == 0:
            verdict = "nothing compared (no released estimate)"
        out.append(f"  => {s.compared} comparisons, max |error|/SE = {_f(s.max_abs_z, 3)}: {verdict}")
    return "\n".join(out)


# --------------------------------------------------------------------------- plots


def _period_starts(rows: Sequence[PeriodComparison]) -> list[dt.datetime] | None:
    """The periods' starts as times for a date axis, or None if one is unreadable."""
    try:
        return [dt.datetime.fromisoformat(r.period_start) for r in rows]
    except ValueError:
        return None


def write_plots(summaries: list[UseCaseSummary], directory: Path, *, z: float = 1.96, top: int = 20) -> list[Path]:
    """One SVG per use case: means over time, or the latest period's histogram or top values,
    truth against estimates with ``± z·SE`` error bars (drawn by :mod:`fleet.plots`).

    Returns:
        The files written.

    Raises:
        RuntimeError: matplotlib is not installed (it comes with the ``[fleet]`` extra).
    """
    # Imported here: matplotlib takes a second to import and only --plots needs it, so the
    # simulator itself runs from an install without the [fleet] extra.
    try:
        from fleet.plots import estimate_chart, save_svg  # noqa: PLC0415
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        raise RuntimeError("plots need matplotlib: pip install 'ldp-telemetry[fleet]'") from None
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for s in summaries:
        released = [r for r in s.periods if r.released]
        if not released:
            continue
        if s.kind == "mean":
            what = "proportion" if s.mechanism == "rr" else "mean"
            scalar = [r for r in released if r.comparison is not None]
            points = [r.comparison for r in scalar if r.comparison is not None]
            starts = _period_starts(scalar)
            fig = estimate_chart(
                title=f"{s.name}: {what} per period, estimate and truth",
                x=starts if starts is not None else [r.period_start or str(r.period) for r in scalar],
                truth=[c.truth for c in points],
                estimate=[c.estimate for c in points],
                standard_error=[c.standard_error for c in points],
                z=z,
                value_label=f"{what} of the reported values",
                category_label="period start (UTC)",
            )
        else:
            # The latest period that released entries (a frequency use case may release none in
            # a period: every count below the threshold); the title names the period shown.
            latest = next((r for r in reversed(released) if r.items), released[-1])
            items = list(latest.items)
            if s.kind == "frequencies":
                items = sorted(items, key=lambda it: -(it.truth or 0))[:top]
                what, value_label, category_label = f"top {len(items)} values", "reports", "value, by true count"
            else:
                what, value_label, category_label = "share per bucket", "share of reporting devices", "bucket"
            fig = estimate_chart(
                title=f"{s.name}: {what}, period from {latest.period_start}",
                x=[it.key for it in items],
                truth=[it.truth for it in items],
                estimate=[it.estimate for it in items],
                standard_error=[it.standard_error for it in items],
                z=z,
                value_label=value_label,
                category_label=category_label,
                rows=s.kind == "frequencies",
            )
        written.append(save_svg(fig, directory / f"{s.name}.svg"))
    return written
