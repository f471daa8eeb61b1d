"""Optimal local hashing over a fixed family, the server half: decode, fold, estimate, plan, privatize in bulk.

See :mod:`protocol.olh` for the randomizer, its coins and its privacy.

**Aggregate.** ``T[j, y]``: the reports with hash index ``j`` and value ``y`` (``seeds x g`` exact
counts, merged by addition), and ``n``.

**Estimator.** A report supports ``d`` when ``y = h_j(d)``. With ``S(d) = Σ_j T[j, h_j(d)]``
(gathered for a whole dictionary by :func:`protocol.server.sketch.gather_sums`, as CMS's sketch
is), a report of ``d`` supports it with probability ``p`` and a report of ``v != d`` with
``r_v = p c_v + q (1 - c_v)``, ``c_v`` the share of the family's rows where ``v`` and ``d`` collide;
over a random family ``E c_v = 1/g``, so ``E r_v = 1/g`` (``p + (g - 1) q = 1``) and

    ĉ(d) = (S(d) - n / g) / (p - 1 / g)

is unbiased (Wang et al. 2017 §4.4, with ``q* = 1/g``).

**Variance.** Over the devices' coins and the family (docs/estimation.md, "Optimal local
hashing", derives it)::

    Var[S(d)] = f p (1 - p) + (n - f) (1/g)(1 - 1/g) + (p - q)**2 (1/g)(1 - 1/g) Σ_{v != d} f_v (f_v - 1) / seeds

and ``Var[ĉ(d)] = Var[S(d)] / (p - 1/g)**2``. The first two terms are OLH's (at ``g = e**ε + 1``
the second is ``n 4 e**ε / (e**ε - 1)**2`` once divided); the third is the fixed family's: the
collisions of ``d`` with the other values are a fixed offset for one family, whose spread over
families is ``Var c_v = (1/g)(1 - 1/g) / seeds`` per value (independent across values for a family
whose triples collide as rarely as a 3-wise independent one's, as 003 Lemma A.3 assumes for
CMS). It is a plug-in, as for CMS: ``f`` by the estimate clipped to ``[0, n]`` and ``Σ f_v**2`` by an
unbiased estimate from the table (:meth:`OLHAggregate.second_moment`): with ``x̂[j, y] = (T[j, y]
- q n_j) / (p - q)``, ``Σ_y x̂[j, y]**2 - n_j κ`` (``κ = (p(1-p) + (g-1) q(1-q)) / (p-q)**2``) is unbiased
for ``Σ_y G_j[y]**2``, ``G_j[y]`` the reports of row ``j`` whose value hashes to ``y``, whose mean over
the family and the rows is ``(1 - 1/g)(n (1 - 1/s) + Σ f**2 / s) + Σ_j n_j**2 / g``; solved for
``Σ f**2`` and clipped to ``[n, n**2]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Final, Self, TypeVar

import numpy as np
import numpy.typing as npt

from protocol.cms import as_value_bytes
from protocol.errors import StateError
from protocol.olh import DRAW_WORDS, OLHRecord, OptimalLocalHashing
from protocol.plain import PlainDoc
from protocol.randomness import RandomSource, uniform_from_words
from protocol.server.contract import PlainServer, PlanFigures
from protocol.server.estimate import VectorEstimate
from protocol.server.hashing import Fingerprints, evaluate, family_fingerprints, value_fingerprints
from protocol.server.parallel import Threads
from protocol.server.plain import array_from_plain, array_to_plain, require
from protocol.server.records import int_record, record_list
from protocol.server.sketch import counts_with_errors, gather_sums, no_counts

__all__ = ["OLHAggregate", "OLHBatch", "OLHServer"]

_Real = TypeVar("_Real", float, npt.NDArray[np.float64])
_PLAN_TOP_SHARE: Final = 0.1
"""The planner's ``Σ f**2 <= 0.1 n**2`` (the most frequent value holds at most a tenth), as for CMS."""
_DIRECT_CELLS: Final = 1 << 18
"""Up to this many (row, candidate) pairs a dictionary query hashes them all in one vectorised pass."""
_PLAN_COLLISION_SHARE: Final = 0.1
"""The planner suggests the family at which the collision term is at most this share of the coin term."""


@dataclass(frozen=True, eq=False)
class OLHBatch:
    """Records in columnar form: ``indices`` and ``values`` (``int64``, ``n`` each)."""

    indices: npt.NDArray[np.int64]
    values: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.indices.size)


class OLHAggregate:
    """Exact counts ``T[j, y]`` (``int64``, ``seeds x g``); merges by addition."""

    def __init__(self, mechanism: OptimalLocalHashing, table: npt.NDArray[np.int64] | None = None) -> None:
        self.mechanism = mechanism
        shape = (mechanism.seeds, mechanism.g)
        self.table: npt.NDArray[np.int64] = np.zeros(shape, dtype=np.int64) if table is None else table
        self._n = int(self.table.sum())
        self._second_moment: float | None = None

    @property
    def n(self) -> int:
        """Reports folded in."""
        return self._n

    def add(self, batch: OLHBatch) -> None:
        """Count the records' cells."""
        g = self.mechanism.g
        cells = np.bincount(batch.indices * g + batch.values, minlength=self.table.size)
        self.table += cells.reshape(self.table.shape)
        self._n += len(batch)
        self._second_moment = None

    def merge(self, other: Self) -> Self:
        """Both inputs' reports."""
        if other.mechanism != self.mechanism:
            raise ValueError("cannot merge aggregates of different mechanisms")
        return type(self)(self.mechanism, self.table + other.table)

    def to_plain(self) -> PlainDoc:
        """Plain, msgpack-ready data."""
        return {"n": self._n, "table": array_to_plain(self.table)}

    @classmethod
    def from_plain(cls, mechanism: OptimalLocalHashing, data: object) -> Self:
        """An aggregate saved with :meth:`to_plain`; ``StateError`` if it does not fit."""
        where = "olh aggregate"
        n = require(data, "n", int, where=where)
        shape = (mechanism.seeds, mechanism.g)
        table = array_from_plain(require(data, "table", dict, where=where), dtype="<i8", shape=shape, field=where)
        table = table.astype(np.int64)
        if table.size and int(table.min()) < 0:
            raise StateError(f"{where}.table: counts must be non-negative")
        if int(table.sum()) != n:
            raise StateError(f"{where}: n={n} is not the sum of the table")
        return cls(mechanism, table)

    def second_moment(self) -> float:
        """Unbiased estimate of ``Σ_d f(d)**2`` from the table, clipped to ``[n, n**2]`` (module docstring)."""
        if self._second_moment is not None:
            return self._second_moment
        mech, n = self.mechanism, self._n
        if n == 0:
            return 0.0
        p, q = float(mech.p_exact), float(mech.q_exact)
        g, s = mech.g, mech.seeds
        nj = self.table.sum(axis=1).astype(np.float64)
        debiased = (self.table.astype(np.float64) - q * nj[:, None]) / (p - q)
        kappa = (p * (1 - p) + (g - 1) * q * (1 - q)) / (p - q) ** 2
        rows = float(np.einsum("ij,ij->", debiased, debiased)) - kappa * n - float(np.dot(nj, nj)) / g
        f2 = s * (rows / (1 - 1 / g) - n * (1 - 1 / s))
        self._second_moment = float(min(max(f2, float(n)), float(n) * n))
        return self._second_moment


class OLHServer(PlainServer[OptimalLocalHashing, OLHBatch, OLHAggregate]):
    """Optimal local hashing's server half: a frequency oracle over a dictionary."""

    batch_type: ClassVar[type[OLHBatch]] = OLHBatch
    aggregate_type: ClassVar[type[OLHAggregate]] = OLHAggregate

    @cached_property
    def support(self) -> tuple[float, float, float]:
        """``(p, q, 1/g)`` for the implemented coin."""
        mech = self.mechanism
        return float(mech.p_exact), float(mech.q_exact), 1.0 / mech.g

    def decode_records(self, raw: object) -> OLHBatch:
        """A list of ``[j, y]`` records, strictly: ``j`` in ``[0, seeds)``, ``y`` in ``[0, g)``."""
        mech = self.mechanism
        records = record_list(raw, "[index, value]")
        n = len(records)
        limits = (("index", mech.seeds), ("value", mech.g))
        for i, rec in enumerate(records):
            int_record(rec, f"records[{i}]", "[index, value]", limits)
        pairs = np.array(records, dtype=np.int64).reshape(n, 2)
        return OLHBatch(indices=pairs[:, 0].copy(), values=pairs[:, 1].copy())

    def batch(self, records: Sequence[OLHRecord]) -> OLHBatch:
        """Typed records in columnar form."""
        n = len(records)
        return OLHBatch(
            indices=np.fromiter((r.index for r in records), dtype=np.int64, count=n),
            values=np.fromiter((r.value for r in records), dtype=np.int64, count=n),
        )

    def encode_batch(self, batch: OLHBatch) -> list[object]:
        """The batch's records in wire form."""
        return [[j, y] for j, y in zip(batch.indices.tolist(), batch.values.tolist(), strict=True)]

    def privatize_many(self, values: Sequence[str | bytes], rng: RandomSource) -> OLHBatch:
        """Privatize many values, each report's three words in the device's layout (:mod:`protocol.olh`).
        Repeated values are fingerprinted once."""
        return self.privatize_fingerprints(value_fingerprints(self.mechanism.family, values), rng)

    def privatize_fingerprints(self, fp: Fingerprints, rng: RandomSource) -> OLHBatch:
        """Privatize values given by their fingerprints under the mechanism's family."""
        mech = self.mechanism
        words = rng.words(DRAW_WORDS * len(fp)).reshape(len(fp), DRAW_WORDS)
        j = uniform_from_words(rng, words[:, 0], mech.seeds)
        other = uniform_from_words(rng, words[:, 2], mech.g - 1)
        x = evaluate(mech.family, fp, j)
        keep = words[:, 1] < np.uint64(mech.keep_coin.numerator)
        return OLHBatch(indices=j, values=np.where(keep, x, other + (other >= x)))

    def privatize_records(self, values: Sequence[str | bytes], rng: RandomSource) -> list[object]:
        """:meth:`privatize_many` in wire form."""
        return self.encode_batch(self.privatize_many(values, rng))

    def estimate_frequencies(
        self, aggregate: object, candidates: Sequence[str], *, threads: Threads | None = None
    ) -> VectorEstimate:
        """The estimated count of each dictionary entry."""
        agg = self.own_aggregate(aggregate)
        fp = family_fingerprints(self.mechanism.family, [as_value_bytes(c) for c in candidates])
        return self.estimate_fingerprints(agg, fp, threads=threads)

    def estimate_fingerprints(
        self, aggregate: OLHAggregate, fp: Fingerprints, *, threads: Threads | None = None
    ) -> VectorEstimate:
        """As :meth:`estimate_frequencies`, for candidates already fingerprinted under the family."""
        n = aggregate.n
        if n == 0:
            return no_counts(len(fp))
        p, _, inv_g = self.support
        sums = self._gather(aggregate.table, fp, threads=threads)
        values = (sums - n * inv_g) / (p - inv_g)
        return counts_with_errors(values, n=n, second_moment=aggregate.second_moment(), variance=self.variance)

    def _gather(
        self, table: npt.NDArray[np.int64], fp: Fingerprints, *, threads: Threads | None
    ) -> npt.NDArray[np.float64]:
        """``S(d) = Σ_j T[j, h_j(d)]``: every (row, candidate) hash in one pass for a small dictionary
        (a few million cells), else row by row, split between the caller's threads (:func:`gather_sums`)."""
        family = self.mechanism.family
        if family.count * len(fp) > _DIRECT_CELLS:
            return gather_sums(table, family, fp, threads=threads)
        rows = np.arange(family.count, dtype=np.int64)[:, None]
        sums: npt.NDArray[np.float64] = table[rows, evaluate(family, fp, rows)].sum(axis=0, dtype=np.float64)
        return sums

    def variance(self, *, n: float, count: _Real, others_sum_sq: _Real) -> _Real:
        """``Var[ĉ(d)]`` over the coins and the family (module docstring), ``Σ_{v != d} f_v**2 = others_sum_sq``."""
        p, q, inv_g = self.support
        spread = inv_g * (1 - inv_g)
        others = n - count
        # Σ f(f - 1) over the other values: never below 0, though the plug-ins can make it so.
        pairs = others_sum_sq - others
        pairs = pairs * (pairs > 0)
        collisions = (p - q) ** 2 * spread * pairs / self.mechanism.seeds
        var_s = count * p * (1 - p) + others * spread + collisions
        return var_s / (p - inv_g) ** 2

    def plan(self, n: float) -> PlanFigures:
        """The SE of a count nobody holds with ``Σ f**2 <= 0.1 n**2`` (as CMS's planner assumes), and the
        family at which the collision term would be a tenth of the coin term."""
        mech = self.mechanism
        p, q, inv_g = self.support
        coin = n * inv_g * (1 - inv_g)
        collisions_per_seed = (p - q) ** 2 * inv_g * (1 - inv_g) * max(_PLAN_TOP_SHARE * n * n - n, 0.0)
        var = float(self.variance(n=n, count=0.0, others_sum_sq=_PLAN_TOP_SHARE * n * n))
        suggested = 2 ** math.ceil(math.log2(max(1.0, collisions_per_seed / (_PLAN_COLLISION_SHARE * coin))))
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(var),
            unit="count",
            figures={
                "epsilon_report": mech.epsilon_report,
                "bandwidth_bits": math.log2(mech.seeds) + math.log2(mech.g),
                "g": float(mech.g),
                "seeds": float(mech.seeds),
                "collision_share": (collisions_per_seed / mech.seeds) / coin if coin else 0.0,
                "seeds_for_tenth": float(suggested),
            },
            formulas=(
                "Wang et al. 2017 §4.4: Var = n (1/g)(1-1/g)/(p-1/g)^2 = n 4e^eps/(e^eps-1)^2 at g = e^eps+1",
                "fixed family: + (p-q)^2 (1/g)(1-1/g) sum f^2 / (seeds (p-1/g)^2), sum f^2 <= 0.1 n^2",
            ),
        )
