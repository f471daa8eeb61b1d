"""The estimator every "support" frequency oracle shares, and its aggregate.

``grr``, ``oue``, ``ss`` and ``pgr`` (and ``olh`` per hash row) are pure protocols in the sense
of Wang, Blocki, Li and Jha (USENIX Security 2017, §3): a report *supports* a set of values, a
value's own report supports it with probability ``p*`` and a report of any other value with
probability ``q*``, the same for every pair. With ``C_v`` the reports that support ``v`` among
``n``, ``ĉ_v = (C_v - n q*) / (p* - q*)`` is unbiased, and since each report's support of ``v``
is a Bernoulli draw (``p*`` for the ``f_v`` holders of ``v``, ``q*`` for the others)::

    Var[ĉ_v] = (f_v p*(1 - p*) + (n - f_v) q*(1 - q*)) / (p* - q*)**2
             = (n q*(1 - q*) + f_v (p*(1 - p*) - q*(1 - q*))) / (p* - q*)**2

(Wang et al. 2017 Thm 2 gives the first term alone, the variance of a value nobody holds; the
second is what a frequent value adds or takes away). The standard error shown is its square
root with the plug-in ``f_v ≈ ĉ_v`` clipped to ``[0, n]``; docs/estimation.md derives it.

:class:`SupportAggregate` keeps ``C_v`` for every category and ``n``: exact integers that merge
by addition. :class:`SupportServer` is what the server halves over fixed categories share: the
estimate of every category, the planner's figures and the bulk privatizer's wire form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, Self, TypeVar

import numpy as np
import numpy.typing as npt

from protocol.errors import ParameterError, StateError
from protocol.interfaces import Mechanism
from protocol.plain import PlainDoc
from protocol.randomness import RandomSource
from protocol.server.contract import PlainServer, PlanFigures
from protocol.server.estimate import VectorEstimate
from protocol.server.parallel import Threads
from protocol.server.plain import array_from_plain, array_to_plain, require

__all__ = ["SupportAggregate", "SupportServer", "support_estimate", "support_variance"]


def support_variance(*, n: float, count: Any, p: float, q: float) -> Any:
    """``Var[ĉ_v]`` of a support estimator at ``n`` reports for a value held by ``count`` of them."""
    return (n * q * (1 - q) + count * (p * (1 - p) - q * (1 - q))) / (p - q) ** 2


def support_estimate(counts: npt.NDArray[np.int64], n: int, *, p: float, q: float) -> VectorEstimate:
    """``ĉ_v = (C_v - n q*) / (p* - q*)`` for every ``v`` with the plug-in standard error (module docstring)."""
    if n == 0:
        nan = np.full(counts.size, math.nan)
        return VectorEstimate(nan, nan.copy(), 0)
    values = (counts.astype(np.float64) - n * q) / (p - q)
    held = np.clip(values, 0.0, float(n))
    variance = support_variance(n=float(n), count=held, p=p, q=q)
    return VectorEstimate(values, np.sqrt(np.maximum(variance, 0.0)), n)


class _Sized(Protocol):
    """What :class:`SupportAggregate` asks of its mechanism: how many values it counts."""

    @property
    def name(self) -> str: ...


class SupportAggregate:
    """``C_v`` for each of ``size`` values and the number of reports ``n``; merges by addition.

    A subclass says how many values its mechanism counts (:meth:`size_of`) and how a batch adds
    to the counts (:meth:`add`).
    """

    label = "support aggregate"

    def __init__(self, mechanism: Any, counts: npt.NDArray[np.int64] | None = None, n: int = 0) -> None:
        self.mechanism = mechanism
        size = self.size_of(mechanism)
        self.counts: npt.NDArray[np.int64] = np.zeros(size, dtype=np.int64) if counts is None else counts
        self._n = n

    @classmethod
    def size_of(cls, mechanism: Any) -> int:
        """The number of values counted (the mechanism's ``k``)."""
        return int(mechanism.k)

    @classmethod
    def records_per_report(cls, mechanism: Any) -> int | None:
        """How many values each report counts (``None``: it varies, as with unary encoding's bits),
        so a saved aggregate's counts must add up to ``n`` times it."""
        return None

    @property
    def n(self) -> int:
        """Reports folded in."""
        return self._n

    def add(self, batch: Any) -> None:
        """Fold a batch of the mechanism's records (each subclass's own, through :meth:`add_counts`
        or :meth:`add_indices`)."""
        raise NotImplementedError

    def add_counts(self, support: npt.NDArray[np.int64], reports: int) -> None:
        """Add ``support`` (one count per value) from ``reports`` reports."""
        self.counts += support
        self._n += reports

    def add_indices(self, indices: npt.NDArray[np.int64], reports: int) -> None:
        """Add one count for every value ``indices`` names (any shape, repeats counted) from
        ``reports`` reports."""
        self.add_counts(np.bincount(indices.ravel(), minlength=self.counts.size), reports)

    def merge(self, other: Self) -> Self:
        """Both inputs' reports."""
        if other.mechanism != self.mechanism:
            raise ValueError("cannot merge aggregates of different mechanisms")
        return type(self)(self.mechanism, self.counts + other.counts, self._n + other._n)

    def to_plain(self) -> PlainDoc:
        """Plain, msgpack-ready data."""
        return {"n": self._n, "counts": array_to_plain(self.counts)}

    @classmethod
    def from_plain(cls, mechanism: Any, data: object) -> Self:
        """An aggregate saved with :meth:`to_plain`; ``StateError`` if it does not fit."""
        where = f"{mechanism.name} aggregate"
        n = require(data, "n", int, where=where)
        size = cls.size_of(mechanism)
        counts = array_from_plain(
            require(data, "counts", dict, where=where), dtype="<i8", shape=(size,), field=f"{where}.counts"
        ).astype(np.int64)
        if n < 0 or (counts.size and (int(counts.min()) < 0 or int(counts.max()) > n)):
            raise StateError(f"{where}: every count must lie in [0, n] with n >= 0")
        each = cls.records_per_report(mechanism)
        if each is not None and int(counts.sum()) != each * n:
            raise StateError(f"{where}: the counts add up to {int(counts.sum())}, not {each} per report of {n}")
        return cls(mechanism, counts, n)


class _Categories(Mechanism, Protocol):
    """What :class:`SupportServer` asks of its mechanism beyond the contract."""

    @property
    def categories(self) -> tuple[str, ...]: ...

    @property
    def support_probabilities(self) -> tuple[float, float]: ...


MechT = TypeVar("MechT", bound=_Categories)
BatchT = TypeVar("BatchT")
AggT = TypeVar("AggT", bound=SupportAggregate)


class SupportServer(PlainServer[MechT, BatchT, AggT]):
    """The server half of a support oracle over fixed categories (``grr``, ``oue``, ``ss``, ``pgr``).

    A subclass decodes, batches and privatizes in bulk (``encode_batch``, ``privatize_many``)
    and says what its planner prints (:meth:`plan`, through :meth:`support_plan`); a mechanism
    whose aggregate holds something other than ``C_v`` turns it into ``C_v``
    (:meth:`category_counts`).
    """

    def encode_batch(self, batch: BatchT) -> list[object]:
        """The batch's records in wire form."""
        raise NotImplementedError

    def privatize_many(self, values: Sequence[str], rng: RandomSource) -> BatchT:
        """Privatize many values at once, each with the device's coins."""
        raise NotImplementedError

    def privatize_records(self, values: Sequence[str], rng: RandomSource) -> list[object]:
        """:meth:`privatize_many` in wire form."""
        return self.encode_batch(self.privatize_many(values, rng))

    def category_counts(self, aggregate: AggT) -> npt.NDArray[np.int64]:
        """``C_v`` for every category: the aggregate's counts."""
        return aggregate.counts

    def estimate_frequencies(
        self, aggregate: object, candidates: Sequence[str], *, threads: Threads | None = None
    ) -> VectorEstimate:
        """Every category's count with its plug-in SE (one pass over the counts: ``threads`` are not needed).

        Raises:
            ParameterError: ``candidates`` are not the mechanism's categories, in order.
        """
        agg, mech = self.own_aggregate(aggregate), self.mechanism
        if tuple(candidates) != mech.categories:
            raise ParameterError("candidates", "the categories, in order", candidates)
        p, q = mech.support_probabilities
        return support_estimate(self.category_counts(agg), agg.n, p=p, q=q)

    def plan(self, n: float) -> PlanFigures:
        """The planner's figures at ``n`` reports (each mechanism's own, through :meth:`support_plan`)."""
        raise NotImplementedError

    def support_plan(
        self, n: float, *, bandwidth_bits: float, formula: str, more: Mapping[str, float] | None = None
    ) -> PlanFigures:
        """The SE of a category nobody holds, ``sqrt(n q* (1 - q*)) / (p* - q*)``, with the record's
        size, the mechanism's own ``more`` figures and the formula the planner prints."""
        mech = self.mechanism
        p, q = mech.support_probabilities
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(float(support_variance(n=n, count=0.0, p=p, q=q))),
            unit="count",
            figures={"epsilon_report": mech.epsilon_report, "bandwidth_bits": bandwidth_bits, **(more or {})},
            formulas=(formula,),
        )
