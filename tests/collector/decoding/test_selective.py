"""Intervals conditional on release (docs/estimation.md, "Intervals after selection"): exact
against SciPy, covering at their level among released entries, the plain interval far above
the cutoff. Every simulation is seeded; tolerances are binomial standard errors of a coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps

from collector.decoding.release import ReleaseRule, release
from collector.decoding.selective import conditional_interval, log_normal_sf
from collector.decoding.stats import normal_sf, reject, rejection_level


def _reference(x: float, a: float, s: float, probability: float) -> float:
    """``C`` with ``Pr[X >= x | X >= a; C] = probability``, solved by SciPy."""

    def gap(mu: float) -> float:
        return math.exp(sps.norm.logsf((x - mu) / s) - sps.norm.logsf((a - mu) / s)) - probability

    low = x - 50 * s
    while gap(low) > 0:
        low -= 2 * (x - low)
    return float(optimize.brentq(gap, low, x + 10 * s, xtol=1e-10 * s))


def _within(observed: float, expected: float, trials: int, sds: float = 4.0) -> bool:
    return abs(observed - expected) <= sds * math.sqrt(expected * (1 - expected) / trials)


def test_log_tail_matches_scipy_into_the_far_tail() -> None:
    """log Pr[Z >= t] to 1e-11 (absolute, or 1e-12 relative) from -40 to 10^4, across the switch to the series at 30."""
    t = np.array([-40.0, -5.0, 0.0, 3.0, 29.9, 30.0, 30.1, 50.0, 300.0, 1e4])
    assert np.allclose(log_normal_sf(t), sps.norm.logsf(t), rtol=1e-12, atol=1e-11)


@pytest.mark.parametrize("x", [1000.5, 1010.0, 1100.0, 1300.0, 2000.0, 1e5])
def test_bounds_and_median_solve_their_equations(x: float) -> None:
    """L, U and the median-unbiased estimate equal SciPy's root of the same equation."""
    med, low, high = conditional_interval([x], [100.0], [1000.0], confidence=0.95)
    for got, probability in ((med[0], 0.5), (low[0], 0.025), (high[0], 0.975)):
        assert got == pytest.approx(_reference(x, 1000.0, 100.0, probability), rel=1e-7, abs=1e-4)


def test_far_above_the_cutoff_the_interval_is_the_plain_one() -> None:
    """At 40 SE above the cutoff: x ± 1.96 SE and the median x, to 1e-6 SE."""
    x = 1000.0 + 40 * 50.0
    med, low, high = conditional_interval([x], [50.0], [1000.0], confidence=0.95)
    z = sps.norm.ppf(0.975)
    assert low[0] == pytest.approx(x - z * 50.0, abs=5e-5)
    assert high[0] == pytest.approx(x + z * 50.0, abs=5e-5)
    assert med[0] == pytest.approx(x, abs=5e-5)


def test_bounds_grow_with_the_estimate_and_widen_near_the_cutoff() -> None:
    """L, U and the median increase with x; the width shrinks towards 2·1.96 SE as x leaves the cutoff."""
    x = 1000.0 + np.array([0.01, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0]) * 100.0
    med, low, high = conditional_interval(x, 100.0, 1000.0, confidence=0.9)
    for values in (med, low, high):
        assert (np.diff(values) > 0).all()
    width = high - low
    assert (np.diff(width) < 0).all()
    assert width[-1] == pytest.approx(2 * sps.norm.ppf(0.95) * 100.0, rel=1e-3)
    assert (high < x + sps.norm.ppf(0.95) * 100.0 + 1e-6).all()  # never above the plain upper end


def test_edge_cases() -> None:
    """On the cutoff the bounds run to -inf; a zero SE gives the point; a NaN SE gives NaN and ±inf;
    a bad level is refused."""
    med, low, high = conditional_interval(
        [1000.0, 5.0, 7.0], [100.0, 0.0, math.nan], [1000.0, 0.0, 0.0], confidence=0.95
    )
    assert low[0] == -math.inf
    assert high[0] < 0.0
    assert (med[1], low[1], high[1]) == (5.0, 5.0, 5.0)
    assert math.isnan(med[2])
    assert (low[2], high[2]) == (-math.inf, math.inf)
    with pytest.raises(ValueError, match="confidence"):
        conditional_interval([1.0], [1.0], [0.0], confidence=1.0)


def test_conditional_interval_covers_among_released_and_the_plain_one_does_not() -> None:
    """Fixed cutoff, truths spread around it: 40,000 seeded draws; the conditional interval covers
    0.95 of the released within 4 binomial SEs, the plain one falls short by more than that, and
    the median-unbiased estimate is below the truth half the time."""
    gen = np.random.default_rng(24)
    s, a = 1.0, 3.0
    truth = gen.uniform(1.0, 4.0, 40_000)
    x = truth + s * gen.standard_normal(truth.size)
    kept = x >= a
    med, low, high = conditional_interval(x[kept], s, a, confidence=0.95)
    t = truth[kept]
    released = int(kept.sum())
    covered = float(np.mean((low <= t) & (t <= high)))
    plain = float(np.mean(np.abs(x[kept] - t) <= 1.959964 * s))
    assert _within(covered, 0.95, released), covered
    assert plain < 0.95 - 4 * math.sqrt(0.95 * 0.05 / released), plain
    assert _within(float(np.mean(med <= t)), 0.5, released), float(np.mean(med <= t))


@pytest.mark.parametrize("control", ["storey", "bonferroni"])
def test_release_intervals_cover_under_the_other_corrections(control: str) -> None:
    """Storey's adaptive BH (a data-dependent level too) and Bonferroni, 40 seeded draws as below:
    released entries' intervals cover 0.95 within 4 binomial SEs."""
    gen = np.random.default_rng(8)
    weights = np.arange(1, 5_001, dtype=np.float64) ** -1.1
    rule = ReleaseRule(threshold=1_000.0, control=control, alpha=0.05)
    covered: list[bool] = []
    for _ in range(40):
        truth = gen.multinomial(300_000, weights / weights.sum()).astype(np.float64)
        counts = truth + 430.0 * gen.standard_normal(truth.size)
        detail = release([str(i) for i in range(truth.size)], counts, np.full(truth.size, 430.0), n=300_000, rule=rule)
        idx = np.flatnonzero(detail.released)
        covered.extend(((detail.lows[idx] <= truth[idx]) & (truth[idx] <= detail.highs[idx])).tolist())
    assert len(covered) > 300
    assert _within(float(np.mean(covered)), 0.95, len(covered)), float(np.mean(covered))


def test_release_intervals_cover_with_the_realized_benjamini_hochberg_cutoff() -> None:
    """The release rule (T = 1,000, BH at 0.05) on Zipf-like truths, SE 430, 60 seeded draws: the
    released entries' intervals cover 0.95 within 4 binomial SEs; the selection-adjusted SE makes the
    RMS error of the shown count at most 1.15 of it, where the plain SE does not; the
    median-unbiased estimate's RMS error is larger than the count's."""
    gen = np.random.default_rng(7)
    weights = np.arange(1, 5_001, dtype=np.float64) ** -1.1
    rule = ReleaseRule(threshold=1_000.0, control="bh", alpha=0.05)
    covered: list[bool] = []
    shown: list[float] = []
    plain: list[float] = []
    median: list[float] = []
    for _ in range(60):
        truth = gen.multinomial(300_000, weights / weights.sum()).astype(np.float64)
        counts = truth + 430.0 * gen.standard_normal(truth.size)
        values = [str(i) for i in range(truth.size)]
        detail = release(values, counts, np.full(truth.size, 430.0), n=300_000, rule=rule)
        idx = np.flatnonzero(detail.released)
        assert detail.conditional[idx].all()
        t = truth[idx]
        covered.extend((detail.lows[idx] <= t) & (t <= detail.highs[idx]))
        shown.extend((counts[idx] - t) / detail.selection_standard_errors[idx])
        plain.extend((counts[idx] - t) / 430.0)
        median.extend((detail.median_unbiased[idx] - t) / 430.0)
    released = len(covered)
    assert released > 500
    assert _within(float(np.mean(covered)), 0.95, released), float(np.mean(covered))
    assert math.sqrt(float(np.mean(np.square(shown)))) <= 1.15
    assert math.sqrt(float(np.mean(np.square(shown)))) < math.sqrt(float(np.mean(np.square(plain))))
    # The median-unbiased estimate pays for its lack of bias near the cutoff: its RMS error is
    # larger than the shown count's (docs/estimation.md, "Which point estimate").
    assert math.sqrt(float(np.mean(np.square(median)))) > math.sqrt(float(np.mean(np.square(plain))))


def test_withheld_entries_keep_the_plain_interval() -> None:
    """A withheld entry's interval is count ± z SE and says so; a rule that selects nothing gives plain intervals."""
    detail = release(["a", "b"], [5_000.0, 900.0], [100.0, 100.0], n=10_000, rule=ReleaseRule(threshold=1_000.0))
    assert detail.released.tolist() == [True, False]
    assert detail.lows[1] == pytest.approx(900.0 - 1.959964 * 100.0, rel=1e-6)
    assert "conditional on release" in detail.interval_text(0)
    assert "not conditional" in detail.interval_text(1)
    assert math.isnan(detail.median_unbiased[1])
    free = release(["a"], [5.0], [1.0], n=10, rule=ReleaseRule(threshold=-math.inf, alpha=None))
    assert not free.conditional[0]
    assert "not conditional" in free.released_interval_text()


@pytest.mark.parametrize("control", ["bh", "storey", "bonferroni", "pfer"])
def test_reject_is_p_at_most_the_realized_level(control: str) -> None:
    """For every correction, reject() is exactly p <= rejection_level() (seeded p-values, ties included)."""
    gen = np.random.default_rng(3)
    for trial in range(200):
        p = gen.random(40) ** gen.choice([1.0, 4.0, 20.0])
        if trial % 5 == 0:
            p[:6] = p[0]
        alpha = 2.0 if control == "pfer" else 0.1
        level = rejection_level(p, alpha=alpha, control=control)
        assert (reject(p, alpha=alpha, control=control) == ((p <= level) & (level > 0))).all()


def test_normal_sf_and_log_tail_agree() -> None:
    """The two tail functions agree where both are representable."""
    t = np.linspace(-8, 30, 77)
    assert np.allclose(np.exp(log_normal_sf(t)), normal_sf(t), rtol=1e-11, atol=0)


def test_an_estimate_that_barely_crossed_is_shown_by_its_interval_alone() -> None:
    """Below 2 SE above the cutoff (or with an interval reaching under 0) an entry is near the cutoff;
    from there up its count, spread and interval agree: centre within 0.21 SE, spread within 10.5 %."""
    rule = ReleaseRule(threshold=1_000.0, alpha=None)
    counts = np.array([1_010.0, 1_150.0, 1_199.0, 1_200.0, 1_300.0, 2_000.0])
    detail = release([str(c) for c in counts], counts, np.full(counts.size, 100.0), n=10_000, rule=rule)
    assert detail.released.all()
    assert detail.near_cutoff.tolist() == [True, True, True, False, False, False]
    far = ~detail.near_cutoff
    centre = (detail.lows[far] + detail.highs[far]) / 2
    assert np.all(np.abs(centre - counts[far]) <= 0.21 * 100.0)
    assert np.all(np.abs(detail.selection_standard_errors[far] / 100.0 - 1) <= 0.105)
    # The barely released one: its interval runs far below the estimate, not count ± z spread.
    assert counts[0] - detail.lows[0] > 3 * (detail.highs[0] - counts[0])
    # A cutoff at 0 (T = 0, no test): an interval clipped at 0 is near the cutoff however far above.
    low = release(["a"], [150.0], [100.0], n=10_000, rule=ReleaseRule(threshold=0.0, alpha=None))
    assert low.near_cutoff.tolist() == [True]
    assert low.lows[0] == 0.0
