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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.sim import Tally, tally_kind
from protocol.interfaces import EstimateKind, as_discovery
from protocol.registry import UseCase

__all__ = [
    "CollectorClient",
    "CollectorUnavailableError",
    "UseCaseSummary",
    "compare_period",
    "format_results",
    "summarize",
    "write_plots",
]


class CollectorUnavailableError(RuntimeError):
    """The collector's HTTP API did not answer, or did not ingest what was published in time."""


class CollectorClient:
    """A small client of the collector's HTTP JSON API.

    Args:
        url: the collector's base URL (``http://127.0.0.1:8650``).
        timeout: seconds per request.
    """

    def __init__(self, url: str, *, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str, **query: object) -> Any:
        """GET ``path`` and decode its JSON.

        Raises:
            CollectorUnavailableError: on a connection failure or an HTTP error.
        """
        target = self.url + path
        if query:
            target += "?" + urllib.parse.urlencode({k: str(v) for k, v in query.items()})
        try:
            with urllib.request.urlopen(target, timeout=self.timeout) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:500]
            raise CollectorUnavailableError(f"GET {target}: HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise CollectorUnavailableError(f"GET {target}: {e}") from None

    def wait_connected(self, timeout: float) -> None:
        """Wait until the collector reports a live broker subscription.

        Raises:
            CollectorUnavailableError: if it does not within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                health = self.get("/healthz")
            except CollectorUnavailableError as e:
                last = str(e)
            else:
                if health.get("connected", True):
                    return
                last = f"collector not connected to its broker: {health}"
            time.sleep(0.2)
        raise CollectorUnavailableError(f"collector at {self.url} not ready after {timeout:g} s: {last}")

    def report_counts(self) -> tuple[dict[str, dict[int, int]], dict[str, Any]]:
        """Reports committed per use-case definition (by ref) and period, and the collector's counters."""
        status = self.get("/api/v1/status")
        counts = {
            d["definition"]: {int(p["period"]): int(p["reports"]) for p in d.get("periods", [])}
            for info in status.get("use_cases", {}).values()
            for d in info.get("definitions", [])
        }
        return counts, {"counters": status.get("counters", {}), "live": status.get("live", {})}

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
            counts, extra = self.report_counts()
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
                    f"{timeout:g} s; collector counters: {json.dumps(extra)}"
                )
            time.sleep(0.5)

    def estimate(self, use_case: str, period: int) -> dict[str, Any]:
        """The collector's estimate of one (use case or definition ref, period), withheld entries
        included (flagged)."""
        path = f"/api/v1/use-cases/{urllib.parse.quote(use_case)}/estimate"
        result: dict[str, Any] = self.get(path, period=period, withheld=1)
        return result


# --------------------------------------------------------------------------- comparison


def _z(error: float, se: float | None) -> float | None:
    if se is None or not math.isfinite(se):
        return None
    if se == 0:
        return 0.0 if error == 0 else math.inf
    return error / se


def _item(key: str, estimate: float | None, truth: float, se: float | None, *, released: bool = True) -> dict[str, Any]:
    est = float("nan") if estimate is None else float(estimate)
    error = est - truth
    return {
        "key": key,
        "estimate": estimate,
        "truth": truth,
        "error": None if math.isnan(error) else error,
        "standard_error": se,
        "z": None if math.isnan(error) else _z(error, se),
        "released": released,
    }


def compare_period(use_case: UseCase, tally: Tally, result: Mapping[str, Any]) -> dict[str, Any]:
    """Compare the collector's estimate of one (use case, period) with its truth.

    Args:
        use_case: the use case.
        tally: what the reporting devices held.
        result: the collector's estimate JSON.

    Returns:
        A JSON-ready row: ``estimate``, ``truth``, ``error``, ``standard_error`` and ``z`` for
        scalar estimates; ``items`` (one per bucket or estimated value, each flagged
        ``released``) and the worst one
        for vector estimates; ``max_abs_z`` either way.
    """
    kind = tally_kind(use_case)
    row: dict[str, Any] = {
        "period": result.get("period"),
        "period_start": result.get("period_start"),
        "reports": result.get("reports"),
        "truth_reports": tally.n,
        "released": bool(result.get("released")),
        "withheld_reason": result.get("withheld_reason"),
        "kind": result.get("kind"),
    }
    est = result.get("estimate") or {}
    if not row["released"]:
        row["max_abs_z"] = None
        return row
    items: list[dict[str, Any]]
    if kind == "mean":
        truth = tally.total / tally.n if tally.n else float("nan")
        row.update(_item(use_case.name, est.get("value"), truth, est.get("standard_error")))
        del row["key"]
        z = row["z"]
        row["max_abs_z"] = None if z is None else abs(z)
        return row
    if kind == "histogram":
        items = []
        for i, bucket in enumerate(est.get("buckets", [])):
            share = tally.buckets[i] / tally.n if tally.n and tally.buckets else 0.0
            label = f"[{bucket.get('low'):g}, {bucket.get('high'):g})"
            items.append(_item(label, bucket.get("value"), share, bucket.get("standard_error")))
    else:
        mech = use_case.mechanism
        discovery = as_discovery(mech) if mech.kind is EstimateKind.DISCOVERY else None
        truth_counts: dict[str, int] = {}
        for value, count in tally.counts.items():
            # A discovery mechanism reports strings as it can find them (SFP: truncated, unpadded).
            key = discovery.reported_as(value) if discovery is not None else value
            truth_counts[key] = truth_counts.get(key, 0) + count
        # Every entry the collector estimated, released or not (a collector that does not
        # list withheld entries gives only the released ones).
        entries = list(est.get("items", [])) + list(est.get("withheld_items", []))
        items = [
            _item(
                str(it["value"]),
                it.get("count"),
                float(truth_counts.get(str(it["value"]), 0)),
                it.get("standard_error"),
                released=bool(it.get("released", True)),
            )
            for it in entries
        ]
        released = {it["key"] for it in items if it["released"]}
        estimated = {it["key"] for it in items}
        missing = sorted(((v, c) for v, c in truth_counts.items() if v not in released), key=lambda vc: -vc[1])
        row["withheld"] = est.get("withheld")
        row["not_released"] = [{"key": v, "truth": c, "estimated": v in estimated} for v, c in missing[:20]]
        row["not_released_count"] = len(missing)
        row["not_estimated_count"] = sum(1 for v in truth_counts if v not in estimated)
        row["tested"] = est.get("tested")
    row["items"] = items
    zs = [abs(it["z"]) for it in items if it["z"] is not None]
    row["max_abs_z"] = max(zs) if zs else None
    worst = max((it for it in items if it["z"] is not None), key=lambda it: abs(it["z"]), default=None)
    row["worst"] = worst
    return row


@dataclass
class UseCaseSummary:
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
    definition: str = ""
    current: bool = True
    periods: list[dict[str, Any]] = field(default_factory=list)
    max_abs_z: float | None = None
    compared: int = 0
    beyond: int = 0
    ok: bool = True


def summarize(name: str, use_case: UseCase, rows: list[dict[str, Any]], tolerance: float) -> UseCaseSummary:
    """Count comparisons and those beyond ``tolerance`` standard errors."""
    summary = UseCaseSummary(
        name=name, mechanism=use_case.mechanism.name, kind=tally_kind(use_case), periods=rows, definition=use_case.ref
    )
    zs: list[float] = []
    for row in rows:
        if "items" in row:
            zs.extend(abs(it["z"]) for it in row["items"] if it["z"] is not None)
        elif row.get("z") is not None:
            zs.append(abs(row["z"]))
    summary.compared = len(zs)
    summary.beyond = sum(1 for z in zs if z > tolerance)
    summary.max_abs_z = max(zs) if zs else None
    summary.ok = summary.beyond == 0 and summary.compared > 0
    return summary


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


def _withheld_row(r: Mapping[str, Any]) -> str:
    """The line of a period the collector did not release: its start, reports and the reason."""
    return f"  {r['period_start'] or r['period']!s:20s} {r['reports']!s:>8s}  not released: {r['withheld_reason']}"


def _mean_lines(s: UseCaseSummary, uc: UseCase) -> list[str]:
    """A mean's (or proportion's) periods, one line each."""
    lines: list[str] = []
    label = uc.mechanism.kind.value  # "proportion" or "mean"
    lines.append(
        f"  {'period start':20s} {'reports':>8s} {label + ' est.':>12s} {'truth':>12s} {'error':>11s} "
        f"{'SE':>10s} {'error/SE':>9s}"
    )
    for r in s.periods:
        if not r["released"]:
            lines.append(_withheld_row(r))
            continue
        lines.append(
            f"  {r['period_start']:20s} {r['reports']:>8d} {_f(r['estimate']):>12s} {_f(r['truth']):>12s} "
            f"{_f(r['error'], 3):>11s} {_f(r['standard_error'], 3):>10s} {_f(r['z'], 2):>9s}"
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
        if not r["released"]:
            lines.append(_withheld_row(r))
            continue
        w = r.get("worst") or {}
        lines.append(
            f"  {r['period_start']:20s} {r['reports']:>8d} {len(r['items']):>8d}  "
            f"{_short(str(w.get('key', '-')), 18):18s} {_f(w.get('estimate'), 4):>10s} "
            f"{_f(w.get('truth'), 4):>10s} {_f(w.get('error'), 3):>10s} {_f(w.get('standard_error'), 3):>9s} "
            f"{_f(w.get('z'), 2):>8s}"
        )
    latest = next((r for r in reversed(s.periods) if r["released"]), None)
    if latest is not None and detail > 0:
        items = latest["items"]
        if s.kind == "frequencies":
            items = sorted(items, key=lambda it: -(it["truth"] or 0))[:detail]
            heading = f"top {len(items)} by true count"
        else:
            heading = "every bucket (shares of devices)"
        lines.append(f"  latest period {latest['period_start']}, {heading}:")
        lines.append(
            f"    {what:24s} {'estimate':>10s} {'truth':>10s} {'error':>10s} {'SE':>9s} {'error/SE':>8s}  released"
        )
        for it in items:
            flag = "yes" if it.get("released", True) else "withheld"
            lines.append(
                f"    {_short(it['key'], 24):24s} {_f(it['estimate'], 4):>10s} {_f(it['truth'], 4):>10s} "
                f"{_f(it['error'], 3):>10s} {_f(it['standard_error'], 3):>9s} {_f(it['z'], 2):>8s}  {flag}"
            )
        if latest.get("not_released_count"):
            lines.append(
                f"    ({latest['not_released_count']} reported values not released by the collector; "
                f"{latest.get('not_estimated_count', 0)} of them outside its dictionary, the rest "
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


def _period_starts(rows: list[dict[str, Any]]) -> list[dt.datetime] | None:
    """The periods' starts as times for a date axis, or None if one is missing or unreadable."""
    try:
        return [dt.datetime.fromisoformat(str(r["period_start"])) for r in rows]
    except (KeyError, ValueError):
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
        released = [r for r in s.periods if r["released"]]
        if not released:
            continue
        if s.kind == "mean":
            what = "proportion" if s.mechanism == "rr" else "mean"
            starts = _period_starts(released)
            fig = estimate_chart(
                title=f"{s.name}: {what} per period, estimate and truth",
                x=starts if starts is not None else [str(r["period_start"] or r["period"]) for r in released],
                truth=[float(r["truth"]) for r in released],
                estimate=[r["estimate"] for r in released],
                standard_error=[r["standard_error"] for r in released],
                z=z,
                value_label=f"{what} of the reported values",
                category_label="period start (UTC)",
            )
        else:
            # The latest period that released entries (a frequency use case may release none in
            # a period: every count below the threshold); the title names the period shown.
            latest = next((r for r in reversed(released) if r["items"]), released[-1])
            items = latest["items"]
            if s.kind == "frequencies":
                items = sorted(items, key=lambda it: -(it["truth"] or 0))[:top]
                what, value_label, category_label = f"top {len(items)} values", "reports", "value, by true count"
            else:
                what, value_label, category_label = "share per bucket", "share of reporting devices", "bucket"
            fig = estimate_chart(
                title=f"{s.name}: {what}, period from {latest['period_start']}",
                x=[it["key"] for it in items],
                truth=[float(it["truth"]) for it in items],
                estimate=[it["estimate"] for it in items],
                standard_error=[it["standard_error"] for it in items],
                z=z,
                value_label=value_label,
                category_label=category_label,
                rows=s.kind == "frequencies",
            )
        written.append(save_svg(fig, directory / f"{s.name}.svg"))
    return written
