"""Intervals and estimates of a normal estimate that is read only because it was released.

A released entry's estimate ``X ~ N(C, s²)`` is released when it crosses a cutoff ``a``
(:mod:`collector.decoding.release`: ``X >= max(T, null + s z*)``, ``z*`` the normal quantile
of the correction's realized p-value level). Among released entries ``X`` is not
``N(C, s²)`` but that law truncated to ``X >= a``, so ``X ± 1.96 s`` covers ``C`` less than
95 % of the time near the cutoff (the entries released because their noise was positive:
the winner's curse). The interval that holds *conditionally on the release* inverts the
truncated normal's distribution function in ``C`` (Lee, Sun, Sun and Taylor, Ann. Statist.
44:907-927, 2016, §5; for thresholded Gaussian estimates, Reid, Taylor and Tibshirani,
Statistica Sinica 28:1-29, 2018):

    G(C) = Pr[X' >= x | X' >= a],  X' ~ N(C, s²),

is continuous and increasing in ``C`` (the truncated normal has a monotone likelihood
ratio), so ``{C : α/2 <= G(C) <= 1 - α/2}`` is an interval ``[L, U]`` with
``G(L) = α/2`` and ``G(U) = 1 - α/2``, and ``Pr[L <= C <= U | X >= a] = 1 - α`` exactly for
every ``C``. ``G(Ĉ) = 1/2`` gives the conditionally median-unbiased estimate ``Ĉ``.

Far above the cutoff ``Pr[X' >= a] -> 1`` and ``[L, U]`` becomes ``x ± z s``; just above it
``L`` runs far below ``x`` (an estimate that barely crossed says little about how far
below the cutoff the truth may be). ``(U - L) / (2 z)`` is then the spread to read with a
released estimate: it is ``s`` far above the cutoff and grows near it, where the released
estimate's error is no longer ``N(0, s²)`` (the callers clip ``L`` at 0 for display, since
counts are never negative, which keeps the coverage).

Numerics: ``G`` is a ratio of normal tail probabilities, computed as a difference of their
logarithms (:func:`log_normal_sf`, exact through ``math.erfc`` up to 30 SE and an
asymptotic series beyond, where ``erfc`` underflows), and solved by bisection, which needs
nothing but the monotonicity.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from collector.decoding.arrays import Array

__all__ = ["conditional_interval", "log_normal_sf"]

_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_ASYMPTOTIC_FROM = 30.0
_BISECTIONS = 200
_FAR = 1e7
"""The farthest below the cutoff (in SE) a bound is looked for; beyond it the bound is ``-inf``."""
_erfc = np.frompyfunc(math.erfc, 1, 1)


def log_normal_sf(t: npt.ArrayLike) -> Array:
    """``log Pr[Z >= t]`` for a standard normal ``Z``, elementwise, accurate for any finite ``t``."""
    arr = np.asarray(t, dtype=np.float64)
    out = np.empty_like(arr)
    near = arr < _ASYMPTOTIC_FROM
    with np.errstate(divide="ignore"):
        out[near] = np.log(0.5 * np.asarray(_erfc(arr[near] / _SQRT2), dtype=np.float64))
    far = arr[~near]
    if far.size:
        # Mills' ratio: Pr[Z >= t] = φ(t)/t (1 - 1/t² + 3/t⁴ - 15/t⁶ + 105/t⁸ - ...), relative
        # error below 945/t¹⁰ (2·10^-12) at t >= 30.
        inv2 = 1.0 / far**2
        series = 1.0 - inv2 + 3.0 * inv2**2 - 15.0 * inv2**3 + 105.0 * inv2**4
        out[~near] = -0.5 * far**2 - _LOG_SQRT_2PI - np.log(far) + np.log(series)
    return out


def _tail_ratio(d: Array, m: Array) -> Array:
    """``log G`` in standard units: ``log Pr[Z >= d - m] - log Pr[Z >= -m]`` (``d = (x-a)/s``, ``m = (C-a)/s``)."""
    out: Array = log_normal_sf(d - m) - log_normal_sf(-m)
    return out


def _solve(d: Array, probability: float) -> Array:
    """``m`` (standard units above the cutoff) with ``G = probability``, for each ``d >= 0``; ``-inf`` if none."""
    target = math.log(probability)
    # G -> 1 as m -> +inf; as m -> -inf, log G ≈ -d·|m| -> -inf when d > 0 (none when d = 0).
    hi = d + 10.0
    lo = -np.minimum(_FAR, 10.0 + (-target + 1.0) / np.maximum(d, 1e-300))
    found = _tail_ratio(d, lo) < target
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        below = _tail_ratio(d, mid) < target
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    out: Array = np.where(found, 0.5 * (lo + hi), -np.inf)
    return out


def conditional_interval(
    estimates: npt.ArrayLike, standard_errors: npt.ArrayLike, cutoffs: npt.ArrayLike, *, confidence: float
) -> tuple[Array, Array, Array]:
    """Intervals and median-unbiased estimates of ``C`` given that ``X >= cutoff`` (see the module docstring).

    Args:
        estimates: the released estimates ``x`` (each at least its cutoff; one below it is
            treated as sitting on it).
        standard_errors: their standard errors ``s``.
        cutoffs: the smallest estimate that would have been released, ``a``; ``-inf`` for
            none (the interval is then the plain ``x ± z s``).
        confidence: ``1 - α``.

    Returns:
        ``(median_unbiased, low, high)``, not clipped: ``low`` may be negative, and for an
        estimate a hair above its cutoff every one of them runs to ``-inf`` (the truth is most
        likely far below a cutoff that an estimate barely crossed). A zero SE gives ``(x, x, x)``; a NaN or infinite one
        gives NaN and ``±inf``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1); got {confidence!r}")
    x = np.atleast_1d(np.asarray(estimates, dtype=np.float64))
    s = np.broadcast_to(np.asarray(standard_errors, dtype=np.float64), x.shape)
    a = np.broadcast_to(np.asarray(cutoffs, dtype=np.float64), x.shape)
    tail = (1.0 - confidence) / 2.0
    usable = np.isfinite(x) & np.isfinite(s) & (s > 0)
    bounded = usable & np.isfinite(a)
    safe_s = np.where(usable, s, 1.0)
    safe_a = np.where(bounded, a, np.where(usable, x - 1e3 * safe_s, 0.0))
    # An estimate exactly on its cutoff is taken a hair above it (the bounds' limit from above).
    d = np.where(usable, np.maximum((x - safe_a) / safe_s, 1e-12), 1e-12)
    med, low, high = (safe_a + safe_s * _solve(d, p) for p in (0.5, tail, 1.0 - tail))
    exact = np.isfinite(x) & (s == 0)
    med = np.where(usable, med, np.where(exact, x, np.nan))
    low = np.where(usable, low, np.where(exact, x, -np.inf))
    high = np.where(usable, high, np.where(exact, x, np.inf))
    return med, low, high
