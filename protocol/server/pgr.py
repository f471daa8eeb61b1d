"""Projective geometry response, the server half: decode, count, reconstruct, estimate, plan, privatize in bulk.

See :mod:`protocol.pgr` for the geometry, the randomizer, its coins and its privacy. The
aggregate is the histogram ``H`` of the reported points (``K`` exact counts, merged by addition).

**Reconstruction.** The estimate of category ``v`` needs its support count
``C_v = Σ_{u : <u, v> = 0} H[u]``: the reports on its hyperplane. Summing each hyperplane directly
costs ``k h ≈ k K / q``. Feldman et al. (2022 §4) compute all of them with a dynamic program over
the coordinates in ``O(k e**ε log k)``; here the same sums come from a Fourier transform over
``F_q**t``, which for a prime ``q`` is a ``t``-dimensional discrete Fourier transform of length
``q`` per axis. Put ``H`` on the canonical vectors of the points in a ``q**t`` table ``A`` (zero
elsewhere) and let ``Â(y) = Σ_x A(x) ω**<x, y>`` with ``ω = e**(-2πi/q)``. Since
``Σ_{λ ∈ F_q} ω**(λ s)`` is ``q`` for ``s = 0`` and ``0`` otherwise,

    C_v = Σ_x A(x) [<x, v> = 0] = (1/q) Σ_{λ ∈ F_q} Â(λ v) = (n + Σ_{λ != 0} Re Â(λ v)) / q,

``O(q**t t log q)`` for the transform (``q**t ≈ K q``, so ``O(k e**ε log k)`` when ``q ≈ e**ε + 1``
and ``K ≈ k``) and ``O(k q)`` for the gather. ``A`` is real, so ``Re Â(y) = Re Â(-y)`` and the
real-input transform (half the table) suffices. The sums are integers and come out within
rounding noise of them (``O(n 2**-50)``); they are rounded. For ``t = 2`` every hyperplane is
one point, ``u ⊥ v`` for ``u ∝ (v_1, -v_0)``, and ``C_v`` is read directly.

**Hyperplane by hyperplane.** Where ``q`` near ``e**ε + 1`` makes ``q**t`` too large a table (large
``k`` and ε: ``q = 2,039``, ``t = 3`` at k = 65,536, ε = 8), the sums are taken directly, in
``O(k h)``, over the points of each hyperplane written in canonical form without a search. Let
``j`` be the last non-zero coordinate of ``v``. A point whose leading 1 lies after ``j`` is on the
hyperplane whatever its other coordinates (``v`` is zero there): those points are the index range
``[offset(j + 1), K)``, one difference of a running sum. None has its leading 1 at ``j``
(``<u, v> = v_j != 0``). For a leading 1 at ``i < j`` the coordinates after ``i`` other than ``j``
are free and ``u_j = -(v_i + Σ u_m v_m) / v_j``: ``q**(t-2-i)`` points, each index computed from
its coordinates. The counts are exact integers, equal to the transform's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Final

import numpy as np
import numpy.typing as npt

from protocol.pgr import DRAW_WORDS, ProjectiveGeometryResponse, point_offsets
from protocol.randomness import RandomSource, uniform_from_words
from protocol.server.contract import PlanFigures
from protocol.server.grr import decode_indices
from protocol.server.support import SupportAggregate, SupportServer

__all__ = [
    "ENUMERATION_COLUMNS",
    "PGRAggregate",
    "PGRBatch",
    "PGRServer",
    "canonical_index",
    "hyperplane_sums",
    "inverse_mod",
    "points",
]

_GATHER_CELLS: Final = 1 << 21
"""Coordinates (categories x multiples x t) gathered per step, so the temporaries stay a few MiB."""
ENUMERATION_COLUMNS: Final = 8
"""Free-coordinate assignments per step of :func:`hyperplane_sums` (docs/benchmarks.md, "pgr's
hyperplane sums, a few points at a time")."""


def points(index: npt.NDArray[np.int64], q: int, t: int) -> npt.NDArray[np.int64]:
    """The canonical vectors (``len(index) x t``) of points of PG(t-1, q) (:func:`protocol.pgr.point_of`)."""
    offsets = np.array(point_offsets(q, t), dtype=np.int64)
    lead = np.searchsorted(offsets, index, side="right") - 1
    rest = index - offsets[lead]
    out = np.zeros((index.size, t), dtype=np.int64)
    for p in range(t):
        digit = (rest // q ** (t - 1 - p)) % q
        out[:, p] = np.where(p > lead, digit, np.where(p == lead, 1, 0))
    return out


def inverse_mod(x: npt.NDArray[np.int64], q: int) -> npt.NDArray[np.int64]:
    """``x**(q-2) mod q`` elementwise: the inverse of each non-zero ``x`` in F_q for a prime ``q``
    (Fermat), by squaring in ``uint64`` (``q < 2**32``, so a product of two residues fits)."""
    base = (x % q).astype(np.uint64)
    result = np.ones_like(base)
    modulus = np.uint64(q)
    exponent = q - 2
    while exponent:
        if exponent & 1:
            result = (result * base) % modulus
        base = (base * base) % modulus
        exponent >>= 1
    return result.astype(np.int64)


def canonical_index(u: npt.NDArray[np.int64], q: int, t: int) -> npt.NDArray[np.int64]:
    """The point index of every non-zero row of ``u`` (rows scaled to canonical form first)."""
    u = u % q
    rows = np.arange(u.shape[0])
    lead = np.argmax(u != 0, axis=1)
    canon = (u * inverse_mod(u[rows, lead], q)[:, None]) % q
    offsets = np.array(point_offsets(q, t), dtype=np.int64)
    rest = np.zeros(u.shape[0], dtype=np.int64)
    for p in range(t):
        rest = np.where(p > lead, rest * q + canon[:, p], rest)
    out: npt.NDArray[np.int64] = offsets[lead] + rest
    return out


def hyperplane_sums(
    histogram: npt.NDArray[np.int64],
    vectors: npt.NDArray[np.int64],
    q: int,
    t: int,
    *,
    columns: int = ENUMERATION_COLUMNS,
) -> npt.NDArray[np.int64]:
    """``C_v = Σ_{<u, v> = 0} H[u]`` for each canonical ``v`` (rows of ``vectors``), hyperplane by
    hyperplane (module docstring, "Hyperplane by hyperplane"); ``O(len(vectors) h)``. ``columns``
    free-coordinate assignments are taken per step (the result does not depend on it)."""
    weights = [q ** (t - 1 - m) for m in range(t)]
    offsets = point_offsets(q, t)
    tail = np.zeros(t + 1, dtype=np.int64)  # tail[i]: the reports with their leading 1 at i or later
    for i in range(t - 1, -1, -1):
        tail[i] = tail[i + 1] + int(histogram[offsets[i] : offsets[i + 1] if i + 1 < t else None].sum())
    last = t - 1 - np.argmax(vectors[:, ::-1] != 0, axis=1)
    out: npt.NDArray[np.int64] = tail[last + 1].copy()
    for j in range(1, t):
        group = np.flatnonzero(last == j)
        if group.size == 0:
            continue
        # u_j = (-v_i - Σ u_m v_m) / v_j = s + Σ u_m r_m with s = -v_i / v_j and r_m = -v_m / v_j.
        minus_inverse = (-inverse_mod(vectors[group, j], q)) % q
        ratios = (vectors[group] * minus_inverse[:, None]) % q
        for i in range(j):
            free = [m for m in range(i + 1, t) if m != j]
            assignments = q ** len(free)
            # A step takes a few consecutive assignments (whose points lie close together in the
            # histogram, so the gathers stay in cache) for many categories, rather than a
            # category's whole hyperplane (docs/benchmarks.md, "pgr's hyperplane sums, a few points at a time").
            step = min(assignments, columns)
            rows = max(1, _GATHER_CELLS // step)
            for c0 in range(0, assignments, step):
                flat = np.arange(c0, min(assignments, c0 + step), dtype=np.int64)
                digits = [(flat // q ** (len(free) - 1 - f)) % q for f in range(len(free))]
                base = np.full(flat.size, offsets[i], dtype=np.int64)
                for d, m in zip(digits, free, strict=True):
                    base += d * weights[m]
                for r0 in range(0, group.size, rows):
                    r = ratios[r0 : r0 + rows]
                    uj = np.broadcast_to(r[None, :, i], (flat.size, r.shape[0])).copy()
                    for d, m in zip(digits, free, strict=True):
                        uj += d[:, None] * r[None, :, m]
                    uj %= q
                    uj *= weights[j]
                    uj += base[:, None]
                    out[group[r0 : r0 + rows]] += histogram[uj].sum(axis=0)
    return out


@dataclass(frozen=True, eq=False)
class PGRBatch:
    """Reported point indices, one per record."""

    points: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.points.size)


class PGRAggregate(SupportAggregate):
    """The histogram of reported points (``K`` counts) and ``n``."""

    @classmethod
    def size_of(cls, mechanism: ProjectiveGeometryResponse) -> int:
        """``K``, the points of PG(t-1, q)."""
        return mechanism.geometry.points

    @classmethod
    def records_per_report(cls, mechanism: ProjectiveGeometryResponse) -> int:
        """Every report is one point."""
        return 1

    def add(self, batch: PGRBatch) -> None:
        """Count the reported points."""
        self.add_indices(batch.points, len(batch))


class PGRServer(SupportServer[ProjectiveGeometryResponse, PGRBatch, PGRAggregate]):
    """Projective geometry response's server half."""

    batch_type: ClassVar[type[PGRBatch]] = PGRBatch
    aggregate_type: ClassVar[type[PGRAggregate]] = PGRAggregate

    @cached_property
    def category_vectors(self) -> npt.NDArray[np.int64]:
        """The canonical vectors of the ``k`` categories' points (``k x t``)."""
        mech = self.mechanism
        return points(np.arange(mech.k, dtype=np.int64), mech.q, mech.t)

    def decode_records(self, raw: object) -> PGRBatch:
        """A list of point indices in ``[0, K)``, strictly."""
        return PGRBatch(decode_indices(raw, self.mechanism.geometry.points))

    def batch(self, records: Sequence[int]) -> PGRBatch:
        """Typed records in columnar form."""
        return PGRBatch(np.array(records, dtype=np.int64).reshape(len(records)))

    def encode_batch(self, batch: PGRBatch) -> list[object]:
        """The batch's records in wire form."""
        return list(batch.points.tolist())

    def privatize_many(self, values: Sequence[str], rng: RandomSource) -> PGRBatch:
        """Privatize many values, each report's two words in the device's layout (:mod:`protocol.pgr`)."""
        mech = self.mechanism
        q, t, g = mech.q, mech.t, mech.geometry
        own = np.fromiter((mech.index_of(v) for v in values), dtype=np.int64, count=len(values))
        v = self.category_vectors[own]
        lead = np.argmax(v != 0, axis=1)
        words = rng.words(DRAW_WORDS * own.size).reshape(own.size, DRAW_WORDS)
        on = words[:, 0] < np.uint64(mech.hyperplane_coin.numerator)
        c = np.zeros((own.size, t - 1), dtype=np.int64)
        on_rows, off_rows = np.flatnonzero(on), np.flatnonzero(~on)
        c[on_rows] = points(uniform_from_words(rng, words[on_rows, 1], g.h), q, t - 1)
        rest = uniform_from_words(rng, words[off_rows, 1], q ** (t - 1))
        for p in range(t - 1):
            c[off_rows, p] = (rest // q ** (t - 2 - p)) % q
        u = np.zeros((own.size, t), dtype=np.int64)
        for p in range(t):
            if p < t - 1:
                u[:, p] = np.where(p < lead, c[:, p], 0)
            if p > 0:
                u[:, p] += np.where(p > lead, c[:, p - 1], 0)
        rows = np.arange(own.size)
        u[rows, lead] = (on.astype(np.int64) ^ 1) - (u * v).sum(axis=1)
        return PGRBatch(canonical_index(u, q, t))

    def support_counts(self, histogram: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
        """``C_v``, the reports on each category's hyperplane (module docstring)."""
        mech = self.mechanism
        q, t = mech.q, mech.t
        vectors = self.category_vectors
        if mech.reconstruction == "direct":
            perp = np.stack([vectors[:, 1], -vectors[:, 0]], axis=1)
            return histogram[canonical_index(perp, q, t)].astype(np.int64)
        if mech.reconstruction == "enumeration":
            return hyperplane_sums(histogram, vectors, q, t)
        table = np.zeros(q**t, dtype=np.float64)
        every = points(np.arange(mech.geometry.points, dtype=np.int64), q, t)
        weights = q ** np.arange(t - 1, -1, -1, dtype=np.int64)
        table[every @ weights] = histogram
        spectrum = np.fft.rfftn(table.reshape((q,) * t)).real.ravel()
        half = q // 2 + 1
        # The real part is even: Re Â(y) = Re Â(-y); the table keeps y_last in [0, q // 2].
        rweights = np.array([*(q ** (t - 2 - p) * half for p in range(t - 1)), 1], dtype=np.int64)
        lambdas = np.arange(1, q, dtype=np.int64)
        out = np.empty(mech.k, dtype=np.int64)
        step = max(1, _GATHER_CELLS // ((q - 1) * t))
        for start in range(0, mech.k, step):
            block = vectors[start : start + step]
            y = (lambdas[None, :, None] * block[:, None, :]) % q
            flip = y[:, :, -1] > q // 2
            y[flip] = (-y[flip]) % q
            sums = spectrum[y @ rweights].sum(axis=1)
            out[start : start + len(block)] = np.rint((n + sums) / q).astype(np.int64)
        return out

    def category_counts(self, aggregate: PGRAggregate) -> npt.NDArray[np.int64]:
        """``C_v`` from the histogram of reported points (:meth:`support_counts`; none without reports)."""
        if aggregate.n == 0:
            return np.zeros(self.mechanism.k, dtype=np.int64)
        return self.support_counts(aggregate.counts, aggregate.n)

    def plan(self, n: float) -> PlanFigures:
        """The SE of a category nobody holds: ``sqrt(n β (1 - β)) / (α - β)``."""
        mech = self.mechanism
        g = mech.geometry
        return self.support_plan(
            n,
            bandwidth_bits=math.ceil(math.log2(g.points)),
            formula=(
                "Feldman et al. 2022: Var = n b(1-b)/(a-b)^2, a = h e^eps/(h e^eps+K-h), "
                "b = a h2/h + (1-a)(h-h2)/(K-h) over PG(t-1, q)"
            ),
            more={
                "q": float(mech.q),
                "t": float(mech.t),
                "reconstruction_cells": float(
                    g.table_cells if mech.reconstruction == "table" else g.enumeration_work(mech.k)
                ),
            },
        )
