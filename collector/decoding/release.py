"""The release rule of every frequency output: which counted entries a person may read.

Every frequency output (CMS and HCMS dictionary entries, SFP discovered words, RAPPOR
candidate strings and the category counts of basic RAPPOR) is a list of entries, each with
an unbiased estimated count ``Ĉ`` and its standard error ``SE`` (a sum over many independent
reports, so ``Ĉ`` is normal to a good approximation). :func:`release` decides, for all of them
in the same way, which are *released*. An entry is released only when

1. the period has at least ``min_reports`` reports (003 §3.2.2; checked for the whole
   period: below it no entry is even estimated, see ``collector.estimation``);
2. its estimate is at least the release threshold ``T`` (003 §3.2.2: only entries above a
   threshold are published); and
3. it passes the use case's test: the one-sided test of ``H0: C <= T`` against
   ``H1: C > T``, with ``z = (Ĉ - T) / SE`` and ``p = Pr[Z >= z]``, corrected for the number
   of entries tested with the use case's ``collector.correction`` at ``collector.alpha``
   (:func:`collector.decoding.stats.reject`). ``T`` below 0 tests against 0: no count is
   negative.

**Why the test is against ``T`` and not only against 0.** A count threshold alone is a fixed
number while the standard error grows as ``sqrt(n)``: at the deployed ``T = 1000`` and
``n = 10^6`` a CMS entry's SE is about 430 and an HCMS entry's about 1,040, so the thousands
of entries whose true count is far below ``T`` each cross it with probability
``Pr[Z >= T / SE]`` (1 % for CMS, 17 % for HCMS), and most of what was released was false
(docs/benchmarks.md, "What a count threshold alone releases"; the test brings the share of
true releases to 1.00). A test of ``C > 0`` does not help: an entry with a true count of 500 is present.
What a reader of a release assumes is ``C >= T``, so that is the alternative tested.

**The default: Benjamini-Hochberg at 0.05.** What a release promises (docs/design.md, invariant 9) is
that the share of released entries whose true count is below ``T`` is at most 5 %, at any
number of reports. That share is the false discovery proportion of the tests above, and BH
(Benjamini and Hochberg, 1995) bounds its expectation, the false discovery rate, by
``α M0 / M <= α`` for independent or positively dependent p-values, whatever ``n``, the
number of entries or how many are present. Entries with a true count strictly below ``T``
have p-values stochastically larger than uniform, which only lowers the rate. Bonferroni
(``collector.correction = "bonferroni"``) bounds the chance of even one false release, and
with it the share, but loses recall as the dictionary grows (its level is ``α / M``); BH's
level grows with the number of entries that are clearly present, which is why it is the
default. ``"storey"`` (adaptive BH) keeps the same bound with more power when many entries
are present; ``"pfer"`` bounds the expected *number* of false releases instead.

**Intervals after selection** (docs/estimation.md). A released entry is read because its
estimate crossed ``max(T, max(T, 0) + z* SE)``, ``z*`` the quantile of the correction's realized
level (:func:`collector.decoding.stats.rejection_level`), so its interval is the one that
covers among released entries: the normal law truncated at that cutoff, inverted in the
count (:mod:`collector.decoding.selective`). The estimate shown stays the unconditional one;
its conditionally median-unbiased counterpart and the spread of the conditional interval
(``selection_standard_errors``) come with it. Withheld entries keep ``count ± z SE``.

**Near the cutoff** (``near_cutoff``). An estimate less than ``NEAR_CUTOFF_SE`` standard errors
above the cutoff it crossed has a conditional interval that runs far below it and is no longer
``count ± z spread``: no count and spread read with it agree with the interval, so a reader is
shown the interval alone, with the words "near the cutoff" (docs/estimation.md, "What is
shown").

The estimate, SE, ``z`` and ``p`` of every entry are kept, released or not, with the reason an
entry was withheld, so an operator (``/estimate?withheld=1``) or the fleet simulator can
compare every entry with the truth; withheld entries are never presented as released.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collector.decoding.arrays import Array, BoolArray
from collector.decoding.plain import ValueEstimate
from collector.decoding.selective import conditional_interval
from collector.decoding.stats import (
    check_control,
    check_level,
    normal_quantile,
    normal_sf,
    rejection_level,
    z_interval,
)

__all__ = [
    "CONDITIONAL_INTERVAL",
    "DEFAULT_ALPHA",
    "DEFAULT_CONTROL",
    "NEAR_CUTOFF",
    "NEAR_CUTOFF_SE",
    "PLAIN_INTERVAL",
    "Release",
    "ReleaseRule",
    "release",
]

DEFAULT_CONTROL = "bh"
"""The correction when a registry names none: Benjamini-Hochberg (see the module docstring)."""
DEFAULT_ALPHA = 0.05
"""Its level: the expected share of false releases is at most 5 %."""
CONDITIONAL_INTERVAL = "conditional on release"
"""What a released entry's interval is: it covers the true count at its level among released
entries (truncated-normal inversion at the entry's cutoff, :mod:`collector.decoding.selective`)."""
PLAIN_INTERVAL = "estimate ± z SE, not conditional on release"
"""What a withheld entry's interval is (and a released one's when no cutoff selected it)."""
NEAR_CUTOFF = "near cutoff: the estimate barely crossed the release cutoff, so only its interval is shown"
"""What a released entry shown by its interval alone means (the CLI and the dashboard print it)."""
NEAR_CUTOFF_SE = 2.0
"""A released estimate closer than this many SEs above its cutoff is shown by its interval alone.
From 2 SE up the conditional interval's centre is within 0.21 SE of the estimate and its width
at most 10.5 % over the plain one's (docs/estimation.md, "What is shown"), so count, spread and
interval read together; at 1 SE its lower end already lies 3.9 SE below the estimate."""


@dataclass(frozen=True, kw_only=True)
class ReleaseRule:
    """The release rule of one use case.

    Attributes:
        min_reports: no entry is released from a period with fewer reports.
        threshold: ``T``: the smallest estimated count released, and the null of the test.
        control: the multiple-testing correction (``collector.decoding.stats``).
        alpha: its level; ``None`` applies the count threshold only (for comparisons in
            benchmarks; a registry cannot ask for it).
        confidence: level of the two-sided intervals reported with each entry.
    """

    min_reports: int = 0
    threshold: float = 0.0
    control: str = DEFAULT_CONTROL
    alpha: float | None = DEFAULT_ALPHA
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if isinstance(self.min_reports, bool) or not isinstance(self.min_reports, int) or self.min_reports < 0:
            raise ValueError(f"min_reports must be a non-negative integer; got {self.min_reports!r}")
        if (
            isinstance(self.threshold, bool)
            or not isinstance(self.threshold, int | float)
            or math.isnan(self.threshold)
        ):
            raise ValueError(f"threshold must be a number; got {self.threshold!r}")
        if self.alpha is None:
            check_control(self.control)
        else:
            check_level(self.alpha, self.control)
        z_interval(self.confidence)

    @property
    def null(self) -> float:
        """The count the test is against: ``max(T, 0)`` (no count is negative)."""
        return max(float(self.threshold), 0.0)

    def describe(self) -> str:
        """The test in words, for withheld entries' reasons and the CLI."""
        if self.alpha is None:
            return "count threshold only"
        if self.control == "pfer":
            return f"one-sided test of count > {self.null:g}, pfer: at most {self.alpha:g} false releases expected"
        return f"one-sided test of count > {self.null:g}, {self.control} at alpha = {self.alpha:g}"


@dataclass(frozen=True, eq=False)
class Release:
    """Every entry of one frequency output, with the verdict of the rule.

    Attributes:
        values: the entries (dictionary entries, words, candidates, categories), as given.
        counts: estimated counts.
        standard_errors: their standard errors.
        z: ``(count - max(T, 0)) / SE``.
        p_values: one-sided p-values of ``count > max(T, 0)``.
        released: which entries are released.
        reasons: why each entry is withheld (``None`` for the released ones).
        tested: how many entries entered the correction.
        n: number of reports.
        rule: the rule applied.
        cutoffs: the smallest estimate each released entry could have had and still been
            released, ``max(T, max(T, 0) + SE z*)`` with ``z*`` the normal quantile of the
            correction's realized level (NaN for withheld entries; ``-inf`` when nothing
            selected it).
        lows, highs: the interval of each entry: conditional on release for released
            entries with a finite cutoff (:mod:`collector.decoding.selective`), the plain
            ``count ± z SE`` otherwise.
        median_unbiased: the conditionally median-unbiased estimate of a released entry
            (the winner's curse removed); NaN for the others.
        selection_standard_errors: the spread to read with a released entry's estimate: its
            conditional interval's width over ``2 z`` (before ``lows`` is clipped at 0); the
            plain SE far above the cutoff, larger near it. The plain SE for the others.
        conditional: which entries' intervals are conditional on release.
        near_cutoff: the released entries whose estimate lies less than :data:`NEAR_CUTOFF_SE`
            above their cutoff, or whose interval reaches below 0: shown by the interval alone.
    """

    values: tuple[str | bytes, ...]
    counts: Array
    standard_errors: Array
    z: Array
    p_values: Array
    released: BoolArray
    reasons: tuple[str | None, ...]
    tested: int
    n: int
    rule: ReleaseRule
    cutoffs: Array
    lows: Array
    highs: Array
    median_unbiased: Array
    selection_standard_errors: Array
    conditional: BoolArray
    near_cutoff: BoolArray

    @property
    def released_count(self) -> int:
        """How many entries are released."""
        return int(self.released.sum())

    @property
    def withheld_count(self) -> int:
        """How many entries are withheld."""
        return len(self.values) - self.released_count

    def entry(self, i: int) -> ValueEstimate:
        """Entry ``i`` with its interval (conditional on release when released) and test."""
        return ValueEstimate(
            value=self.values[i],
            count=float(self.counts[i]),
            standard_error=float(self.standard_errors[i]),
            low=float(self.lows[i]),
            high=float(self.highs[i]),
            z=float(self.z[i]),
            p_value=float(self.p_values[i]),
        )

    def interval_text(self, i: int) -> str:
        """What entry ``i``'s interval means, for the API, the CLI and the dashboard."""
        level = f"{100 * self.rule.confidence:g} %"
        return f"{level} interval {CONDITIONAL_INTERVAL if self.conditional[i] else PLAIN_INTERVAL}"

    def released_interval_text(self) -> str:
        """What the released entries' intervals mean (every released entry's is conditional
        unless the rule selects nothing: no test and no finite threshold)."""
        rule = self.rule
        selects = rule.alpha is not None or math.isfinite(rule.threshold)
        return f"{100 * rule.confidence:g} % interval {CONDITIONAL_INTERVAL if selects else PLAIN_INTERVAL}"

    def order(self, which: BoolArray) -> list[int]:
        """Indices of the entries where ``which`` holds, largest estimate first (NaN last)."""
        idx = np.flatnonzero(which)
        key = np.nan_to_num(self.counts[idx], nan=-np.inf)
        return [int(i) for i in idx[np.argsort(-key, kind="stable")]]


def release(
    values: Sequence[str | bytes],
    counts: npt.ArrayLike,
    standard_errors: npt.ArrayLike,
    *,
    n: int,
    rule: ReleaseRule,
    eligible: npt.ArrayLike | None = None,
    ineligible_reason: str = "not a value the mechanism can have reported",
) -> Release:
    """Apply ``rule`` to every entry (see the module docstring).

    Args:
        values: the entries.
        counts: their estimated counts.
        standard_errors: their standard errors.
        n: the number of reports of the period.
        rule: the use case's rule.
        eligible: entries that are hypotheses at all (default: all). An ineligible entry
            (an SFP word the puzzle cannot have produced from a padded word) is withheld
            with ``ineligible_reason`` and not counted in the correction.
        ineligible_reason: why ineligible entries are withheld.
    """
    size = len(values)
    c = np.asarray(counts, dtype=np.float64).reshape(size)
    se = np.asarray(standard_errors, dtype=np.float64).reshape(size)
    ok = np.ones(size, dtype=np.bool_) if eligible is None else np.asarray(eligible, dtype=np.bool_).reshape(size)
    null = rule.null
    diff = c - null
    with np.errstate(divide="ignore", invalid="ignore"):
        # A zero SE (no noise at all) decides by the sign; NaN estimates never pass.
        z = np.where(se > 0, diff / se, np.sign(diff) * np.inf)
    z = np.where(np.isnan(c) | np.isnan(se), -np.inf, z)
    z = np.where(np.isnan(z), 0.0, z)
    p = normal_sf(z)
    above = np.nan_to_num(c, nan=-np.inf) >= rule.threshold
    enough = n >= rule.min_reports and n > 0
    passed = np.zeros(size, dtype=np.bool_)
    tested = int(ok.sum())
    level = 1.0
    if rule.alpha is None:
        passed[:] = True
    elif tested:
        level = rejection_level(p[ok], alpha=rule.alpha, control=rule.control)
        passed[ok] = (p[ok] <= level) & (level > 0)
    keep = ok & above & passed & enough
    reasons = _reasons(keep, ok, above, rule=rule, n=n, tested=tested, ineligible_reason=ineligible_reason)
    cutoffs = np.full(size, np.nan)
    cutoffs[keep] = _cutoffs(se[keep], rule, level)
    conditional = keep & np.isfinite(cutoffs)
    lows, highs, median, spread, near = _intervals(c, se, cutoffs, conditional, rule.confidence)
    return Release(
        values=tuple(values),
        counts=c,
        standard_errors=se,
        z=z,
        p_values=p,
        released=keep,
        reasons=reasons,
        tested=tested,
        n=n,
        rule=rule,
        cutoffs=cutoffs,
        conditional=conditional,
        lows=lows,
        highs=highs,
        median_unbiased=median,
        selection_standard_errors=spread,
        near_cutoff=near,
    )


def _reasons(
    keep: BoolArray, ok: BoolArray, above: BoolArray, *, rule: ReleaseRule, n: int, tested: int, ineligible_reason: str
) -> tuple[str | None, ...]:
    """Why each entry is withheld (``None`` for the released ones), the first failed condition."""
    enough = n >= rule.min_reports and n > 0
    test_text = rule.describe()
    reasons: list[str | None] = []
    for i in range(keep.size):
        if keep[i]:
            reasons.append(None)
        elif not enough:
            reasons.append(f"{n} reports; at least {rule.min_reports} are needed before release")
        elif not ok[i]:
            reasons.append(ineligible_reason)
        elif not above[i]:
            reasons.append(f"estimate below the release threshold {rule.threshold:g}")
        else:
            reasons.append(f"not significant over {tested} entries ({test_text})")
    return tuple(reasons)


def _cutoffs(se: Array, rule: ReleaseRule, level: float) -> Array:
    """The smallest estimate that is released, per entry: the count threshold ``T`` and
    ``max(T, 0) + SE z*``, ``z*`` the one-sided quantile of the realized level (whichever is
    larger). The realized level is what the entry crossed with the other entries' p-values as
    they are (``collector.decoding.stats.rejection_level``), so conditioning on it is
    conditioning on the release given the others."""
    out = np.full(se.shape, float(rule.threshold))
    if rule.alpha is not None and 0.0 < level < 1.0:
        out = np.maximum(out, rule.null - normal_quantile(level) * se)
    return out


def _intervals(
    c: Array, se: Array, cutoffs: Array, conditional: BoolArray, confidence: float
) -> tuple[Array, Array, Array, Array, BoolArray]:
    """Plain intervals for every entry, then the conditional ones, the median-unbiased
    estimates, the selection-adjusted spreads and which are near the cutoff, of the
    ``conditional`` entries (the released entries a finite cutoff selected; docs/estimation.md,
    "Intervals after selection")."""
    zc = z_interval(confidence)
    with np.errstate(invalid="ignore"):
        lows, highs = c - zc * se, c + zc * se
    median = np.full(c.shape, np.nan)
    spread = se.copy()
    near = np.zeros(c.shape, dtype=np.bool_)
    if conditional.any():
        m, lo, hi = conditional_interval(c[conditional], se[conditional], cutoffs[conditional], confidence=confidence)
        median[conditional] = np.maximum(m, 0.0)
        with np.errstate(invalid="ignore"):
            width = hi - lo
        spread[conditional] = np.where(np.isfinite(width), width / (2.0 * zc), np.inf)
        # Counts are never negative: the interval shown is its part at or above 0, which keeps
        # the coverage (an interval wholly below 0 is one of the α that miss, shown as [0, 0]).
        lows[conditional] = np.maximum(lo, 0.0)
        highs[conditional] = np.maximum(hi, 0.0)
        with np.errstate(invalid="ignore"):
            above = (c[conditional] - cutoffs[conditional]) / se[conditional]
        near[conditional] = ~(above >= NEAR_CUTOFF_SE) | (lo < 0.0)
    return lows, highs, median, spread, near
