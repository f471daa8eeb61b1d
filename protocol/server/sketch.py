"""The dictionary query shared by the sketch mechanisms (003 Alg. 4).

003 Alg. 4 estimates the count of ``d`` from a ``k x m`` sketch ``M`` as
``(m / (m - 1)) * ((1/k) * sum_j M[j, h_j(d)] - n/m)``. The expensive part, and the only
part that depends on the sketch's layout, is the gather ``S(d) = sum_j A[j, h_j(d)]`` over
all ``k`` hash functions for every candidate ``d``; :func:`gather_sums` computes it for a
whole dictionary. CMS, HCMS and SFP turn ``S`` into counts with their own affine maps, and
:func:`counts_with_errors` gives each count the standard error of its sketch's exact variance.
:class:`DictionarySketchServer` is what the server halves of CMS and HCMS share around it:
``c_ε``, the dictionary query and the planner's figures from the variance bound.

The loop runs over hash functions (rows), evaluating one function for all candidates
with a few numpy passes and gathering from one sketch row, which stays in cache. Rows are
split between the caller's threads (:mod:`protocol.server.parallel`); numpy releases the GIL
in these passes, so two cores give close to twice the speed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from functools import cached_property
from typing import Any, ClassVar, Final, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from protocol.cms import CountMeanSketch
from protocol.hashing import HashFamily
from protocol.hcms import HadamardCountMeanSketch
from protocol.server.contract import PlainServer, PlanFigures
from protocol.server.estimate import VectorEstimate
from protocol.server.hashing import Fingerprints, evaluate_row
from protocol.server.parallel import Threads, run_parts

__all__ = ["DictionarySketchServer", "counts_with_errors", "gather_sums", "no_counts", "read_only_view"]

PLAN_TOP_SHARE: Final = 0.1
"""The planner's default: the most frequent value holds at most a tenth of the reports
(``Σf² <= 0.1 n²``)."""


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


_CellT = TypeVar("_CellT", bound=np.generic)


def read_only_view(sketch: npt.NDArray[_CellT]) -> npt.NDArray[_CellT]:
    """A view of ``sketch`` that cannot be written through: what an aggregate hands out of the
    arrays it keeps folding into."""
    view = sketch.view()
    view.flags.writeable = False
    return view


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


class _Queried(Protocol):
    """What :class:`DictionarySketchServer` asks of a sketch's aggregate."""

    def add(self, batch: Any, /) -> None: ...

    def estimate(self, candidates: Sequence[str | bytes], *, threads: Threads | None = None) -> VectorEstimate: ...


SketchT = TypeVar("SketchT", CountMeanSketch, HadamardCountMeanSketch)
BatchT = TypeVar("BatchT")
QueriedT = TypeVar("QueriedT", bound=_Queried)


class DictionarySketchServer(PlainServer[SketchT, BatchT, QueriedT]):
    """The server half of a ``k x m`` sketch over a dictionary whose report's bits are kept with
    one coin (CMS, HCMS): ``c_ε``, the dictionary query and the planner's figures.

    A subclass gives its exact variance, its bound (``variance_bound``), its report's size in
    bits and the bound's formula (``plan_formula``).
    """

    plan_formula: ClassVar[str]

    @cached_property
    def c_epsilon(self) -> float:
        """``c_ε = 1 / (2p - 1)`` for the implemented keep coin (003 Alg. 3 for CMS, where the ideal
        coin gives ``(e**(ε/2) + 1) / (e**(ε/2) - 1)``; 003 Alg. 7 step 1 for HCMS, ``1 / E[b]``)."""
        p = self.mechanism.keep_coin.probability
        return float(1 / (2 * p - 1))

    def variance_bound(self, *, n: float, sum_sq: float) -> float:
        """The theorem's upper bound on ``Var[f̃(d)]`` given ``Σ f**2`` (each sketch's own)."""
        raise NotImplementedError

    @property
    def bandwidth_bits(self) -> float:
        """Bits of one report (each sketch's own)."""
        raise NotImplementedError

    def estimate_frequencies(
        self, aggregate: object, candidates: Sequence[str], *, threads: Threads | None = None
    ) -> VectorEstimate:
        """The estimated count of each dictionary entry."""
        return self.own_aggregate(aggregate).estimate(candidates, threads=threads)

    def plan(self, n: float) -> PlanFigures:
        """The SE of a count from the sketch's variance bound, with ``Σf² <= 0.1 n²``
        (:data:`PLAN_TOP_SHARE`)."""
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(float(self.variance_bound(n=n, sum_sq=PLAN_TOP_SHARE * n * n))),
            unit="count",
            figures={"epsilon_report": self.mechanism.epsilon_report, "bandwidth_bits": self.bandwidth_bits},
            formulas=(self.plan_formula,),
        )
