"""The dictionary query shared by the sketch mechanisms (003 Alg. 4).

003 Alg. 4 estimates the count of ``d`` from a ``k x m`` sketch ``M`` as
``(m / (m - 1)) * ((1/k) * sum_j M[j, h_j(d)] - n/m)``. The expensive part, and the only
part that depends on the sketch's layout, is the gather ``S(d) = sum_j A[j, h_j(d)]`` over
all ``k`` hash functions for every candidate ``d``; :func:`gather_sums` computes it for a
whole dictionary. CMS, HCMS and SFP turn ``S`` into counts with their own affine maps, and
:func:`counts_with_errors` gives each count the standard error of its sketch's exact variance.

The loop runs over hash functions (rows), evaluating one function for all candidates
with a few numpy passes and gathering from one sketch row, which stays in cache. Rows are
split between the caller's threads (:mod:`protocol.server.parallel`); numpy releases the GIL
in these passes, so two cores give close to twice the speed.
"""

from __future__ import annotations

import functools
import math
from typing import Protocol

import numpy as np
import numpy.typing as npt

from protocol.hashing import HashFamily
from protocol.server.estimate import VectorEstimate
from protocol.server.hashing import Fingerprints, evaluate_row
from protocol.server.parallel import Threads, run_parts

__all__ = ["counts_with_errors", "gather_sums", "no_counts"]


class _Variance(Protocol):
    """A sketch's exact ``Var[f̃(d)]`` given ``f(d)`` and ``Σ_{d' != d} f(d')**2``."""

    def __call__(
        self, *, n: float, count: npt.NDArray[np.float64], others_sum_sq: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]: ...


def _gather_rows(
    table: npt.NDArray[np.generic],
    family: HashFamily,
    fp: Fingerprints,
    rows: range,
) -> npt.NDArray[np.float64]:
    n = len(fp)
    acc = np.zeros(n, dtype=np.float64)
    idx = np.empty(n, dtype=np.uint64)
    scratch = np.empty(n, dtype=np.uint64)
    gathered = np.empty(n, dtype=table.dtype)
    for j in rows:
        evaluate_row(family, fp, j, out=idx, scratch=scratch)
        # mode="clip" skips numpy's bounds check; indices are < range by construction.
        np.take(table[j], idx.view(np.int64), out=gathered, mode="clip")
        np.add(acc, gathered, out=acc)
    return acc


def gather_sums(
    table: npt.NDArray[np.generic],
    family: HashFamily,
    fp: Fingerprints,
    *,
    threads: Threads | None = None,
    chunk: int = 65_536,
) -> npt.NDArray[np.float64]:
    """``S(d) = sum_j table[j, h_j(d)]`` for every fingerprint ``d``.

    Args:
        table: a ``family.count x family.range`` array (counts or a transformed sketch).
        family: the hash family the sketch was built with.
        fp: fingerprints of the candidates (:func:`protocol.server.hashing.family_fingerprints`).
        threads: the caller's threads, the rows split between them (None: this thread alone).
        chunk: candidates per block, so the working arrays stay in cache.
    """
    if table.shape != (family.count, family.range):
        raise ValueError(f"table shape {table.shape} does not match the family ({family.count}, {family.range})")
    n = len(fp)
    out = np.zeros(n, dtype=np.float64)
    for start in range(0, n, chunk):
        part = Fingerprints(lo=fp.lo[start : start + chunk], hi=fp.hi[start : start + chunk])
        for sums in run_parts(threads, functools.partial(_gather_rows, table, family, part), family.count):
            out[start : start + len(part)] += sums
    return out


def no_counts(size: int) -> VectorEstimate:
    """``size`` counts estimated from no reports: NaN, with NaN standard errors."""
    nan = np.full(size, math.nan)
    return VectorEstimate(nan, nan.copy(), 0)


def counts_with_errors(
    values: npt.NDArray[np.float64], *, n: int, second_moment: float, variance: _Variance
) -> VectorEstimate:
    """Counts estimated from ``n`` reports with the square root of their sketch's exact variance.

    Two plug-ins (003 App. A and B, the line before each bound): ``f(d)`` by the count clipped to
    ``[0, n]``, and ``Σ_{d' != d} f(d')**2`` by the sketch's estimate of ``Σ_d f(d)**2`` less
    ``f(d)**2``.
    """
    f_hat = np.clip(values, 0.0, float(n))
    others = np.maximum(second_moment - f_hat**2, 0.0)
    var = variance(n=n, count=f_hat, others_sum_sq=others)
    return VectorEstimate(values, np.sqrt(np.maximum(var, 0.0)), n)
