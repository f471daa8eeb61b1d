"""The central (ε, δ) a period's shuffled batch enjoys: amplification by shuffling.

The collector strips every identity from the reports it folds and permutes each commit's
reports before folding them (docs/privacy-accounting.md, "The central guarantee"). Whoever
reads only what comes out of it (the stored sums, the estimates) sees the outcome of n
local ε0-randomizers in random order, and that is (ε, δ)-differentially private for an ε far
below ε0 once n is large. This module computes that ε with the numerical bound of Feldman,
McMillan and Talwar ("Hiding Among the Clones", FOCS 2021, §3 and Appendix E; FMT21 in
docs/privacy-accounting.md), written here from its statement:

    Let p = e^-ε0, q = e^ε0 / (e^ε0 + 1), C ~ Bin(n - 1, p), A ~ Bin(C, 1/2) and
    Δ ~ Bern(q). With P = (A + Δ, C - A + 1 - Δ) and Q = (A + 1 - Δ, C - A + Δ), the shuffled
    batch is (ε, δ)-DP whenever P and Q are (ε, δ)-indistinguishable.

Each of the other n - 1 reports is, with probability p, a "clone" that could have come from
either value of the one report that differs; A counts the clones that look like the first
value. P and Q mirror each other (swap the two coordinates), so one hockey-stick divergence
δ(ε) = Σ_c Pr[C = c] D_c(ε), with D_c(ε) = Σ_a max(0, P(a | c) - e^ε Q(a | c)), is the δ of ε.

How it is computed, and why each step keeps an upper bound:

* Given C = c, P(a)/Q(a) grows with a, so D_c(ε) is a sum over the a above one cutoff, which
  the upper tails of Bin(c, 1/2) give in closed form (:func:`_divergence_given`).
* D_c is non-increasing in c: the batch with c + 1 clones is the one with c clones plus one
  more fair coin, a post-processing that does not depend on the secret. So on a grid of c,
  every c of a cell [g_i, g_{i+1}) is charged D at g_i, its left end.
* The binomials are computed in a window of 12 standard deviations (and 8) around their
  means, from the ratios of neighbouring terms, and normalized in it. The mass of C outside
  its window is charged in full, at Chernoff's bound; each tail of Bin(c, 1/2) is off by at
  most the mass outside its own window (Hoeffding: 2e^-72), charged on every D_c.
* ε is found by bisection on [0, ε0] and the upper end is returned: δ(ε) is non-increasing
  in ε, and D_c vanishes at ε0, so the answer never exceeds ε0 (a batch of one report is
  exactly as private as the report).

The result is cached per (ε0, n, δ): it sits on the estimate path (collector.estimation)
and the period's n changes only when reports arrive.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "BOUND",
    "DELTA_CAP",
    "DELTA_EXPONENT",
    "bound_reports",
    "central_epsilon",
    "default_delta",
    "shuffle_delta",
]

BOUND: Final = "Feldman-McMillan-Talwar 2021, numerical"
"""The bound's name, as results state it."""

DELTA_CAP: Final = 1e-6
"""The largest δ the collector states: one in a million."""

DELTA_EXPONENT: Final = 1.1
"""δ is at most n^-1.1, below 1/n: a δ of 1/n would allow one report in the batch to be
published outright."""

_SPREAD: Final = 12.0
"""Standard deviations kept on each side of a binomial's mean; the rest is charged in full."""

_GRID: Final = 48
"""Points of the grid of c when the range of C holds more integers than that."""

_BISECTIONS: Final = 48
"""Bisection steps on [0, ε0]: ε is returned to ε0 · 2^-48."""

_LEFT_OUT: Final = 2.0 * math.exp(-(_SPREAD**2) / 2.0)
"""Hoeffding's bound on the mass of Bin(c, 1/2) farther than _SPREAD deviations from c/2."""


def default_delta(n: int) -> float:
    """The δ stated for a batch of ``n`` reports: ``min(1e-6, n^-1.1)``."""
    return min(DELTA_CAP, math.pow(max(n, 1), -DELTA_EXPONENT))


def bound_reports(n: int) -> int:
    """``n`` rounded down to two significant figures (exact below 100): the n the bound is
    computed for. Fewer reports only weaken the bound (ε is non-increasing in n), and a
    period's figure is then computed once per few commits rather than at every commit."""
    if n < 100:
        return n
    scale = int(math.pow(10, len(str(n)) - 2))
    return n // scale * scale


def _window(total: int, mean: float, sd: float) -> tuple[int, int]:
    """The integers within _SPREAD deviations (and 8 more) of ``mean``, clipped to [0, total]."""
    reach = _SPREAD * sd + 8.0
    return max(0, math.floor(mean - reach)), min(total, math.ceil(mean + reach))


def _relative_pmf(total: int, p: float, low: int, high: int) -> npt.NDArray[np.float64]:
    """Pr[Bin(total, p) = k] for k = low .. high, up to one common factor (1 at ``low``), from
    the ratios of neighbours: the caller normalizes, so no difference of large lgamma values
    (which loses eight digits at n = 10^7) enters the result."""
    k = np.arange(low, high, dtype=np.float64)
    # log Pr[k + 1] - log Pr[k] = log((total - k) / (k + 1)) + log(p / (1 - p))
    steps = np.log((total - k) / (k + 1.0)) + (math.log(p) - math.log1p(-p))
    return np.exp(np.concatenate(([0.0], np.cumsum(steps))))


def _outside(total: int, p: float, low: int, high: int) -> float:
    """Chernoff's bound on the mass of Bin(total, p) outside [low, high], the window of
    :func:`_window` around its mean: Pr[X >= k] <= e^(-total KL(k/total || p)) above the mean,
    and the same below it (0 for a side the window reaches the end of)."""

    def divergence(a: float) -> float:
        # KL(a || p) of two Bernoulli distributions, 0 log 0 = 0.
        first = a * math.log(a / p) if a > 0 else 0.0
        second = (1 - a) * math.log((1 - a) / (1 - p)) if a < 1 else 0.0
        return first + second

    above = math.exp(-total * divergence((high + 1) / total)) if high < total else 0.0
    below = math.exp(-total * divergence((low - 1) / total)) if low > 0 else 0.0
    return above + below


class _HalfTails:
    """Upper tails S(j) = Pr[Bin(c, 1/2) >= j] of each c of the grid, for j from just below
    c/2 (1 further down, 0 past the kept window: the mass left out above is charged
    separately, _LEFT_OUT). The cutoff a0 of :func:`_divergence_given` is never below c/2,
    since β >= 1/2 for every ε >= 0, so the lower half is never read; it enters only through
    the normalization, by symmetry: b(a) = b(c - a)."""

    def __init__(self, cs: npt.NDArray[np.int64]) -> None:
        self.lows = np.maximum(cs // 2 - 2, 0)
        highs = np.array([_window(int(c), c / 2.0, math.sqrt(c) / 2.0)[1] for c in cs], dtype=np.int64)
        width = int((highs - self.lows).max()) + 1
        k = self.lows[:, None] + np.arange(width - 1)[None, :]
        c = cs[:, None]
        inside = k < highs[:, None]  # k + 1 still in the window
        # log b(k + 1) - log b(k) = log((c - k)/(k + 1)); -inf past the window's end.
        steps = np.where(inside, np.log(np.where(inside, c - k, 1) / (k + 1.0)), -np.inf)
        logs = np.concatenate((np.zeros((len(cs), 1)), np.cumsum(steps, axis=1)), axis=1)
        zeros = np.zeros((len(cs), 1))
        tails = np.concatenate((np.cumsum(np.exp(logs)[:, ::-1], axis=1)[:, ::-1], zeros), axis=1)
        self.rows = np.arange(len(cs))
        # The window [c - high, high] is the sum of the tails from low and from c - low + 1.
        mirrored = np.clip(cs - self.lows + 1 - self.lows, 0, tails.shape[1] - 1)
        self.tails = tails / (tails[:, 0] + tails[self.rows, mirrored])[:, None]

    def at(self, j: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """S(j[i]) of the grid's i-th c."""
        index = np.clip(j - self.lows, 0, self.tails.shape[1] - 1)
        return np.where(j < self.lows, 1.0, self.tails[self.rows, index])


def _divergence_given(
    c: npt.NDArray[np.int64], tails: _HalfTails, epsilon: float, epsilon0: float
) -> npt.NDArray[np.float64]:
    """D_c(ε) for each c of the grid.

    P(a | c) = q b(a - 1) + (1 - q) b(a) and Q(a | c) = (1 - q) b(a - 1) + q b(a), with b the
    pmf of Bin(c, 1/2). With r = b(a - 1)/b(a) = a/(c + 1 - a), P > e^ε Q exactly when
    r > r* = (e^ε q - (1 - q))/(q - e^ε (1 - q)), that is a > β(c + 1) with β = r*/(1 + r*);
    summing over those a gives q S(a0 - 1) + (1 - q) S(a0) - e^ε ((1 - q) S(a0 - 1) + q S(a0)),
    a0 = ⌊β(c + 1)⌋ + 1.
    """
    q = 1.0 / (1.0 + math.exp(-epsilon0))
    e = math.exp(epsilon)
    denominator = q - e * (1.0 - q)
    if epsilon >= epsilon0 or denominator <= 0.0:
        return np.zeros(len(c))
    ratio = (e * q - (1.0 - q)) / denominator
    beta = ratio / (1.0 + ratio)
    a0 = np.floor(beta * (c + 1)).astype(np.int64) + 1
    s_before = tails.at(a0 - 1)
    s_at = tails.at(a0)
    d = q * s_before + (1.0 - q) * s_at - e * ((1.0 - q) * s_before + q * s_at)
    # Each S is off by at most _LEFT_OUT, and the S enter with weights summing to 1 + e^ε.
    return np.maximum(d, 0.0) + (1.0 + e) * _LEFT_OUT


class _Clones:
    """The distribution of C ~ Bin(n - 1, e^-ε0) cut into grid cells, with each cell's left
    end's tails of Bin(c, 1/2)."""

    def __init__(self, epsilon0: float, n: int) -> None:
        p = math.exp(-epsilon0)
        total = n - 1
        sd = math.sqrt(total * p * (1.0 - p))
        low, high = _window(total, total * p, sd)
        pmf = _relative_pmf(total, p, low, high)
        pmf /= pmf.sum()  # within the window; what lies outside is charged in full below
        if high - low + 1 <= _GRID:
            starts = np.arange(low, high + 1, dtype=np.int64)
        else:
            # Denser where C's mass is: u|u| for u evenly spaced puts half the points within
            # 3 deviations of the mean.
            u = np.linspace(-math.sqrt(_SPREAD), math.sqrt(_SPREAD), _GRID)
            warped = total * p + sd * u * np.abs(u)
            starts = np.clip(np.floor(warped), low, high).astype(np.int64)
            starts[0] = low
            starts = starts[np.concatenate(([True], np.diff(starts) > 0))]
        # A cell runs from its start to the next one's; its mass is charged D at its start.
        bounds = np.append(starts - low, high - low + 1)
        cumulative = np.concatenate(([0.0], np.cumsum(pmf)))
        self.mass = cumulative[bounds[1:]] - cumulative[bounds[:-1]]
        self.outside = _outside(total, p, low, high)
        self.starts = starts
        self.tails = _HalfTails(starts)
        self.epsilon0 = epsilon0

    def delta(self, epsilon: float) -> float:
        """An upper bound on the δ of P and Q at ``epsilon``."""
        d = _divergence_given(self.starts, self.tails, epsilon, self.epsilon0)
        return min(1.0, float(np.dot(self.mass, np.minimum(d, 1.0))) + self.outside)


def shuffle_delta(epsilon0: float, n: int, epsilon: float) -> float:
    """An upper bound on the δ at which ``n`` shuffled ε0-randomizers are (ε, δ)-DP (FMT21)."""
    _check(epsilon0, n)
    return _Clones(epsilon0, n).delta(epsilon)


def central_epsilon(epsilon0: float, n: int, delta: float | None = None) -> float:
    """The ε at which ``n`` shuffled ε0-DP reports are (ε, δ)-DP, by FMT21's numerical bound.

    Never above ``epsilon0``; ``delta`` defaults to :func:`default_delta` of ``n``. Cached
    per (ε0, n, δ).

    Raises:
        ValueError: ε0 not positive and finite, n below 1, or δ outside (0, 1).
    """
    return _central_epsilon(float(epsilon0), int(n), default_delta(n) if delta is None else float(delta))


@lru_cache(maxsize=1024)
def _central_epsilon(epsilon0: float, n: int, delta: float) -> float:
    _check(epsilon0, n)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"δ must lie in (0, 1), not {delta}")
    clones = _Clones(epsilon0, n)
    low, high = 0.0, epsilon0
    if clones.delta(low) <= delta:
        return 0.0
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2.0
        if clones.delta(middle) <= delta:
            high = middle
        else:
            low = middle
    return high


def _check(epsilon0: float, n: int) -> None:
    if not (math.isfinite(epsilon0) and epsilon0 > 0.0):
        raise ValueError(f"ε0 must be positive and finite, not {epsilon0}")
    if n < 1:
        raise ValueError(f"a batch holds at least one report, not {n}")
