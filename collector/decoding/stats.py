"""Normal-theory tests and multiple-testing control shared by the decoders.

Every estimate the decoders release is a sum of many independent reports' contributions,
so it is treated as normal with the standard error the mechanism's variance formula gives.
From ``z = estimate / SE``:

* the one-sided p-value of ``H0: count = 0`` against ``H1: count > 0`` (004 §4 and its
  Appendix test ``T_i > 0``) is ``Pr[Z >= z] = erfc(z / sqrt 2) / 2`` (``math.erfc``: the
  collector has no SciPy at run time);
* a two-sided ``(1 - a)`` confidence interval is ``estimate ± Φ^-1(1 - a/2) SE``.

Multiple testing over ``M`` candidates (004 §4, last step):

* ``"bonferroni"``: reject when ``p <= α / M``; the family-wise error rate is at most ``α``
  (004 §4 and Appendix: "Bonferroni corrected level of α/M").
* ``"bh"``: Benjamini-Hochberg (J. R. Stat. Soc. B 57:289-300, 1995), the procedure 004 §4
  names: reject the ``R`` smallest p-values, ``R`` the largest rank with
  ``p_(R) <= α R / M``; the false discovery rate is at most ``α M0 / M <= α`` (``M0``
  true nulls) for independent or positively dependent p-values.
* ``"storey"``: adaptive BH (Storey, Taylor and Siegmund, J. R. Stat. Soc. B 66:187-205,
  2004): BH at level ``α / π̂0`` with ``π̂0 = (1 + #{p > λ}) / (M (1 - λ))``, ``λ = 1/2``,
  capped at 1. BH spends ``α`` as if every candidate were null; when a large share of the
  candidates are present (half of them in 004 §5.2), that leaves power unused. The ``+1``
  is the finite-sample correction under which the FDR stays at most ``α`` for independent
  p-values (their Theorem 3).
* ``"pfer"``: the expected number of false positives (the per-family error rate; Gordon,
  Glazko, Qiu and Yakovlev, Ann. Appl. Stat. 1:179-190, 2007) at most ``α``, here any
  positive number: reject when ``p <= min(λ, α / (π̂0 M))``, with Storey's ``π̂0`` as above.
  For independent p-values this holds exactly: a null ``p_i`` that can be rejected is below
  ``λ``, so ``π̂0`` is then the estimate ``π̂0⁽ⁱ⁾`` from the other p-values, and
  ``Pr[reject i] = (α/M) E[1/π̂0⁽ⁱ⁾] <= (α/M) M(1-λ) E[1/(1 + Bin(M0 - 1, 1-λ))] <= α / M0``
  (``E[1/(1 + Bin(n, r))] <= 1/((n + 1) r)``), which summed over the ``M0`` nulls is ``α``;
  the ``+1`` is what makes it exact, and present candidates only raise ``π̂0``. Bonferroni
  at ``α`` is the same rule with ``π̂0 = 1``, and its expected number of false positives is
  ``α M0 / M``: the family-wise rate it promises costs most of the false-positive budget a
  release such as "at most 2 false strings" allows. ``"pfer"`` spends that budget instead,
  which is what the targets of 004 §5.2 and §5.4 count (the paper reports "47 strings
  with 2 false positives").
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "CONTROLS",
    "Control",
    "check_control",
    "check_level",
    "normal_quantile",
    "normal_sf",
    "reject",
    "rejection_level",
    "storey_pi0",
    "z_interval",
]

Control = Literal["bonferroni", "bh", "storey", "pfer"]
CONTROLS: tuple[str, ...] = ("bonferroni", "bh", "storey", "pfer")
"""The multiple-testing procedures :func:`reject` implements."""

_NORMAL = NormalDist()
_SQRT2 = math.sqrt(2.0)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def normal_sf(z: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """``Pr[Z >= z]`` for a standard normal ``Z``, elementwise (NaN stays NaN, ``±inf`` gives 0 or 1)."""
    arr = np.asarray(z, dtype=np.float64)
    out: npt.NDArray[np.float64] = 0.5 * np.asarray(_erfc(arr / _SQRT2), dtype=np.float64)
    return out


def normal_quantile(probability: float) -> float:
    """``Φ^-1(probability)`` for ``probability`` in (0, 1)."""
    if not 0.0 < probability < 1.0:
        raise ValueError(f"probability must lie in (0, 1); got {probability!r}")
    return _NORMAL.inv_cdf(probability)


def z_interval(confidence: float) -> float:
    """The half-width multiplier of a two-sided normal interval (1.959964 for 0.95)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1); got {confidence!r}")
    return normal_quantile(0.5 + confidence / 2.0)


def storey_pi0(p_values: npt.ArrayLike, *, lam: float = 0.5) -> float:
    """Storey's estimate of the share of true nulls, ``min(1, (1 + #{p > λ}) / (M (1 - λ)))``."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.size == 0:
        return 1.0
    return min(1.0, (1.0 + float(np.count_nonzero(p > lam))) / (p.size * (1.0 - lam)))


def check_control(control: str) -> str:
    """``control`` if :func:`reject` implements it, else ``ValueError``."""
    if control not in CONTROLS:
        raise ValueError(f"control must be one of {', '.join(CONTROLS)}; got {control!r}")
    return control


def check_level(alpha: float, control: str) -> float:
    """``alpha`` as a float if it is a valid level for ``control`` (see :func:`reject`), else ``ValueError``."""
    check_control(control)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a number; got {alpha!r}")
    if control == "pfer":
        if not alpha > 0:
            raise ValueError(f"alpha (the expected number of false positives, for pfer) must be > 0; got {alpha!r}")
    elif not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must lie in (0, 1); got {alpha!r}")
    return float(alpha)


def rejection_level(p_values: npt.ArrayLike, *, alpha: float, control: str) -> float:
    """The realized p-value level of :func:`reject`: a hypothesis is rejected exactly when ``p <= level``.

    Bonferroni's is ``α / M``; ``"pfer"``'s ``min(λ, α / (π̂0 M))``; BH's ``α R / M`` and
    Storey's ``α R / (π̂0 M)``, ``R`` the number rejected (every p-value at most ``α R / M``
    has rank at most ``R``, or a larger rank would pass, so the two descriptions agree).
    With ``R = 0`` the level is 0. The level is what a released entry crossed; for BH it is
    the one the entry would face with the other p-values held fixed (setting its own p-value
    anywhere below the level leaves ``R`` unchanged), which is what
    :mod:`collector.decoding.selective` conditions on.
    """
    a = check_level(alpha, control)
    p = np.nan_to_num(np.asarray(p_values, dtype=np.float64), nan=1.0)
    m = p.size
    if m == 0:
        return 0.0
    if control == "bonferroni":
        return a / m
    if control == "pfer":
        # Capped at λ = 1/2, Storey's λ: the bound in the module docstring needs every
        # rejectable p-value to be one that π̂0 does not count.
        return min(0.5, a / (storey_pi0(p) * m))
    if control == "storey":
        a = a / storey_pi0(p)
    ordered = np.sort(p, kind="stable")
    passed = np.flatnonzero(ordered <= a * np.arange(1, m + 1) / m)
    return 0.0 if passed.size == 0 else a * (int(passed[-1]) + 1) / m


def reject(p_values: npt.ArrayLike, *, alpha: float, control: str) -> npt.NDArray[np.bool_]:
    """Which hypotheses to reject under ``control`` at level ``alpha`` (see the module docstring).

    Args:
        p_values: one p-value per candidate, all ``M`` of them (NaN counts as 1).
        alpha: the family-wise (Bonferroni) or false-discovery (BH, Storey) level, in (0, 1);
            for ``"pfer"`` the expected number of false positives, any positive number.
        control: ``"bonferroni"``, ``"bh"``, ``"storey"`` or ``"pfer"``.

    Returns:
        A boolean array, true where the candidate is declared present.
    """
    p = np.nan_to_num(np.asarray(p_values, dtype=np.float64), nan=1.0)
    level = rejection_level(p, alpha=alpha, control=control)
    if control in ("bh", "storey"):
        # The R smallest p-values (ties at the level included), as Benjamini-Hochberg states it.
        kept: npt.NDArray[np.bool_] = (p <= level) & (level > 0)
        return kept
    result: npt.NDArray[np.bool_] = p <= level
    return result
