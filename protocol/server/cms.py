"""Count Mean Sketch, the server half (003 §4.1, Algorithms 3-4, Theorem 4.2, Appendix A).

See :mod:`protocol.cms` for the client (003 Alg. 2), the coins and the privacy; here: the
records' columnar form and strict decoding, the sketch, the estimates and their variance,
the planner's figures and the vectorised privatizer the simulator uses.

**Server (003 Alg. 3).** The aggregate keeps exact integers: ``ones[j, ℓ]``, the number of
records with index ``j`` whose coordinate ``ℓ`` is ``+1``, and ``n_j``, the number of
records with index ``j``. Alg. 3's sketch ``M[j] = Σ k (c_ε ṽ / 2 + 1/2)`` with
``c_ε = (e**(ε/2) + 1) / (e**(ε/2) - 1) = 1 / (2p - 1)`` (for the implemented coin) is then
``M[j, ℓ] = k (c_ε (2 ones[j, ℓ] - n_j) / 2 + n_j / 2)`` (:meth:`CMSAggregate.sketch_matrix`).

**Estimator (003 Alg. 4).** ``f̃(d) = (m/(m-1)) ((1/k) Σ_j M[j, h_j(d)] - n/m)``. With
``S(d) = Σ_j ones[j, h_j(d)]`` (gathered for a whole dictionary on the integer table by
:func:`protocol.server.sketch.gather_sums`) and ``Σ_j n_j = n``, ``(1/k) Σ_j M[j, h_j(d)] =
c_ε S(d) - (c_ε - 1) n / 2``, so ``f̃(d) = (m/(m-1)) (c_ε S(d) - (c_ε - 1) n/2 - n/m)``.
It is unbiased over the coins and the hash family (003 Lemma A.1).

**Variance (003 Appendix A).** The proof of Thm 4.2 computes, before its final bound::

    Var[f̃(d)] = (m/(m-1))**2 * ( n (c_ε**2 - 1)/4
                                  + (n - f(d)) (1/m) (1 - 1/m) (1 - 1/k)
                                  + (1 - 1/m) Σ_{d' != d} f(d')**2 / (k m) )
              <= (m/(m-1))**2 * ( e**(ε/2)/(e**(ε/2) - 1)**2 + 1/m + Σ_{d'} f(d')**2/(n k m) ) * n

(``(c_ε**2 - 1)/4 = p(1-p)/(2p-1)**2 = e**(ε/2)/(e**(ε/2) - 1)**2``.) Per report, with the hash
functions fixed: a report of ``d`` adds ``(c_ε**2 - 1)/4``, a report of another value ``v`` adds
``(c_ε**2 - 1)/4 + q_v (1 - q_v)`` (``q_v``: the share of rows where ``v`` collides with ``d``), and
the collisions offset the mean by ``(m/(m-1)) Σ_v f(v) (q_v - 1/m)``; averaged over the family
these are the second and third terms, so the expression is exact for a heavy ``d`` too
(docs/estimation.md, "The sketches' standard error"). :meth:`CMSAggregate.estimate`
reports the square root of the exact expression (the bound of Thm 4.2 is
:meth:`CMSServer.variance_bound`) with two plug-ins: ``f(d)`` by the estimate clipped
to ``[0, n]``, and ``Σ_{d'} f(d')**2`` by an unbiased estimate from the sketch itself
(:meth:`CMSAggregate.second_moment`): given the data, the debiased cell
``x[j, ℓ] = c_ε (ones[j, ℓ] - n_j (1 - p))`` has mean ``g_j[ℓ]`` (the number of records of
row ``j`` whose value hashes to ``ℓ``) and variance ``n_j (c_ε**2 - 1)/4`` whatever the data,
so ``Σ_ℓ x[j, ℓ]**2 - m n_j (c_ε**2 - 1)/4`` is unbiased for ``Σ_ℓ g_j[ℓ]**2``; over the hash
family (pairwise collision probability ``1/m``) that has mean
``(1 - 1/m) Σ_d r_j(d)**2 + n_j**2 / m`` with ``r_j(d)`` the records of ``d`` in row ``j``; and
over the uniform row choice ``E Σ_j r_j(d)**2 = f(d) (1 - 1/k) + f(d)**2 / k``. Solving gives
``F̂2 = k Σ_j (Σ_ℓ x[j, ℓ]**2 - m n_j (c_ε**2 - 1)/4 - n_j**2/m) / (1 - 1/m) - (k - 1) n``,
clipped to ``[n, n**2]`` (every count is an integer, so ``Σ f**2 >= n``). Its noise enters the
variance divided by ``k m``: relative to the main term it is ``O(sqrt(2 / (k m)))``.

**The seed.** 003's expectation and variance are over the random choice of the hash
family as well as the coins. With one fixed public seed, hash collisions with other
values are a fixed offset for each queried value rather than noise; the reported
standard error includes them (the ``Σ f**2 / (k m)`` term), which is what a reader needs when
the seed is just one draw. At the deployed sizes (``k = 65,536``, ``m = 1,024``) the term is
negligible; at small sizes it dominates, and the statistical tests redraw the seed per
repetition, as the paper's analysis assumes. The family is 2-independent over keyed
BLAKE2b fingerprints (``protocol.hashing``); the mean uses only pairwise collisions, the
``Σ f**2`` term assumes triple collisions are as rare as for three-wise independent
hashes (003 Lemma A.3), which the keyed fingerprints give; the Monte Carlo test checks it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

import numpy as np
import numpy.typing as npt

from protocol.checks import check_indexed_bits
from protocol.cms import LOW56, CMSRecord, CountMeanSketch, as_value_bytes
from protocol.errors import InputError, StateError
from protocol.plain import PlainDoc
from protocol.randomness import SCALE, RandomSource, uniform_ints
from protocol.server.estimate import Estimate, VectorEstimate
from protocol.server.hashing import Fingerprints, evaluate, family_fingerprints, value_fingerprints
from protocol.server.parallel import Threads, run_parts
from protocol.server.plain import array_from_plain, array_to_plain, require
from protocol.server.records import decode_indexed_bits
from protocol.server.sketch import DictionarySketchServer, counts_with_errors, gather_sums, no_counts, read_only_view

__all__ = ["CMSAggregate", "CMSBatch", "CMSServer", "check_wire_record"]

_Real = TypeVar("_Real", float, npt.NDArray[np.float64])

_UINT32_MAX = (1 << 32) - 1
_CHUNK_BYTES = 1 << 21
"""Unpacked bytes (records x m) handled per step: a few MiB per thread, so the temporaries stay in cache."""
_DENSE_FACTOR = 16
"""Fold a chunk with one bincount over its rows when it holds at least this many records per row."""
_THREADED_CELLS = 1 << 20
"""A batch of fewer cells (records x m) is folded in the calling thread: handing out the parts would cost more."""


@dataclass(frozen=True, eq=False)
class CMSBatch:
    """Records in columnar form: ``indices`` (``int64``, ``n``) and ``bits`` (``uint8``, ``n x ceil(m/8)``)."""

    indices: npt.NDArray[np.int64]
    bits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.indices.size)

    def take(self, rows: npt.NDArray[np.integer[Any]] | npt.NDArray[np.bool_]) -> CMSBatch:
        """The sub-batch of the selected rows (an index array or a boolean mask)."""
        return CMSBatch(indices=self.indices[rows], bits=self.bits[rows])


def check_wire_record(index: object, bits: object, *, k: int, m: int, field: str) -> tuple[int, bytes]:
    """Check one CMS record's wire parts ``(j, bits)`` strictly; return them typed.

    Raises:
        MalformedReportError: ``bad-type``, ``out-of-range``, ``bad-length`` or ``bad-padding``,
            naming ``{field}.index`` or ``{field}.bits`` (:func:`protocol.checks.check_indexed_bits`).
    """
    return check_indexed_bits(index, bits, bound=k, width=m, field=field)


def _fold_rows(
    ones: npt.NDArray[np.unsignedinteger[Any]],
    indices: npt.NDArray[np.int64],
    packed: npt.NDArray[np.uint8],
    *,
    m: int,
    lo: int,
    hi: int,
) -> None:
    """Add the records whose index lies in ``[lo, hi)`` to rows ``lo..hi-1`` of ``ones``.

    Two strategies, chosen by how many records share a row: when a row receives many records
    (a small sketch), one ``bincount`` over the cells of the set bits; otherwise sort by row
    and add whole unpacked rows in rounds of distinct indices (fancy-indexed ``+=`` is wrong
    for repeated indices, so the r-th record of each row goes in round r).
    """
    if lo == 0 and hi == ones.shape[0]:
        sel = None
        j = indices
    else:
        sel = np.flatnonzero((indices >= lo) & (indices < hi))
        if sel.size == 0:
            return
        j = indices[sel]
    rows = hi - lo
    if j.size >= _DENSE_FACTOR * rows:
        bits = np.unpackbits(packed if sel is None else packed[sel], axis=1, count=m)
        flat = np.flatnonzero(bits.view(np.bool_))
        record = flat // m
        cells = (j[record] - lo) * m + (flat - record * m)
        counts = np.bincount(cells, minlength=rows * m).reshape(rows, m)
        block = ones[lo:hi]
        np.add(block, counts, out=block, casting="unsafe")
        return
    order = np.argsort(j, kind="stable")
    js = j[order]
    bits = np.unpackbits(packed[order] if sel is None else packed[sel[order]], axis=1, count=m)
    fresh = np.empty(js.size, dtype=np.bool_)
    fresh[0] = True
    np.not_equal(js[1:], js[:-1], out=fresh[1:])
    if fresh.all():
        ones[js] += bits
        return
    starts = np.flatnonzero(fresh)
    rank = np.arange(js.size) - starts[np.cumsum(fresh) - 1]
    for r in range(int(rank.max()) + 1):
        pick = np.flatnonzero(rank == r)
        ones[js[pick]] += bits[pick]


class CMSAggregate:
    """Exact integer counts ``ones[k, m]`` of +1 coordinates and ``n_j[k]`` of records per row.

    ``ones`` is ``uint32`` (1 GiB at ``k = 2**18, m = 1024``; 256 MiB at the deployed
    ``k = 65,536``) and is widened to ``uint64`` before any row could hold more than
    ``2**32 - 1`` records. Merges by addition.
    """

    def __init__(
        self,
        mechanism: CountMeanSketch,
        *,
        ones: npt.NDArray[np.unsignedinteger[Any]] | None = None,
        row_counts: npt.NDArray[np.int64] | None = None,
    ) -> None:
        self.mechanism = mechanism
        self._server = CMSServer(mechanism)
        k, m = mechanism.k, mechanism.m
        self._ones: npt.NDArray[np.unsignedinteger[Any]] = np.zeros((k, m), dtype=np.uint32) if ones is None else ones
        self._row_counts: npt.NDArray[np.int64] = np.zeros(k, dtype=np.int64) if row_counts is None else row_counts
        self._n = int(self._row_counts.sum())
        self._second_moment: float | None = None
        # Σ_ℓ (ones[j, ℓ] - n_j q)**2 per row j: zero for an empty sketch, computed by the
        # first second_moment() for a restored one; a small add then refreshes only the rows
        # it touched, so a collector that keeps its sketch in memory answers the next query
        # without another pass over all k x m counters.
        self._row_squares: npt.NDArray[np.float64] | None = (
            np.zeros(k, dtype=np.float64) if ones is None and row_counts is None else None
        )

    @property
    def n(self) -> int:
        """Number of reports folded in."""
        return self._n

    @property
    def ones(self) -> npt.NDArray[np.unsignedinteger[Any]]:
        """``ones[j, ℓ]``: records with index ``j`` whose coordinate ``ℓ`` is +1 (read-only view)."""
        return read_only_view(self._ones)

    @property
    def row_counts(self) -> npt.NDArray[np.int64]:
        """``n_j``: records with index ``j`` (read-only view)."""
        return read_only_view(self._row_counts)

    def _widen_for(self, row_counts: npt.NDArray[np.int64]) -> None:
        if self._ones.dtype == np.uint32 and row_counts.size and int(row_counts.max()) > _UINT32_MAX:
            self._ones = self._ones.astype(np.uint64)

    def add(self, batch: CMSBatch, *, threads: Threads | None = None) -> None:
        """Fold a batch of records (vectorised; 003 Alg. 3 on integer counts); a large batch's
        rows are split between the caller's ``threads``, if any.

        Raises:
            ValueError: if the batch's shapes or indices do not fit the mechanism (a decoded
                batch always fits).
        """
        mech = self.mechanism
        k = mech.k
        n = len(batch)
        if batch.bits.shape != (n, mech.record_bytes) or batch.bits.dtype != np.uint8:
            raise ValueError(f"batch bits must be uint8 of shape ({n}, {mech.record_bytes})")
        if n == 0:
            return
        if int(batch.indices.min()) < 0 or int(batch.indices.max()) >= k:
            raise ValueError(f"batch hash indices must lie in [0, {k})")
        # Rows touched and their new record counts (a small batch touches few of the k rows).
        if 8 * n < k:
            rows, added = np.unique(batch.indices, return_counts=True)
        else:
            added = np.bincount(batch.indices, minlength=k)
            rows = np.flatnonzero(added)
            added = added[rows]
        counts = self._row_counts[rows] + added
        self._widen_for(counts)
        self._fold(batch, threads)
        self._row_counts[rows] = counts
        self._n += n
        self._second_moment = None
        if self._row_squares is not None:
            if 8 * rows.size <= k:
                self._row_squares[rows] = self._squares(rows)
            else:  # a batch touching most rows: one pass at the next query, not one per add
                self._row_squares = None

    def _fold(self, batch: CMSBatch, threads: Threads | None) -> None:
        """Add the batch's bits to the sketch's cells, in chunks (by row range across threads when large)."""
        k, m = self.mechanism.k, self.mechanism.m
        n = len(batch)
        if n * m < _THREADED_CELLS or k == 1:
            # Small batches (a collector folds a message of a few records at a time): no parts.
            threads = None
        step = max(1, _CHUNK_BYTES // m)
        for start in range(0, n, step):
            chunk = functools.partial(
                _fold_rows, self._ones, batch.indices[start : start + step], batch.bits[start : start + step], m=m
            )
            # Parts own disjoint row ranges, so their updates never overlap.
            run_parts(threads, lambda rows: chunk(lo=rows.start, hi=rows.stop), k)  # noqa: B023 - run before the next chunk

    def merge(self, other: Self) -> Self:
        """The aggregate of both inputs' reports."""
        if other.mechanism != self.mechanism:
            raise ValueError("cannot merge aggregates of different mechanisms")
        counts = self._row_counts + other._row_counts
        wide = np.uint64 in (self._ones.dtype, other._ones.dtype) or int(counts.max()) > _UINT32_MAX
        ones: npt.NDArray[np.unsignedinteger[Any]] = self._ones.astype(np.uint64 if wide else np.uint32, copy=True)
        np.add(ones, other._ones, out=ones)
        return type(self)(self.mechanism, ones=ones, row_counts=counts)

    def to_plain(self) -> PlainDoc:
        """Plain, msgpack-ready data."""
        return {"n": self._n, "row_counts": array_to_plain(self._row_counts), "ones": array_to_plain(self._ones)}

    @classmethod
    def from_plain(cls, mechanism: CountMeanSketch, data: object) -> CMSAggregate:
        """Restore an aggregate saved by :meth:`to_plain`.

        Raises:
            StateError: if anything is missing, mistyped, mis-shaped or inconsistent.
        """
        where = "cms aggregate"
        n = require(data, "n", int, where=where)
        k, m = mechanism.k, mechanism.m
        counts = array_from_plain(
            require(data, "row_counts", dict, where=where), dtype="<i8", shape=(k,), field=f"{where}.row_counts"
        )
        raw_ones = require(data, "ones", dict, where=where)
        dtype = raw_ones.get("dtype")
        if dtype not in ("<u4", "<u8"):
            raise StateError(f"{where}.ones: expected dtype <u4 or <u8, got {dtype!r}")
        ones = array_from_plain(raw_ones, dtype=str(dtype), shape=(k, m), field=f"{where}.ones")
        if counts.size and int(counts.min()) < 0:
            raise StateError(f"{where}.row_counts: counts must be non-negative")
        if int(counts.sum()) != n:
            raise StateError(f"{where}: n={n} is not the sum of the row counts")
        if dtype == "<u4" and counts.size and int(counts.max()) > _UINT32_MAX:
            raise StateError(f"{where}.ones: uint32 cells cannot hold rows of more than 2**32 - 1 records")
        if bool((ones > counts[:, None].astype(np.uint64)).any()):
            raise StateError(f"{where}.ones: a cell counts more +1 coordinates than its row has records")
        return cls(mechanism, ones=ones.astype(np.uint64 if dtype == "<u8" else np.uint32), row_counts=counts)

    # ------------------------------------------------------------------ estimation

    def sketch_matrix(self) -> npt.NDArray[np.float64]:
        """``M`` exactly as 003 Alg. 3 returns it: ``k (c_ε (2 ones - n_j) / 2 + n_j / 2)`` (a new array)."""
        mech = self.mechanism
        c = self._server.c_epsilon
        nj = self._row_counts.astype(np.float64)[:, None]
        return mech.k * (c * (self._ones.astype(np.float64) - nj / 2) + nj / 2)

    def second_moment(self) -> float:
        """Unbiased estimate of ``Σ_d f(d)**2`` from the sketch, clipped to ``[n, n**2]`` (module docstring)."""
        if self._second_moment is not None:
            return self._second_moment
        mech = self.mechanism
        n, k, m = self._n, mech.k, mech.m
        if n == 0:
            return 0.0
        c = self._server.c_epsilon
        nj = self._row_counts.astype(np.float64)
        if self._row_squares is None:
            block = max(1, (1 << 22) // m)
            self._row_squares = np.concatenate(
                [self._squares(np.arange(start, min(start + block, k))) for start in range(0, k, block)]
            )
        total = float(self._row_squares.sum())
        row_sq = c * c * total - m * n * self._server.coin_variance - float(np.dot(nj, nj)) / m
        f2 = k * row_sq / (1 - 1 / m) - (k - 1) * n
        self._second_moment = float(min(max(f2, float(n)), float(n) * n))
        return self._second_moment

    def _squares(self, rows: npt.NDArray[np.intp] | npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """``Σ_ℓ (ones[j, ℓ] - n_j q)**2`` for each row ``j`` of ``rows`` (one row at a time the same way)."""
        q = 1.0 - self.mechanism.keep_probability
        debiased = self._ones[rows].astype(np.float64)
        debiased -= (self._row_counts[rows].astype(np.float64) * q)[:, None]
        squares: npt.NDArray[np.float64] = np.einsum("ij,ij->i", debiased, debiased)
        return squares

    def estimate(self, candidates: Sequence[str | bytes], *, threads: Threads | None = None) -> VectorEstimate:
        """Estimated counts of ``candidates`` (003 Alg. 4) with standard errors; the gather splits
        between the caller's ``threads``, if any.

        Raises:
            InputError: if a candidate is neither ``str`` nor ``bytes``.
        """
        checked = [as_value_bytes(v) for v in candidates]
        return self.estimate_fingerprints(family_fingerprints(self.mechanism.family, checked), threads=threads)

    def estimate_fingerprints(self, fp: Fingerprints, *, threads: Threads | None = None) -> VectorEstimate:
        """As :meth:`estimate`, for candidates already fingerprinted under the mechanism's family."""
        mech = self.mechanism
        n = self._n
        if n == 0:
            return no_counts(len(fp))
        # S(d) = Σ_j ones[j, h_j(d)], exact in float64 (every partial sum is an integer <= n).
        sums = gather_sums(self._ones, mech.family, fp, threads=threads)
        values = self._server.estimate_from_sums(sums, n)
        return counts_with_errors(values, n=n, second_moment=self.second_moment(), variance=self._server.variance)

    def top(
        self,
        candidates: Sequence[str | bytes],
        *,
        n_top: int | None = None,
        threshold: float = -math.inf,
        threads: Threads | None = None,
    ) -> list[tuple[str | bytes, Estimate]]:
        """Candidates whose estimated count is at least ``threshold``, largest first (at most ``n_top``).

        003 §3.2.2: the published histograms keep only entries above a threshold.
        """
        est = self.estimate(candidates, threads=threads)
        order = np.argsort(-est.values, kind="stable")
        keep = order[est.values[order] >= threshold]
        if n_top is not None:
            keep = keep[:n_top]
        return [(candidates[i], est[int(i)]) for i in keep]


class CMSServer(DictionarySketchServer[CountMeanSketch, CMSBatch, CMSAggregate]):
    """Count Mean Sketch's server half: a frequency oracle over a dictionary."""

    batch_type: ClassVar[type[CMSBatch]] = CMSBatch
    aggregate_type: ClassVar[type[CMSAggregate]] = CMSAggregate
    plan_formula: ClassVar[str] = (
        "003 Thm 4.2: Var <= (m/(m-1))^2 ((c^2-1)/4 + 1/m + sum f^2/(n k m)) n, sum f^2 <= 0.1 n^2"
    )

    # ------------------------------------------------------------------ constants

    @property
    def coin_variance(self) -> float:
        """``(c_ε**2 - 1) / 4 = p (1 - p) / (2p - 1)**2``, the per-report term of 003 Thm 4.2."""
        p = self.mechanism.keep_coin.probability
        return float(p * (1 - p) / (2 * p - 1) ** 2)

    # ------------------------------------------------------------------- wire form

    def batch(self, records: Sequence[CMSRecord]) -> CMSBatch:
        """Typed records in columnar form."""
        n = len(records)
        width = self.mechanism.record_bytes
        indices = np.fromiter((r.index for r in records), dtype=np.int64, count=n)
        raw = b"".join(r.bits for r in records)
        if len(raw) != n * width:
            raise InputError(f"every record's vector must have {width} bytes")
        bits = np.frombuffer(raw, dtype=np.uint8).reshape(n, width).copy()
        return CMSBatch(indices=indices, bits=bits)

    def decode_records(self, raw: object) -> CMSBatch:
        """Strictly decode the wire form of :meth:`CountMeanSketch.encode_records`.

        Raises:
            MalformedReportError: ``bad-type``, ``bad-length``, ``out-of-range`` or
                ``bad-padding``, naming ``records``, ``records[i]``, ``records[i].index`` or
                ``records[i].bits``.
        """
        mech = self.mechanism
        indices, bits = decode_indexed_bits(raw, bound=mech.k, width=mech.m, index_name="index")
        return CMSBatch(indices=indices, bits=bits)

    # ---------------------------------------------------------------- simulation

    def privatize_many(self, values: Sequence[str | bytes], rng: RandomSource) -> CMSBatch:
        """Privatize many values at once (the simulator's path); same distribution as ``privatize``.

        Repeated values are fingerprinted once.
        """
        return self.privatize_fingerprints(value_fingerprints(self.mechanism.family, values), rng)

    def privatize_fingerprints(self, fp: Fingerprints, rng: RandomSource) -> CMSBatch:
        """Privatize values given by their fingerprints under the mechanism's family (vectorised 003 Alg. 2)."""
        mech = self.mechanism
        n, m = len(fp), mech.m
        indices = np.empty(n, dtype=np.int64)
        bits = np.empty((n, mech.record_bytes), dtype=np.uint8)
        step = max(1, _CHUNK_BYTES // m)
        for start in range(0, n, step):
            stop = min(n, start + step)
            flips, j = self._flip_matrix(rng, stop - start)
            part = Fingerprints(lo=fp.lo[start:stop], hi=fp.hi[start:stop])
            h = evaluate(mech.family, part, j)
            rows = np.arange(stop - start)
            flips[rows, h] = ~flips[rows, h]
            indices[start:stop] = j
            bits[start:stop] = np.packbits(flips, axis=1)
        return CMSBatch(indices=indices, bits=bits)

    def _flip_matrix(self, rng: RandomSource, rows: int) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
        """``rows x m`` exact flip coins and ``rows`` uniform hash indices, from one draw when possible.

        Each coin compares a uniform 64-bit ``U`` with the flip threshold ``T``: the top byte
        of ``U`` decides unless it equals ``T``'s top byte; only then a fresh word's top 56 bits
        are compared with ``T``'s low 56 bits. ``Pr[heads] = T / 2**64`` exactly.
        """
        m = self.mechanism.m
        threshold = self.mechanism.flip_coin.numerator  # < 2**63: p > 1/2
        high, low = threshold >> 56, threshold & LOW56
        cells = rows * m
        coin_words = (cells + 7) // 8
        # Spare words: one per hash index, and about twice the expected number of ties.
        spare = rows + 4 + (cells >> 7)
        words = rng.words(coin_words + spare)
        u = words[:coin_words].view(np.uint8)[:cells].reshape(rows, m)
        flips = u < np.uint8(high)
        ties = np.flatnonzero(u == np.uint8(high))
        extra = words[coin_words + rows :]
        if ties.size:
            if ties.size > extra.size:
                extra = np.concatenate([extra, rng.words(int(ties.size - extra.size))])
            flips.reshape(-1)[ties] = (extra[: ties.size] >> np.uint64(8)) < np.uint64(low)
        return flips, self._indices_from_words(rng, words[coin_words : coin_words + rows])

    def _indices_from_words(self, rng: RandomSource, words: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Uniform hash indices in ``[k]`` from uniform words (003 Alg. 2 step 1), exactly."""
        k = self.mechanism.k
        if k & (k - 1) == 0:
            if k == 1:
                return np.zeros(words.size, dtype=np.int64)
            return (words >> np.uint64(64 - (k.bit_length() - 1))).astype(np.int64)
        limit = np.uint64(SCALE - SCALE % k)
        out = (words % np.uint64(k)).astype(np.int64)
        rejected = np.flatnonzero(words >= limit)  # probability below k / 2**64 per word
        if rejected.size:
            out[rejected] = uniform_ints(rng, k, int(rejected.size))
        return out

    # ------------------------------------------------------------------ estimation

    def estimate_from_sums(self, sums: _Real, n: int) -> _Real:
        """003 Alg. 4 from ``S(d) = Σ_j ones[j, h_j(d)]``: ``(m/(m-1)) (c_ε S - (c_ε - 1) n/2 - n/m)``."""
        m, c = self.mechanism.m, self.c_epsilon
        return (m / (m - 1)) * (c * sums - (c - 1) * n / 2 - n / m)

    def variance(self, *, n: float, count: _Real, others_sum_sq: _Real) -> _Real:
        """Exact ``Var[f̃(d)]`` over coins and hash family (003 App. A, the line before the bound).

        Args:
            n: number of reports.
            count: ``f(d)``, the true count of the queried value.
            others_sum_sq: ``Σ_{d' != d} f(d')**2``.
        """
        k, m = self.mechanism.k, self.mechanism.m
        var_y = (
            n * self.coin_variance
            + (n - count) * (1 / m) * (1 - 1 / m) * (1 - 1 / k)
            + (1 - 1 / m) * others_sum_sq / (k * m)
        )
        return (m / (m - 1)) ** 2 * var_y

    def variance_bound(self, *, n: float, sum_sq: _Real) -> _Real:
        """The bound of 003 Thm 4.2: ``(m/(m-1))**2 ((c_ε**2 - 1)/4 + 1/m + Σ f**2 / (n k m)) n``."""
        k, m = self.mechanism.k, self.mechanism.m
        return (m / (m - 1)) ** 2 * (n * (self.coin_variance + 1 / m) + sum_sq / (k * m))

    @property
    def bandwidth_bits(self) -> float:
        """Bits of one report: the hash index and the ``m``-bit vector."""
        return math.log2(self.mechanism.k) + self.mechanism.m
