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
by addition.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, Self

import numpy as np
import numpy.typing as npt

from protocol.errors import StateError
from protocol.plain import PlainDoc
from protocol.server.estimate import VectorEstimate
from protocol.server.plain import array_from_plain, array_to_plain, require

__all__ = ["SupportAggregate", "support_estimate", "support_variance"]


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

    def add_counts(self, support: npt.NDArray[np.int64], reports: int) -> None:
        """Add ``support`` (one count per value) from ``reports`` reports."""
        self.counts += support
        self._n += reports

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
