"""Estimates people can read: every number with its standard error and confidence interval.

One function per kind of result, chosen by the use case's mechanism:

=============  ============  ===================================================================
mechanism      kind          what is reported
=============  ============  ===================================================================
rr             proportion    share of devices whose bit is 1 (002), and the count
one-bit-mean   mean          mean counter value (000 eq. 2)
dbitflip       histogram     share of devices per bucket (000 eq. 3), and the consistent
                             histogram (projected onto the simplex: non-negative, summing to 1)
cms, hcms      frequencies   estimated count of every dictionary entry (003 Alg. 4)
rappor         frequencies   candidates found by Lasso + least squares with p-values (004 §4);
                             category counts for the basic variants
sfp            frequencies   words discovered by the puzzle (003 Alg. 10)
=============  ============  ===================================================================

Release rules: nothing is estimated for a (use case, period) with fewer than the use case's
``min_reports`` reports (003 §3.2.2). A frequency entry (dictionary entry, discovered word,
RAPPOR string or category) is released only if its estimate is at least
``release_threshold`` and it passes the use case's one-sided test of ``count > threshold``,
corrected over every entry tested with ``collector.correction`` at ``collector.alpha``
(Benjamini-Hochberg at 0.05 by default: the expected share of released entries whose true
count is below the threshold is at most 5 %); :mod:`collector.decoding.release` states the
rule and why. Withheld entries are counted, and listed with their reason when asked
(``withheld=True``; ``?withheld=1`` over HTTP, ``--all`` on the CLI); they are never
presented as released.

Confidence intervals are ``estimate ± z · SE`` with ``z`` the normal quantile of the
configured level: each estimator is a sum of many independent reports' contributions.

The work here is CPU-heavy (dictionary queries gather over sketches of up to ``k x m``
counters; RAPPOR decoding runs a Lasso). The running service keeps its aggregates
materialised and calls :func:`estimate_aggregate` in threads (``collector.live``); the CLI
reads the store with :func:`compute_estimate`. ``epsilon`` is the declared ε of the use case,
``epsilon_report`` the ε charged per report (``UseCase.cost``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

from collector.config import CollectorConfig
from collector.decoding.consistency import project_simplex as _project
from collector.decoding.plan import SFP_MAX_WORDS, discovery_top_t
from collector.decoding.rappor import RapporDecoder
from collector.decoding.release import DEFAULT_ALPHA, Release, ReleaseRule, release
from collector.decoding.sketches import NOT_PRODUCIBLE, producible
from collector.definitions import catalog_of_config
from collector.errors import StoreError
from collector.numbers import format_number
from collector.store import KeyInfo, Store, open_store
from protocol.catalog import Catalog
from protocol.interfaces import EstimateKind, as_frequencies, as_histogram
from protocol.rappor import RapporAggregate
from protocol.registry import UseCase
from protocol.server.contract import (
    Aggregate,
    discovery_server,
    frequency_server,
    histogram_server,
    mean_server,
)

__all__ = [
    "DEFAULT_SFP_ALPHABET",
    "compute_estimate",
    "compute_series",
    "default_period",
    "discovery_settings",
    "estimate_aggregate",
    "format_estimate",
    "load_dictionary",
    "project_simplex",
    "registry_dir",
    "resolve",
    "series_of",
    "status_of",
    "store_status",
    "z_value",
]

DEFAULT_SFP_ALPHABET = "abcdefghijklmnopqrstuvwxyz' "
"""Characters SFP discovery assembles words from when a use case names none: the letters, the
apostrophe (``it's``, ``don't``) and the space that pads short words. 28 characters give
256 x 28**2 = 200,704 (piece, fragment) candidates per position at the deployed fragment
length 2."""


def z_value(confidence: float) -> float:
    """The two-sided normal quantile for ``confidence`` (1.96 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _num(x: float) -> float | None:
    """JSON has no NaN or infinity: those become null."""
    x = float(x)
    return x if math.isfinite(x) else None


def _interval(value: float, se: float, z: float) -> list[float | None]:
    return [_num(value - z * se), _num(value + z * se)]


def project_simplex(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The closest (Euclidean) vector with non-negative entries summing to 1.

    The consistency post-processing of a histogram (``collector.decoding.consistency``):
    unbiased per-bucket estimates can be negative and need not sum to 1; the projection fixes
    both and never increases the total squared error to the true (consistent) histogram.
    """
    return _project(np.nan_to_num(np.asarray(values, dtype=np.float64)), 1.0)


@lru_cache(maxsize=32)
def _dictionary(path: str, mtime_ns: int) -> tuple[str, ...]:
    with open(path, encoding="utf-8") as f:
        entries = [line.strip() for line in f]
    return tuple(dict.fromkeys(e for e in entries if e and not e.startswith("#")))


def load_dictionary(use_case: UseCase, registry_dir: Path) -> tuple[str, ...] | None:
    """The use case's dictionary (one entry per line; blank lines and ``#`` comments skipped).

    Relative paths are resolved against the registry file's directory.

    Raises:
        StoreError: the file is configured but cannot be read.
    """
    name = use_case.collector.dictionary
    if name is None:
        return None
    path = Path(name)
    if not path.is_absolute():
        path = registry_dir / path
    try:
        return _dictionary(str(path), path.stat().st_mtime_ns)
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"use case {use_case.name}: cannot read the dictionary {path}: {exc}") from exc


def _period_bounds(use_case: UseCase, period: int) -> tuple[str, str]:
    start = period * use_case.period.seconds
    return _iso(start), _iso(start + use_case.period.seconds)


def _iso(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat().replace("+00:00", "Z")


def _rule(use_case: UseCase, confidence: float) -> ReleaseRule:
    settings = use_case.collector
    return ReleaseRule(
        min_reports=settings.min_reports,
        threshold=settings.release_threshold,
        control=settings.correction,
        alpha=settings.alpha,
        confidence=confidence,
    )


def _frequencies(detail: Release, *, withheld: bool) -> dict[str, Any]:
    """The JSON form of a frequency output: the released entries, and the withheld ones if asked."""
    rule = detail.rule
    out: dict[str, Any] = {
        "items": [detail.plain_entry(i) for i in detail.order(detail.released)],
        "withheld": detail.withheld_count,
        "threshold": rule.threshold,
        "tested": detail.tested,
        "correction": rule.control,
        "alpha": rule.alpha,
        "test": rule.describe(),
    }
    if withheld:
        out["withheld_items"] = [detail.plain_entry(i) for i in detail.order(~detail.released)]
    return out


def discovery_settings(use_case: UseCase, n: int) -> tuple[str, int]:
    """The alphabet and ``T`` a discovery use case (SFP) is decoded with at ``n`` reports.

    The use case's ``collector.alphabet`` and ``collector.top_t`` when given; otherwise
    :data:`DEFAULT_SFP_ALPHABET` and the planner's ``T``
    (:func:`collector.decoding.plan.discovery_top_t`, from the mechanism's own figures).
    """
    settings = use_case.collector
    alphabet = settings.alphabet or DEFAULT_SFP_ALPHABET
    if settings.top_t is not None:
        return alphabet, settings.top_t
    top_t = discovery_top_t(
        discovery_server(use_case.server),
        n=n,
        alphabet_size=len(set(alphabet)),
        release_threshold=settings.release_threshold,
        alpha=settings.alpha if settings.correction != "pfer" else DEFAULT_ALPHA,
        max_words=SFP_MAX_WORDS,
    )
    return alphabet, top_t


def _discover(use_case: UseCase, aggregate: Aggregate, rule: ReleaseRule, *, withheld: bool) -> dict[str, Any]:
    """003 Alg. 10 through the discovery protocol, every assembled string released by the rule."""
    discovery = discovery_server(use_case.server)
    alphabet, top_t = discovery_settings(use_case, aggregate.n)
    while True:
        try:
            found = discovery.discover(aggregate, alphabet=alphabet, top_t=top_t, threshold=-math.inf)
            break
        except ValueError as exc:
            # The planner keeps the expected number of assembled words at half the cap; a
            # period whose pieces crowd more than that (or a use case's own top_t that does)
            # gets a smaller T, reported with the estimate, never a failure.
            if "max_words" not in str(exc) or top_t == 1:
                raise
            top_t //= 2
    words = [w.word for w in found]
    # A device pads on the right only: a string with padding inside is no hypothesis at all.
    eligible = [producible(w) for w in words]
    detail = release(
        words,
        [w.count for w in found],
        [w.standard_error for w in found],
        n=aggregate.n,
        rule=rule,
        eligible=eligible,
        ineligible_reason=NOT_PRODUCIBLE,
    )
    out = _frequencies(detail, withheld=withheld)
    out.update(discovered=True, top_t=top_t, alphabet=alphabet)
    return out


def estimate_aggregate(
    use_case: UseCase,
    aggregate: Aggregate,
    info: KeyInfo,
    *,
    confidence: float = 0.95,
    registry_dir: Path | None = None,
    sfp_alphabet: str | None = None,
    withheld: bool = False,
    workers: int | None = None,
) -> dict[str, Any]:
    """The JSON-ready estimate of one (use case, period) aggregate, with the release rules applied.

    The one estimation path: the CLI, the HTTP API, the dashboard and
    ``benchmarks/bench_release.py`` all read what this returns. Which estimate is made is the
    mechanism's :attr:`~protocol.interfaces.Mechanism.kind`; the numbers come from the kind's
    protocol (:mod:`protocol.interfaces`), never from its name. Every frequency output
    (dictionary, categories, candidates, discovered strings) is released entry by entry by
    :func:`collector.decoding.release.release`.

    Args:
        use_case: the use case.
        aggregate: its aggregate for the period.
        info: the period and its report and record counts.
        confidence: level of the two-sided intervals.
        registry_dir: where relative dictionary paths resolve (default: the working directory).
        sfp_alphabet: overrides the use case's discovery alphabet (``collector.alphabet``).
        withheld: also list the withheld entries of a frequency output
            (``estimate.withheld_items``, each with ``released: false`` and its
            ``withheld_reason``), so that every entry can be checked against a truth.
        workers: unused; kept so callers written for threaded dictionary queries still work.
    """
    mech = use_case.mechanism
    name = mech.name
    kind = mech.kind
    start, end = _period_bounds(use_case, info.period)
    z = z_value(confidence)
    settings = use_case.collector
    result: dict[str, Any] = {
        "use_case": use_case.name,
        "definition": use_case.ref,
        "description": use_case.description,
        "mechanism": name,
        "kind": kind.result,
        "period": info.period,
        "period_length": use_case.period.value,
        "period_start": start,
        "period_end": end,
        "reports": info.reports,
        "records": info.records,
        "min_reports": settings.min_reports,
        "release_threshold": settings.release_threshold,
        "confidence": confidence,
        "epsilon": use_case.epsilon,
        "epsilon_report": use_case.cost,
        "released": False,
        "withheld_reason": None,
        "estimate": None,
    }
    # 003 §3.2.2: below min_reports nothing of the period is estimated, not even as withheld.
    if info.reports < settings.min_reports or info.reports == 0:
        result["withheld_reason"] = f"{info.reports} reports; at least {settings.min_reports} are needed before release"
        return result
    rule = _rule(use_case, confidence)
    estimate: dict[str, Any]
    if kind.scalar:
        estimate = _scalar_estimate(use_case, aggregate, z)
    elif kind is EstimateKind.HISTOGRAM:
        estimate = _histogram_estimate(use_case, aggregate, z)
    elif kind is EstimateKind.DICTIONARY:
        words = load_dictionary(use_case, registry_dir or Path.cwd())
        if not words:
            result["withheld_reason"] = "no dictionary configured for this frequency oracle"
            return result
        f = frequency_server(use_case.server).estimate_frequencies(aggregate, list(words))
        detail = release(words, f.values, f.standard_errors, n=aggregate.n, rule=rule)
        estimate = _frequencies(detail, withheld=withheld)
    elif kind is EstimateKind.CATEGORIES:
        # 004 Appendix for basic RAPPOR: a category's count is T̂_i, released by the same rule.
        names = list(as_frequencies(mech).fixed_categories or ())
        f = frequency_server(use_case.server).estimate_frequencies(aggregate, names)
        detail = release(names, f.values, f.standard_errors, n=aggregate.n, rule=rule)
        estimate = _frequencies(detail, withheld=withheld)
    elif kind is EstimateKind.CANDIDATES:
        estimate = _candidates(use_case, aggregate, registry_dir or Path.cwd(), rule, withheld=withheld)
    elif kind is EstimateKind.DISCOVERY:
        if sfp_alphabet is not None:
            use_case = dataclasses.replace(use_case, collector=dataclasses.replace(settings, alphabet=sfp_alphabet))
        estimate = _discover(use_case, aggregate, rule, withheld=withheld)
    else:
        result["withheld_reason"] = f"no estimator for mechanism {name!r}"
        return result
    result["estimate"] = estimate
    result["released"] = True
    return result


def _scalar_estimate(use_case: UseCase, aggregate: Aggregate, z: float) -> dict[str, Any]:
    scalar = mean_server(use_case.server)
    e = scalar.estimate_mean(aggregate)
    estimate: dict[str, Any] = {
        "value": _num(e.value),
        "standard_error": _num(e.standard_error),
        "ci": _interval(e.value, e.standard_error, z),
    }
    c = scalar.estimate_count(aggregate)
    if c is not None:
        estimate["count"] = {"value": _num(c.value), "standard_error": _num(c.standard_error)}
    elif use_case.mechanism.value_range is not None:
        low, high = use_case.mechanism.value_range
        estimate["range"] = [_whole(low), _whole(high)]
    return estimate


def _histogram_estimate(use_case: UseCase, aggregate: Aggregate, z: float) -> dict[str, Any]:
    h = histogram_server(use_case.server).estimate_histogram(aggregate)
    edges = list(as_histogram(use_case.mechanism).bucket_edges)
    consistent = project_simplex(h.values)
    return {
        "buckets": [
            {
                "low": _num(edges[i]),
                "high": _num(edges[i + 1]),
                "value": _num(h.values[i]),
                "standard_error": _num(h.standard_errors[i]),
                "ci": _interval(float(h.values[i]), float(h.standard_errors[i]), z),
                "consistent": _num(consistent[i]),
            }
            for i in range(len(h))
        ],
        "n": h.n,
    }


def _whole(x: float) -> int | float:
    """An integral bound as an int (JSON ``[0, 21600]``, as before the contract)."""
    return int(x) if float(x).is_integer() else x


def _candidates(
    use_case: UseCase, aggregate: Aggregate, registry_dir: Path, rule: ReleaseRule, *, withheld: bool
) -> dict[str, Any]:
    if not isinstance(aggregate, RapporAggregate):
        # The joint decoder (004 §4) regresses RAPPOR's bit counts on the candidates' design
        # matrix; it is written for RAPPOR's aggregate.
        raise TypeError(f"use case {use_case.name}: no candidate decoder for a {type(aggregate).__name__}")
    words = load_dictionary(use_case, registry_dir)
    if not words:
        return {
            "items": [],
            "withheld": 0,
            "threshold": rule.threshold,
            "tested": 0,
            "correction": rule.control,
            "alpha": rule.alpha,
            "test": rule.describe(),
            "note": "no candidate dictionary",
        }
    # 004 §4: Lasso selection, least-squares refit, SE and p-values; then the release rule
    # over every candidate (the decoder's own test against 0 only decides what is refit).
    decoder = RapporDecoder(
        control=rule.control,
        alpha=rule.alpha if rule.alpha is not None else DEFAULT_ALPHA,
        confidence=rule.confidence,
    )
    decoding = decoder.decode(aggregate, list(words))
    detail = release(decoding.candidates, decoding.counts, decoding.standard_errors, n=decoding.n, rule=rule)
    out = _frequencies(detail, withheld=withheld)
    out.update(
        selected=int(decoding.selected.sum()),
        unexplained={
            "count": _num(decoding.unexplained.value),
            "standard_error": _num(decoding.unexplained.standard_error),
        },
    )
    return out


def resolve(catalog: Catalog, text: str) -> UseCase:
    """The definition ``text`` names: a use-case name (its current definition) or a ref
    (``name@hex``, as the status lists them).

    Raises:
        KeyError: naming the use cases and definitions there are.
    """
    found = catalog.resolve(text)
    if found is None:
        raise KeyError(text)
    return found


def registry_dir(catalog: Catalog, use_case: UseCase) -> Path:
    """Where a definition's relative dictionary path resolves: the directory of the first
    registry file (the current one first) that holds the definition."""
    return Path(catalog.sources(use_case)[0]).parent


def _open(config: CollectorConfig) -> tuple[Catalog, Store]:
    catalog = catalog_of_config(config)
    return catalog, open_store(config, catalog, readonly=True)


def default_period(use_case: UseCase, infos: Sequence[KeyInfo]) -> int:
    """The period an estimate without ``?period=`` shows.

    The latest period that can be released; the latest with data if none can yet (a day that
    has just begun must not hide yesterday's estimate); the current period if there is no data.
    """
    if not infos:
        return use_case.period.index_at(dt.datetime.now(dt.UTC).timestamp())
    released = [i for i in infos if i.reports >= max(use_case.collector.min_reports, 1)]
    return (released or infos)[-1].period


def compute_estimate(
    config: CollectorConfig, use_case: str, period: int | None = None, *, withheld: bool = False
) -> dict[str, Any]:
    """The estimate of ``use_case`` (a name or a definition's ref) for ``period``, read from
    the store (the CLI's path).

    The default period is :func:`default_period`; ``withheld`` also lists withheld entries.
    The running service answers from its materialised aggregates instead (``collector.live``),
    with the same :func:`estimate_aggregate`.

    Raises:
        KeyError: no accepted definition has that name or ref.
        StoreError: the checkpoint database cannot be read.
    """
    catalog, store = _open(config)
    try:
        uc = resolve(catalog, use_case)
        if period is None:
            period = default_period(uc, store.totals(uc.ref))
        aggregate, info = store.aggregate(uc.ref, period)
    finally:
        store.close()
    return estimate_aggregate(
        uc,
        aggregate,
        info,
        confidence=config.estimation.confidence,
        registry_dir=registry_dir(catalog, uc),
        withheld=withheld,
    )


def series_of(
    use_case: UseCase, infos: Sequence[KeyInfo], aggregate_of: Callable[[int], Aggregate], *, confidence: float
) -> dict[str, Any]:
    """Per-period points of ``use_case`` over ``infos``: report counts, and for proportions and
    means the value with SE and CI (``aggregate_of(period)`` gives a period's aggregate)."""
    z = z_value(confidence)
    points = []
    for info in infos:
        start, end = _period_bounds(use_case, info.period)
        point: dict[str, Any] = {
            "period": info.period,
            "period_start": start,
            "period_end": end,
            "reports": info.reports,
            "records": info.records,
            "released": info.reports >= use_case.collector.min_reports and info.reports > 0,
        }
        if point["released"] and use_case.mechanism.kind.scalar:
            e = mean_server(use_case.server).estimate_mean(aggregate_of(info.period))
            point.update(
                value=_num(e.value),
                standard_error=_num(e.standard_error),
                ci=_interval(e.value, e.standard_error, z),
            )
        points.append(point)
    return {
        "use_case": use_case.name,
        "definition": use_case.ref,
        "mechanism": use_case.mechanism.name,
        "kind": use_case.mechanism.kind.result,
        "confidence": confidence,
        "points": points,
    }


def compute_series(config: CollectorConfig, use_case: str, *, limit: int = 120) -> dict[str, Any]:
    """:func:`series_of` the latest ``limit`` periods, read from the store.

    Raises:
        KeyError: no accepted definition has that name or ref.
    """
    catalog, store = _open(config)
    try:
        uc = resolve(catalog, use_case)
        infos = store.totals(uc.ref)[-limit:]
        return series_of(
            uc, infos, lambda period: store.aggregate(uc.ref, period)[0], confidence=config.estimation.confidence
        )
    finally:
        store.close()


def _definition_status(catalog: Catalog, uc: UseCase, totals: Sequence[KeyInfo]) -> dict[str, Any]:
    """One definition: what it is, where it comes from, whether it is current or retired, its periods."""
    retired = catalog.retired.get(uc.ref)
    return {
        "definition": uc.ref,
        "hash": uc.definition.hex(),
        "current": catalog.is_current(uc),
        "registries": list(catalog.sources(uc)),
        "retired_from": None if retired is None else retired.isoformat(),
        "mechanism": uc.mechanism.name,
        "kind": uc.mechanism.kind.result,
        "description": uc.description,
        "epsilon": uc.epsilon,
        "epsilon_report": uc.cost,
        "period": uc.period.value,
        "daily_limit": uc.daily_limit,
        "lifetime_epsilon": uc.lifetime_epsilon,
        "min_reports": uc.collector.min_reports,
        "release_threshold": uc.collector.release_threshold,
        "periods": [
            {
                "period": k.period,
                "period_start": _period_bounds(uc, k.period)[0],
                "reports": k.reports,
                "records": k.records,
            }
            for k in totals
            if k.use_case == uc.ref
        ],
    }


def status_of(
    catalog: Catalog,
    totals: Sequence[KeyInfo],
    counters: dict[str, int],
    instances: dict[str, dict[str, int]],
    *,
    store_path: Path | str,
) -> dict[str, Any]:
    """Every use case with its definitions and their periods, and the lifetime counters.

    Per use case name: the fields of its current definition (of its newest one, for a use
    case the current registry no longer has) and ``definitions``, each accepted definition
    with its own periods, current one first.
    """
    use_cases: dict[str, Any] = {}
    for name in catalog.names():
        definitions = [_definition_status(catalog, uc, totals) for uc in catalog.definitions_of(name)]
        use_cases[name] = definitions[0] | {"in_current_registry": definitions[0]["current"]}
        use_cases[name]["definitions"] = definitions
    return {
        "registry_hash": catalog.hash_hex,
        "registries": [{"source": r.source, "hash": r.hash_hex} for r in catalog.registries],
        "store": str(store_path),
        "use_cases": use_cases,
        "counters": counters,
        "instances": instances,
    }


def store_status(config: CollectorConfig) -> dict[str, Any]:
    """:func:`status_of` the store (the CLI's path)."""
    catalog, store = _open(config)
    try:
        totals = store.totals()
        counters = store.counters()
        per_instance = {instance: store.counters(instance) for instance in store.instances()}
    finally:
        store.close()
    return status_of(catalog, totals, counters, per_instance, store_path=config.store.location)


def _fmt(x: float | None) -> str:
    return format_number(x)


def format_estimate(result: dict[str, Any]) -> str:
    """A human-readable rendering of :func:`estimate_aggregate`'s result."""
    head = (
        f"{result['definition']} ({result['mechanism']}), period {result['period']} "
        f"[{result['period_start']} .. {result['period_end']}): "
        f"{_fmt(result['reports'])} reports, {_fmt(result['records'])} records"
    )
    lines = [head]
    if not result["released"]:
        lines.append(f"  not released: {result['withheld_reason']}")
        return "\n".join(lines)
    level = f"{100 * result['confidence']:g}% CI"
    est = result["estimate"]
    if result["kind"] in ("proportion", "mean"):
        lines.append(
            f"  {result['kind']}: {_fmt(est['value'])} ± {_fmt(est['standard_error'])} (SE); "
            f"{level} {_fmt(est['ci'][0])} .. {_fmt(est['ci'][1])}"
        )
        if "count" in est:
            lines.append(f"  count: {_fmt(est['count']['value'])} ± {_fmt(est['count']['standard_error'])} (SE)")
    elif result["kind"] == "histogram":
        lines.append(f"  {'bucket':>24s}  {'share':>10s}  {'SE':>10s}  {'consistent':>10s}")
        for b in est["buckets"]:
            label = f"[{_fmt(b['low'])}, {_fmt(b['high'])})"
            lines.append(
                f"  {label:>24s}  {_fmt(b['value']):>10s}  {_fmt(b['standard_error']):>10s}  "
                f"{_fmt(b['consistent']):>10s}"
            )
    else:
        lines.append(f"  {'value':40s}  {'count':>12s}  {'SE':>10s}")
        for item in est["items"]:
            count, se = _fmt(item["count"]), _fmt(item["standard_error"])
            lines.append(f"  {item['value'][:40]:40s}  {count:>12s}  {se:>10s}")
        if est.get("withheld"):
            threshold = _fmt(est["threshold"])
            lines.append(f"  ({est['withheld']} entries withheld: below the threshold {threshold} or not significant)")
        if est.get("correction") and est.get("alpha") is not None:
            lines.append(f"  ({est['tested']} entries tested; {_correction_text(est['correction'], est['alpha'])})")
        if "withheld_items" in est:
            lines.append(f"  withheld (not released): {len(est['withheld_items'])}")
            lines.append(f"  {'value':40s}  {'count':>12s}  {'SE':>10s}  reason")
            for item in est["withheld_items"]:
                count, se = _fmt(item["count"]), _fmt(item["standard_error"])
                lines.append(f"  {item['value'][:40]:40s}  {count:>12s}  {se:>10s}  {item['withheld_reason']}")
    return "\n".join(lines)


def _correction_text(correction: str, alpha: float) -> str:
    # pfer's level counts false releases; the others' is a rate (collector.decoding.stats).
    if correction == "pfer":
        return f"pfer: at most {alpha:g} false releases expected"
    return f"{correction} at alpha = {alpha:g}"
