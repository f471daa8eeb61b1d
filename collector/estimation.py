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

import datetime as dt
import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist

import numpy as np
import numpy.typing as npt
from msgspec.structs import replace as struct_replace

from collector.amplification import BOUND, bound_reports, central_epsilon, default_delta
from collector.config import CollectorConfig
from collector.decoding.consistency import project_simplex as _project
from collector.decoding.discovery_settings import SFP_MAX_WORDS, discovery_top_t
from collector.decoding.rappor import RESIDUAL_STANDARD_ERRORS, RapporDecoder
from collector.decoding.release import DEFAULT_ALPHA, NEAR_CUTOFF, Release, ReleaseRule, release
from collector.decoding.sketches import NOT_PRODUCIBLE, producible
from collector.definitions import catalog_of_config
from collector.errors import StoreError
from collector.results import (
    CentralGuarantee,
    CountFigure,
    EstimateForm,
    EstimateResult,
    FitFigures,
    FrequencyEntry,
    HistogramBucket,
    HistogramEstimate,
    Interval,
    ReleaseDecision,
    ScalarEstimate,
    Series,
    SeriesPoint,
    finite,
)
from collector.store import KeyInfo, Store, open_store
from collector.threads import numpy_threads
from protocol.catalog import Catalog
from protocol.errors import TooManyWordsError
from protocol.interfaces import EstimateKind, as_discovery, as_frequencies, as_histogram
from protocol.registry import UseCase
from protocol.server.contract import (
    Aggregate,
    candidate_server,
    discovery_server,
    frequency_server,
    histogram_server,
    mean_server,
)
from protocol.server.parallel import Threads
from protocol.sfp import DEFAULT_ALPHABET

__all__ = [
    "DEFAULT_SFP_ALPHABET",
    "central_guarantee",
    "compute_estimate",
    "compute_series",
    "default_period",
    "discovery_settings",
    "estimate_aggregate",
    "load_dictionary",
    "open_readonly",
    "period_bounds",
    "project_simplex",
    "registry_dir",
    "resolve",
    "series_of",
    "z_value",
]

DEFAULT_SFP_ALPHABET = DEFAULT_ALPHABET
"""Characters SFP discovery assembles words from when a use case names none
(:data:`protocol.sfp.DEFAULT_ALPHABET`): the letters, the apostrophe (``it's``, ``don't``) and
the space that pads short words. 28 characters give 256 x 28**2 = 200,704 (piece, fragment)
candidates per position at the deployed fragment length 2."""


def z_value(confidence: float) -> float:
    """The two-sided normal quantile for ``confidence`` (1.96 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _interval(value: float, se: float, z: float) -> Interval:
    return (finite(value - z * se), finite(value + z * se))


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


def period_bounds(use_case: UseCase, period: int) -> tuple[str, str]:
    """The start and end of ``period`` of ``use_case``, as ISO 8601 UTC timestamps."""
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


def _entry(detail: Release, i: int) -> FrequencyEntry:
    e = detail.entry(i)
    released = bool(detail.released[i])
    return FrequencyEntry(
        value=e.value if isinstance(e.value, str) else e.value.hex(),
        count=finite(e.count),
        standard_error=finite(e.standard_error),
        ci=(finite(e.low), finite(e.high)),
        z=finite(e.z),
        p_value=finite(e.p_value),
        released=released,
        withheld_reason=None if released else detail.reasons[i],
        interval=detail.interval_text(i),
        median_unbiased=finite(float(detail.median_unbiased[i])),
        selection_standard_error=finite(float(detail.selection_standard_errors[i])) if released else None,
        near_cutoff=bool(detail.near_cutoff[i]),
    )


def _frequencies(detail: Release, *, withheld: bool) -> ReleaseDecision:
    """A frequency output: the released entries, and the withheld ones if asked."""
    rule = detail.rule
    return ReleaseDecision(
        items=tuple(_entry(detail, i) for i in detail.order(detail.released)),
        withheld=detail.withheld_count,
        threshold=rule.threshold,
        tested=detail.tested,
        correction=rule.control,
        alpha=rule.alpha,
        test=rule.describe(),
        withheld_items=tuple(_entry(detail, i) for i in detail.order(~detail.released)) if withheld else None,
        interval=detail.released_interval_text(),
        near_cutoff=NEAR_CUTOFF if bool(detail.near_cutoff.any()) else None,
    )


def discovery_settings(use_case: UseCase, n: int, *, alphabet: str | None = None) -> tuple[str, int]:
    """The alphabet and ``T`` a discovery use case (SFP) is decoded with at ``n`` reports.

    The mechanism's alphabet (``parameters.alphabet``, the one devices check their words
    against; ``alphabet`` overrides it) and ``collector.top_t`` when given, otherwise the
    planner's ``T`` for that alphabet's size
    (:func:`collector.decoding.discovery_settings.discovery_top_t`, from the mechanism's own figures).
    """
    settings = use_case.collector
    if alphabet is None:
        alphabet = as_discovery(use_case.mechanism).alphabet
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


def _discover(
    use_case: UseCase,
    aggregate: Aggregate,
    rule: ReleaseRule,
    *,
    withheld: bool,
    alphabet: str | None,
    threads: Threads | None,
) -> ReleaseDecision:
    """003 Alg. 10 through the discovery protocol, every assembled string released by the rule."""
    discovery = discovery_server(use_case.server)
    alphabet, top_t = discovery_settings(use_case, aggregate.n, alphabet=alphabet)
    while True:
        try:
            found = discovery.discover(aggregate, alphabet=alphabet, top_t=top_t, threshold=-math.inf, threads=threads)
            break
        except TooManyWordsError:
            # The planner keeps the expected number of assembled words at half the cap; a
            # period whose pieces crowd more than that (or a use case's own top_t that does)
            # gets a smaller T, reported with the estimate, never a failure.
            if top_t == 1:
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
    return struct_replace(_frequencies(detail, withheld=withheld), discovered=True, top_t=top_t, alphabet=alphabet)


def estimate_aggregate(
    use_case: UseCase,
    aggregate: Aggregate,
    info: KeyInfo,
    *,
    confidence: float = 0.95,
    registry_dir: Path | None = None,
    sfp_alphabet: str | None = None,
    withheld: bool = False,
    threads: Threads | None = None,
) -> EstimateResult:
    """The estimate of one (use case, period) aggregate, with the release rules applied.

    The one estimation path: the CLI, the HTTP API, the dashboard and
    ``benchmarks/bench_release.py`` all read what this returns. Which estimate is made is the
    mechanism's :attr:`~protocol.interfaces.Mechanism.kind`; the numbers come from the kind's
    server protocol (:mod:`protocol.server.contract`), never from its name. Every frequency
    output (dictionary, categories, candidates, discovered strings) is released entry by entry
    by :func:`collector.decoding.release.release`.

    Args:
        use_case: the use case.
        aggregate: its aggregate for the period.
        info: the period and its report and record counts.
        confidence: level of the two-sided intervals.
        registry_dir: where relative dictionary paths resolve (default: the working directory).
        sfp_alphabet: overrides the alphabet discovery assembles words from (the mechanism's
            ``parameters.alphabet``).
        withheld: also list the withheld entries of a frequency output
            (``estimate.withheld_items``, each with ``released: false`` and its
            ``withheld_reason``), so that every entry can be checked against a truth.
        threads: threads a dictionary query or word discovery splits its numpy work between
            (``collector.threads``; None: this thread alone).
    """
    start, end = period_bounds(use_case, info.period)
    settings = use_case.collector
    result = EstimateResult(
        use_case=use_case.name,
        definition=use_case.ref,
        description=use_case.description,
        mechanism=use_case.mechanism.name,
        kind=use_case.mechanism.kind.result,
        period=info.period,
        period_length=use_case.period.value,
        period_start=start,
        period_end=end,
        reports=info.reports,
        records=info.records,
        min_reports=settings.min_reports,
        release_threshold=settings.release_threshold,
        confidence=confidence,
        epsilon=use_case.epsilon,
        epsilon_report=use_case.cost,
        released=False,
        withheld_reason=None,
        estimate=None,
        central=central_guarantee(use_case, info),
    )
    # 003 §3.2.2: below min_reports nothing of the period is estimated, not even as withheld.
    if info.reports < settings.min_reports or info.reports == 0:
        reason = f"{info.reports} reports; at least {settings.min_reports} are needed before release"
        return struct_replace(result, withheld_reason=reason)
    found = _estimate_of_kind(
        use_case,
        aggregate,
        registry_dir or Path.cwd(),
        confidence,
        withheld=withheld,
        alphabet=sfp_alphabet,
        threads=threads,
    )
    if isinstance(found, str):
        return struct_replace(result, withheld_reason=found)
    return struct_replace(result, estimate=found, released=True)


def central_guarantee(use_case: UseCase, info: KeyInfo) -> CentralGuarantee | None:
    """The (ε, δ) of the period's shuffled batch (:mod:`collector.amplification`), or ``None``
    for a period without reports.

    One changed record against the period's reports, each an ε0-randomizer with ε0 the
    per-record cost. Records of one memo are not independent, so for a memoized mechanism
    whose reports carried several records in the period no amplified ε is stated
    (docs/privacy-accounting.md, "The central guarantee").
    """
    if info.reports < 1:
        return None
    n = bound_reports(info.reports)
    delta = default_delta(n)
    memoized = "epsilon_longitudinal" in use_case.mechanism.privacy_figures()
    guarantee = CentralGuarantee(
        epsilon=None,
        delta=delta,
        epsilon_local=use_case.cost,
        n=n,
        bound=BOUND,
        unit="one record of the period",
        note="this period alone: its memo is shared with other periods" if memoized else None,
    )
    if memoized and info.records > info.reports:
        note = "reports carried several records drawn from memos: no amplified ε is stated"
        return struct_replace(guarantee, note=note)
    epsilon = central_epsilon(use_case.cost, n, delta)
    if epsilon >= use_case.cost * (1 - 1e-9):
        # The bound gives nothing below ε0 for so few reports: say so in words, not only by
        # showing the same figure twice (docs/privacy-accounting.md, small n).
        small = f"no amplification: {n} reports are too few for the bound to go below ε {use_case.cost:.4g}"
        note = small if guarantee.note is None else f"{guarantee.note}; {small}"
        return struct_replace(guarantee, epsilon=finite(epsilon), note=note)
    return struct_replace(guarantee, epsilon=finite(epsilon))


def _estimate_of_kind(
    use_case: UseCase,
    aggregate: Aggregate,
    registry_dir: Path,
    confidence: float,
    *,
    withheld: bool,
    alphabet: str | None = None,
    threads: Threads | None = None,
) -> EstimateForm | str:
    """The estimate the mechanism's kind gives, or why there is none."""
    kind = use_case.mechanism.kind
    rule = _rule(use_case, confidence)
    if kind.scalar:
        return _scalar_estimate(use_case, aggregate, z_value(confidence))
    if kind is EstimateKind.HISTOGRAM:
        return _histogram_estimate(use_case, aggregate, z_value(confidence))
    if kind is EstimateKind.CANDIDATES:
        return _candidates(use_case, aggregate, registry_dir, rule, withheld=withheld)
    if kind is EstimateKind.DISCOVERY:
        return _discover(use_case, aggregate, rule, withheld=withheld, alphabet=alphabet, threads=threads)
    if kind in (EstimateKind.DICTIONARY, EstimateKind.CATEGORIES):
        return _listed(use_case, aggregate, registry_dir, rule, withheld=withheld, threads=threads)
    return f"no estimator for mechanism {use_case.mechanism.name!r}"


def _listed(
    use_case: UseCase,
    aggregate: Aggregate,
    registry_dir: Path,
    rule: ReleaseRule,
    *,
    withheld: bool,
    threads: Threads | None,
) -> ReleaseDecision | str:
    """Every entry of a list fixed in advance: a dictionary (CMS, HCMS) or the categories of
    basic RAPPOR (004 Appendix: a category's count is T̂_i), released by the same rule."""
    if use_case.mechanism.kind is EstimateKind.DICTIONARY:
        names = load_dictionary(use_case, registry_dir)
        if not names:
            return "no dictionary configured for this frequency oracle"
    else:
        names = tuple(as_frequencies(use_case.mechanism).fixed_categories or ())
    f = frequency_server(use_case.server).estimate_frequencies(aggregate, list(names), threads=threads)
    detail = release(names, f.values, f.standard_errors, n=aggregate.n, rule=rule)
    return _frequencies(detail, withheld=withheld)


def _scalar_estimate(use_case: UseCase, aggregate: Aggregate, z: float) -> ScalarEstimate:
    scalar = mean_server(use_case.server)
    e = scalar.estimate_mean(aggregate)
    c = scalar.estimate_count(aggregate)
    value_range = use_case.mechanism.value_range
    return ScalarEstimate(
        value=finite(e.value),
        standard_error=finite(e.standard_error),
        ci=_interval(e.value, e.standard_error, z),
        count=None if c is None else CountFigure(value=finite(c.value), standard_error=finite(c.standard_error)),
        range=value_range if c is None else None,
    )


def _histogram_estimate(use_case: UseCase, aggregate: Aggregate, z: float) -> HistogramEstimate:
    h = histogram_server(use_case.server).estimate_histogram(aggregate)
    edges = list(as_histogram(use_case.mechanism).bucket_edges)
    consistent = project_simplex(h.values)
    return HistogramEstimate(
        buckets=tuple(
            HistogramBucket(
                low=finite(edges[i]),
                high=finite(edges[i + 1]),
                value=finite(h.values[i]),
                standard_error=finite(h.standard_errors[i]),
                ci=_interval(float(h.values[i]), float(h.standard_errors[i]), z),
                consistent=finite(consistent[i]),
            )
            for i in range(len(h))
        ),
        n=h.n,
    )


def _candidates(
    use_case: UseCase, aggregate: Aggregate, registry_dir: Path, rule: ReleaseRule, *, withheld: bool
) -> ReleaseDecision:
    # The joint decoder (004 §4) regresses the server half's bit estimates on the candidates'
    # design matrix; the server half refuses another mechanism's aggregate (TypeError).
    server = candidate_server(use_case.server)
    bits = server.estimate_bits(aggregate)
    words = load_dictionary(use_case, registry_dir)
    if not words:
        return ReleaseDecision(
            items=(),
            withheld=0,
            threshold=rule.threshold,
            tested=0,
            correction=rule.control,
            alpha=rule.alpha,
            test=rule.describe(),
            note="no candidate dictionary",
        )
    # 004 §4: Lasso selection, least-squares refit, SE and p-values; then the release rule
    # over every candidate (the decoder's own test against 0 only decides what is refit).
    decoder = RapporDecoder(
        control=rule.control,
        alpha=rule.alpha if rule.alpha is not None else DEFAULT_ALPHA,
        confidence=rule.confidence,
    )
    decoding = decoder.decode_bits(server, bits, list(words))
    detail = release(decoding.candidates, decoding.counts, decoding.standard_errors, n=decoding.n, rule=rule)
    share = decoding.unexplained_share
    return struct_replace(
        _frequencies(detail, withheld=withheld),
        selected=int(decoding.selected.sum()),
        unexplained=CountFigure(
            value=finite(decoding.unexplained.value), standard_error=finite(decoding.unexplained.standard_error)
        ),
        fit=FitFigures(
            unexplained_share=finite(share.value),
            unexplained_share_standard_error=finite(share.standard_error),
            fitted=int(decoding.selected.sum()),
            dispersion=finite(decoding.dispersion),
            widened=int(decoding.widened.sum()),
            standard_errors=RESIDUAL_STANDARD_ERRORS,
        ),
    )


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


def open_readonly(config: CollectorConfig) -> tuple[Catalog, Store]:
    """The configuration's catalog and its store, opened read-only (the CLI's reads)."""
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
) -> EstimateResult:
    """The estimate of ``use_case`` (a name or a definition's ref) for ``period``, read from
    the store (the CLI's path).

    The default period is :func:`default_period`; ``withheld`` also lists withheld entries.
    The running service answers from its materialised aggregates instead (``collector.live``),
    with the same :func:`estimate_aggregate`.

    Raises:
        KeyError: no accepted definition has that name or ref.
        StoreError: the checkpoint database cannot be read.
    """
    catalog, store = open_readonly(config)
    try:
        uc = resolve(catalog, use_case)
        if period is None:
            period = default_period(uc, store.totals(uc.ref))
        aggregate, info = store.aggregate(uc.ref, period)
        # Damage that landed after the open's check and before the read is refused too.
        store.check(report_ids=False)
    finally:
        store.close()
    with numpy_threads() as threads:
        return estimate_aggregate(
            uc,
            aggregate,
            info,
            confidence=config.estimation.confidence,
            registry_dir=registry_dir(catalog, uc),
            withheld=withheld,
            threads=threads,
        )


def series_of(
    use_case: UseCase, infos: Sequence[KeyInfo], aggregate_of: Callable[[int], Aggregate], *, confidence: float
) -> Series:
    """Per-period points of ``use_case`` over ``infos``: report counts, and for proportions and
    means the value with SE and CI (``aggregate_of(period)`` gives a period's aggregate)."""
    z = z_value(confidence)
    points = []
    for info in infos:
        start, end = period_bounds(use_case, info.period)
        point = SeriesPoint(
            period=info.period,
            period_start=start,
            period_end=end,
            reports=info.reports,
            records=info.records,
            released=info.reports >= use_case.collector.min_reports and info.reports > 0,
        )
        if point.released and use_case.mechanism.kind.scalar:
            e = mean_server(use_case.server).estimate_mean(aggregate_of(info.period))
            point = struct_replace(
                point,
                value=finite(e.value),
                standard_error=finite(e.standard_error),
                ci=_interval(e.value, e.standard_error, z),
            )
        points.append(point)
    return Series(
        use_case=use_case.name,
        definition=use_case.ref,
        mechanism=use_case.mechanism.name,
        kind=use_case.mechanism.kind.result,
        confidence=confidence,
        points=tuple(points),
    )


def compute_series(config: CollectorConfig, use_case: str, *, limit: int = 120) -> Series:
    """:func:`series_of` the latest ``limit`` periods, read from the store.

    Raises:
        KeyError: no accepted definition has that name or ref.
    """
    catalog, store = open_readonly(config)
    try:
        uc = resolve(catalog, use_case)
        infos = store.totals(uc.ref)[-limit:]
        return series_of(
            uc, infos, lambda period: store.aggregate(uc.ref, period)[0], confidence=config.estimation.confidence
        )
    finally:
        store.close()
