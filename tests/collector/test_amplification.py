"""The central (ε, δ) of a shuffled batch (collector/amplification.py): the published figures of
the bound it implements, an exact computation on small batches, an exact shuffled randomized
response it must cover, and its monotonicity in n and in the local ε."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest

from collector.amplification import (
    DELTA_CAP,
    _central_epsilon,
    bound_reports,
    central_epsilon,
    default_delta,
    shuffle_delta,
)

# The published output of the reference implementation of Feldman, McMillan, Talwar, "Hiding
# Among the Clones" (FOCS 2021; arXiv 2012.12803, Appendix E), for its own example: shuffling
# n = 100,000 reports of ε0 = 4 gives (ε, 10^-6)-DP "for eps between 0.1675385583317841 and
# 0.172790550755978" (the numerical bound, bracketed by its lower and upper evaluations), where
# the paper's closed form (Theorem 3.1) gives "at most 0.5378040242374512".
REFERENCE_N = 100_000
REFERENCE_EPSILON0 = 4.0
REFERENCE_DELTA = 1e-6
REFERENCE_LOW = 0.1675385583317841
REFERENCE_HIGH = 0.172790550755978
REFERENCE_CLOSED_FORM = 0.5378040242374512


def test_the_published_example_of_the_numerical_bound() -> None:
    """n = 10^5, ε0 = 4, δ = 10^-6: inside the published bracket, far below the closed form."""
    epsilon = central_epsilon(REFERENCE_EPSILON0, REFERENCE_N, REFERENCE_DELTA)
    assert REFERENCE_LOW <= epsilon <= REFERENCE_HIGH
    assert epsilon < REFERENCE_CLOSED_FORM / 3
    # The ε found is the smallest the bound allows, to the bisection's resolution: its δ is
    # within the target, and a slightly smaller ε is not.
    assert shuffle_delta(REFERENCE_EPSILON0, REFERENCE_N, epsilon) <= REFERENCE_DELTA
    assert shuffle_delta(REFERENCE_EPSILON0, REFERENCE_N, epsilon * (1 - 1e-3)) > REFERENCE_DELTA


def _exact_delta(epsilon0: float, n: int, epsilon: float) -> float:
    """The hockey-stick divergence of FMT21's P and Q summed over every (c, a), in fractions
    where the binomials allow (small n only)."""
    p = math.exp(-epsilon0)
    q = math.exp(epsilon0) / (math.exp(epsilon0) + 1)
    e = math.exp(epsilon)
    total = 0.0
    for c in range(n):
        weight = math.comb(n - 1, c) * p**c * (1 - p) ** (n - 1 - c)

        def b(a: int, c: int = c) -> float:
            return float(Fraction(math.comb(c, a), 2**c)) if 0 <= a <= c else 0.0

        for a in range(c + 2):
            big_p = q * b(a - 1) + (1 - q) * b(a)
            big_q = (1 - q) * b(a - 1) + q * b(a)
            total += weight * max(0.0, big_p - e * big_q)
    return total


@pytest.mark.parametrize(("epsilon0", "n"), [(1.0, 1), (1.0, 2), (1.0, 30), (3.0, 40), (0.3, 25)])
def test_small_batches_match_the_bound_summed_term_by_term(epsilon0: float, n: int) -> None:
    """Where every c is computed (no grid), δ(ε) is the divergence summed over every outcome."""
    for epsilon in (0.0, epsilon0 / 4, epsilon0 / 2, 0.9 * epsilon0):
        exact = _exact_delta(epsilon0, n, epsilon)
        assert shuffle_delta(epsilon0, n, epsilon) == pytest.approx(exact, rel=1e-9, abs=1e-15)


def _shuffled_rr_delta(epsilon0: float, n: int, epsilon: float) -> float:
    """The exact δ(ε) of shuffled binary randomized response (only the count of ones is seen),
    worst case over the other n - 1 bits, for the neighbours (0, rest) and (1, rest)."""
    keep = math.exp(epsilon0) / (math.exp(epsilon0) + 1)

    def counts(ones: int, zeros: int) -> list[float]:
        # The number of reported ones: each 1 kept with probability keep, each 0 flipped.
        dist = [1.0]
        for truth in [1] * ones + [0] * zeros:
            up = keep if truth else 1 - keep
            dist = [
                (dist[i] if i < len(dist) else 0) * (1 - up) + (dist[i - 1] * up if i else 0)
                for i in range(len(dist) + 1)
            ]
        return dist

    worst = 0.0
    for others in range(n):
        first = counts(others + 1, n - 1 - others)
        second = counts(others, n - others)
        for a, b in ((first, second), (second, first)):
            worst = max(worst, sum(max(0.0, x - math.exp(epsilon) * y) for x, y in zip(a, b, strict=True)))
    return worst


@pytest.mark.parametrize(("epsilon0", "n"), [(1.0, 10), (2.0, 40), (0.5, 60)])
def test_the_bound_covers_an_exactly_computed_shuffled_randomized_response(epsilon0: float, n: int) -> None:
    """The bound's δ is never below the true δ of a mechanism it covers (an upper bound), and
    the ε it gives for a δ has at most that δ in truth."""
    for epsilon in (0.1 * epsilon0, 0.3 * epsilon0, 0.6 * epsilon0):
        assert shuffle_delta(epsilon0, n, epsilon) >= _shuffled_rr_delta(epsilon0, n, epsilon) - 1e-12
    epsilon = central_epsilon(epsilon0, n, 1e-3)
    assert _shuffled_rr_delta(epsilon0, n, epsilon) <= 1e-3


SIZES = [1, 2, 5, 10, 30, 100, 300, 1_000, 3_000, 10_000, 100_000, 1_000_000, 10_000_000]
LOCAL = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]


@pytest.mark.parametrize("epsilon0", LOCAL)
def test_more_reports_never_weaken_the_bound(epsilon0: float) -> None:
    """ε is non-increasing in n at a fixed δ, and never above ε0."""
    figures = [central_epsilon(epsilon0, n, 1e-6) for n in SIZES]
    assert all(later <= earlier for earlier, later in itertools.pairwise(figures)), figures
    assert all(0 < f <= epsilon0 for f in figures)
    assert figures[-1] < epsilon0 / 2  # a million reports amplify every local ε tried


@pytest.mark.parametrize("n", [10, 1_000, 100_000, 1_000_000])
def test_a_larger_local_epsilon_never_gives_a_smaller_central_one(n: int) -> None:
    """ε is non-decreasing in ε0 at a fixed n and δ."""
    figures = [central_epsilon(epsilon0, n, 1e-6) for epsilon0 in LOCAL]
    assert all(later >= earlier for earlier, later in itertools.pairwise(figures)), figures


def test_a_small_batch_degrades_to_the_local_epsilon() -> None:
    """One report is exactly as private as itself: the bound gives ε0 less what δ buys (δ(ε) =
    q - e^ε (1 - q) for n = 1); a few reports barely help; thousands do."""
    for epsilon0 in LOCAL:
        q = math.exp(epsilon0) / (math.exp(epsilon0) + 1)
        one = math.log((q - 1e-6) / (1 - q))
        assert central_epsilon(epsilon0, 1, 1e-6) == pytest.approx(one, abs=1e-9)
    assert central_epsilon(1.0, 10, 1e-6) > 0.99
    assert central_epsilon(1.0, 100, 1e-6) > 0.6
    assert central_epsilon(1.0, 10_000, 1e-6) < 0.06


def test_the_figure_is_computed_once_per_local_epsilon_n_and_delta() -> None:
    """A second request for the same (ε0, n, δ) is the cache's answer."""
    _central_epsilon.cache_clear()
    first = central_epsilon(2.0, 54_321, 1e-7)
    second = central_epsilon(2.0, 54_321, 1e-7)
    info = _central_epsilon.cache_info()
    assert first == second
    assert (info.hits, info.misses) == (1, 1)


def test_the_default_delta_and_the_rounded_n() -> None:
    """δ = min(10^-6, n^-1.1); n rounded down to two significant figures, exact below 100."""
    assert default_delta(1) == DELTA_CAP
    assert default_delta(100_000) == DELTA_CAP
    assert default_delta(1_000_000) == pytest.approx(1_000_000**-1.1)
    assert all(default_delta(n) < 1 / n for n in SIZES)
    assert [bound_reports(n) for n in (1, 99, 100, 1_234, 99_999, 1_000_000, 1_234_567)] == [
        1,
        99,
        100,
        1_200,
        99_000,
        1_000_000,
        1_200_000,
    ]
    assert all(0.9 * n <= bound_reports(n) <= n for n in range(1, 5_000, 7))


def test_arguments_outside_the_bound_are_refused() -> None:
    with pytest.raises(ValueError, match="ε0"):
        central_epsilon(0.0, 10)
    with pytest.raises(ValueError, match="one report"):
        central_epsilon(1.0, 0)
    with pytest.raises(ValueError, match="δ"):
        central_epsilon(1.0, 10, 1.0)
