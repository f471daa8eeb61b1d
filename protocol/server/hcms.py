"""Hadamard Count Mean Sketch, the server half (003 §4.2, Algorithms 7 and 4, Theorem 4.4, Appendix B).

See :mod:`protocol.hcms` for the client (003 Alg. 6) and the privacy; here: the records'
columnar form and strict decoding, the sketch, the estimates and their variance, the
planner's figures and the vectorised privatizer the simulator uses.

**Server (003 Alg. 7 and Alg. 4).** The aggregate holds the exact integer signed sums
``s[j, ℓ] = Σ w̃`` over the records with that ``(j, ℓ)``, and ``n``. Alg. 7 adds
``x̃ = k c_ε w̃`` with ``c_ε = (e**ε + 1) / (e**ε - 1) = 1 / (2p - 1)`` to ``M^H[j, ℓ]`` and then
multiplies by ``H_m^T`` (= ``H_m``, Sylvester matrices are symmetric); so
``M^H = k c_ε (s H_m)``. The transform ``T = s H_m`` is computed on the integer sums with a
fast Walsh-Hadamard transform (exact: every partial sum is an integer of magnitude at
most ``n < 2**53`` in float64) and cached until the next ``add``/``merge``. The estimate of
Alg. 4 is then ``f̃(d) = (m / (m - 1)) ((1/k) Σ_j M^H[j, h_j(d)] - n/m)
= (m / (m - 1)) (c_ε Σ_j T[j, h_j(d)] - n/m)``, gathered over a whole dictionary with
:func:`protocol.server.sketch.gather_sums`.

**Variance (003 Appendix B).** Record ``i`` contributes ``X_i = c_ε w̃_i H[ℓ_i, h_{j_i}(d)]``
to ``Z = (1/k) Σ_j M^H[j, h_j(d)]``. Since ``X_i**2 = c_ε**2`` and, for fixed hash functions,
``E[X_i] = μ_i = (1/k) Σ_j 1{h_j(d) = h_j(d_i)}``, the records are independent given the
hashes and ``Var[Z | hashes] = Σ_i (c_ε**2 - μ_i**2)``. Over the random choice of the hash
family (the expectation 003 takes: ``E[μ_i**2] = 1/m**2 + (1 - 1/m)/(k m)`` for ``d_i != d``, and
the collisions of ``d`` with two distinct values are uncorrelated, as for a three-wise
independent family) this gives exactly the line before the bound in the proof of Thm 4.4::

    Var[f̃(d)] = (m/(m-1))**2 * ( n c_ε**2 - f(d) - (n - f(d)) (1/m**2 + (1 - 1/m)/(k m))
                                  + (1 - 1/m) Σ_{d' != d} f(d')**2 / (k m) )
              <= (m/(m-1))**2 * ( c_ε**2 + Σ_{d'} f(d')**2 / (n k m) ) * n        (Thm 4.4)

:meth:`HCMSAggregate.estimate` reports the square root of the exact expression with two
plug-ins: ``f(d)`` by the estimate clipped to ``[0, n]``, and ``Σ_{d'} f(d')**2`` by an unbiased
moment estimate from the sketch itself (:meth:`HCMSAggregate.second_moment`): for the
signed sums, ``E[Σ s**2] = n + (G - n) / (k m c_ε**2)`` with ``G = (1/k) Σ_j Σ_a g_j[a]**2``
(``g_j`` is the histogram of all data hashed by ``h_j``), and ``E[G] = F2 + (n**2 - F2)/m`` over
the hash family. Its noise enters the variance divided by ``k m``, i.e. relative to the
main term ``n c_ε**2`` it is ``O(sqrt(2 / (k m)))``: below 3% at ``k m = 4,096`` and 0.03% at
the Safari parameters. The bound of Thm 4.4 alone would overstate the error of frequent
values (the ``-f(d)`` term: for ``f(d)`` close to ``n`` the true variance is ``n (c_ε**2 - 1)``).

The expectation and variance are over the hash family as well as the coins. With one
fixed public seed, hash collisions are a fixed offset for each value; it is part of the
reported error (the ``Σ f**2 / (k m)`` term), negligible at deployed sizes and large at small
test sizes, which is why the statistical tests redraw the seed per repetition.

The hash family is 2-independent (``protocol.hashing``) over keyed-BLAKE2b fingerprints;
the mean uses only pairwise collision probabilities, the ``Σ f(d')**2`` term assumes
triple collisions are as rare as for three-wise independent hashes (003 Lemma B.3). The
Monte Carlo test checks the resulting variance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

import numpy as np
import numpy.typing as npt

from protocol.errors import InputError, StateError
from protocol.hcms import HadamardCountMeanSketch, HCMSRecord, hashed_value
from protocol.plain import PlainDoc
from protocol.randomness import RandomSource, bernoulli, uniform_ints
from protocol.server.estimate import VectorEstimate
from protocol.server.hadamard import hadamard_rows
from protocol.server.hashing import Fingerprints, evaluate, family_fingerprints
from protocol.server.parallel import Threads
from protocol.server.plain import array_from_plain, array_to_plain, require
from protocol.server.records import int_record, record_list
from protocol.server.sketch import DictionarySketchServer, counts_with_errors, gather_sums, no_counts, read_only_view

__all__ = ["HCMSAggregate", "HCMSBatch", "HCMSServer"]

_Real = TypeVar("_Real", float, npt.NDArray[np.float64])

_INT32_MAX = (1 << 31) - 1
_CACHED_TABLE = 1 << 22


@dataclass(frozen=True, eq=False)
class HCMSBatch:
    """Records in columnar form: ``j`` and ``ell`` as ``int64``, ``bits`` as ``uint8`` zeros and ones."""

    j: npt.NDArray[np.int64]
    ell: npt.NDArray[np.int64]
    bits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.bits.size)


class HCMSAggregate:
    """Exact integer signed sums ``s[j, ℓ] = Σ w̃`` and ``n``; merges by addition.

    ``s`` is ``int32`` while ``n < 2**31`` (then ``|s[j, ℓ]| <= n`` cannot overflow) and is
    widened to ``int64`` before ``n`` would pass that: at the Safari parameters (k = 1,024,
    m = 32,768) this halves the table to 128 MiB. The transformed sketch (float64, twice
    that) is built on the first query and kept until the next ``add`` or ``merge``. Not
    safe for concurrent use from several threads.
    """

    def __init__(
        self,
        mechanism: HadamardCountMeanSketch,
        *,
        sums: npt.NDArray[np.integer[Any]] | None = None,
        n: int = 0,
    ) -> None:
        self.mechanism = mechanism
        self._server = HCMSServer(mechanism)
        self._n = n
        dtype = np.int32 if n <= _INT32_MAX else np.int64
        if sums is None:
            self._sums: npt.NDArray[np.integer[Any]] = np.zeros((mechanism.k, mechanism.m), dtype=dtype)
        else:
            self._sums = sums.astype(dtype, copy=False)
        self._cache: tuple[npt.NDArray[np.float64], float] | None = None

    @property
    def n(self) -> int:
        """Number of reports folded in."""
        return self._n

    @property
    def sums(self) -> npt.NDArray[np.integer[Any]]:
        """The ``k x m`` signed sums (read-only view)."""
        return read_only_view(self._sums)

    def _widen_for(self, n: int) -> None:
        if n > _INT32_MAX and self._sums.dtype != np.int64:
            self._sums = self._sums.astype(np.int64)

    def add(self, batch: HCMSBatch) -> None:
        """Fold a batch of records (003 Alg. 7 steps 3-5, on the unscaled signs)."""
        size = len(batch)
        if size == 0:
            return
        k, m = self.mechanism.k, self.mechanism.m
        j, ell, bits = batch.j, batch.ell, batch.bits
        if not (j.size == ell.size == size):
            raise ValueError("HCMS batch columns differ in length")
        if int(j.min()) < 0 or int(j.max()) >= k or int(ell.min()) < 0 or int(ell.max()) >= m or int(bits.max()) > 1:
            raise ValueError("HCMS batch index or bit out of range")
        self._widen_for(self._n + size)
        flat = self._sums.reshape(-1)
        cell = j.astype(np.int64, copy=False) * m + ell
        if size >= k * m * (1 if k * m <= _CACHED_TABLE else 4):
            # Large batch relative to the table: one counting pass over (cell, bit) codes.
            # Measured crossover with np.add.at: about k m records for tables that fit in
            # cache, about 4 k m for the 32 Mi-cell Safari table (scattered adds miss cache).
            counts = np.bincount(cell * 2 + bits, minlength=2 * k * m)
            flat += (counts[1::2] - counts[0::2]).astype(flat.dtype)
        else:
            np.add.at(flat, cell, np.where(bits.astype(bool), 1, -1).astype(flat.dtype))
        self._n += size
        self._cache = None

    def merge(self, other: Self) -> Self:
        """The aggregate of both inputs' reports."""
        if other.mechanism != self.mechanism:
            raise ValueError("cannot merge aggregates of different mechanisms")
        n = self._n + other._n
        dtype = np.int32 if n <= _INT32_MAX else np.int64
        sums = np.add(self._sums, other._sums, dtype=dtype)
        return type(self)(self.mechanism, sums=sums, n=n)

    def to_plain(self) -> PlainDoc:
        """Plain, msgpack-ready data."""
        return {"n": self._n, "sums": array_to_plain(self._sums)}

    @classmethod
    def from_plain(cls, mechanism: HadamardCountMeanSketch, data: object) -> HCMSAggregate:
        """Restore an aggregate saved by :meth:`to_plain`.

        Raises:
            StateError: wrong shape or dtype, or sums no set of ``n`` reports can produce
                (``Σ |s| <= n`` and ``Σ s ≡ n (mod 2)``).
        """
        n = require(data, "n", int, where="hcms aggregate")
        if n < 0:
            raise StateError(f"hcms aggregate.n: must be >= 0; got {n}")
        raw = require(data, "sums", dict, where="hcms aggregate")
        dtype = "<i4" if n <= _INT32_MAX else "<i8"
        sums = array_from_plain(raw, dtype=dtype, shape=(mechanism.k, mechanism.m), field="hcms aggregate.sums")
        total_abs = 0
        total = 0
        step = max(1, (1 << 20) // mechanism.m)
        for r0 in range(0, mechanism.k, step):
            part = sums[r0 : r0 + step].astype(np.int64)
            total_abs += int(np.abs(part).sum())
            total += int(part.sum())
        if total_abs > n or (total - n) % 2:
            raise StateError(f"hcms aggregate.sums: not the signed sums of n={n} reports")
        return cls(mechanism, sums=sums, n=n)

    # ------------------------------------------------------------------ estimation

    def _transformed(self, threads: Threads | None = None) -> tuple[npt.NDArray[np.float64], float]:
        if self._cache is None:
            self._cache = hadamard_rows(self._sums, threads=threads)
        return self._cache

    def transformed(self) -> npt.NDArray[np.float64]:
        """``T = s H_m`` (integer-valued float64); the sketch of 003 Alg. 7 is ``M^H = k c_ε T``."""
        return read_only_view(self._transformed()[0])

    def sketch_matrix(self) -> npt.NDArray[np.float64]:
        """``M^H`` exactly as 003 Alg. 7 returns it (a new array; queries use the cached ``T``)."""
        mech = self.mechanism
        return self._transformed()[0] * (mech.k * self._server.c_epsilon)

    def second_moment(self) -> float:
        """Unbiased estimate of ``Σ_d f(d)**2`` from the sketch, clipped to ``[0, n**2]``.

        ``Ĝ = n + k m c_ε**2 (Σ s**2 - n)`` estimates ``G = (1/k) Σ_j ||g_j||**2`` without bias,
        and ``E[G] = F2 (1 - 1/m) + n**2 / m`` over the hash family (see the module docstring).
        """
        mech = self.mechanism
        n, k, m = self._n, mech.k, mech.m
        if n == 0:
            return 0.0
        sum_sq = self._transformed()[1]
        g_hat = n + k * m * self._server.c_epsilon**2 * (sum_sq - n)
        f2 = (g_hat - n * n / m) / (1 - 1 / m)
        return float(min(max(f2, 0.0), float(n) * n))

    def estimate(self, candidates: Sequence[str | bytes], *, threads: Threads | None = None) -> VectorEstimate:
        """Estimated counts of ``candidates`` (003 Alg. 4 on ``M^H``) with standard errors; the
        transform and the gather split between the caller's ``threads``, if any."""
        checked = [hashed_value(v) for v in candidates]
        return self.estimate_fingerprints(family_fingerprints(self.mechanism.family, checked), threads=threads)

    def estimate_fingerprints(self, fp: Fingerprints, *, threads: Threads | None = None) -> VectorEstimate:
        """As :meth:`estimate`, for candidates already fingerprinted under the mechanism's family."""
        mech = self.mechanism
        n, m = self._n, mech.m
        if n == 0:
            return no_counts(len(fp))
        table = self._transformed(threads)[0]
        # 003 Alg. 4: (1/k) Σ_j M^H[j, h_j(d)] = c_ε Σ_j T[j, h_j(d)]; the gather is exact.
        gathered = gather_sums(table, mech.family, fp, threads=threads)
        values = (m / (m - 1)) * (self._server.c_epsilon * gathered - n / m)
        return counts_with_errors(values, n=n, second_moment=self.second_moment(), variance=self._server.variance)


class HCMSServer(DictionarySketchServer[HadamardCountMeanSketch, HCMSBatch, HCMSAggregate]):
    """Hadamard Count Mean Sketch's server half: a frequency oracle over a dictionary."""

    batch_type: ClassVar[type[HCMSBatch]] = HCMSBatch
    aggregate_type: ClassVar[type[HCMSAggregate]] = HCMSAggregate
    plan_formula: ClassVar[str] = "003 Thm 4.4: Var <= (m/(m-1))^2 (c^2 + sum f^2/(n k m)) n, sum f^2 <= 0.1 n^2"

    # ------------------------------------------------------------------- wire form

    def batch(self, records: Sequence[HCMSRecord]) -> HCMSBatch:
        """Typed records in columnar form."""
        n = len(records)
        return HCMSBatch(
            j=np.fromiter((r.j for r in records), dtype=np.int64, count=n),
            ell=np.fromiter((r.ell for r in records), dtype=np.int64, count=n),
            bits=np.fromiter((r.bit for r in records), dtype=np.uint8, count=n),
        )

    def decode_records(self, raw: object) -> HCMSBatch:
        """Strictly decode the wire form of :meth:`HadamardCountMeanSketch.encode_records`.

        Raises:
            MalformedReportError: ``bad-type``, ``bad-length`` or ``out-of-range``, naming
                ``records[i]``, ``records[i].j``, ``records[i].ell`` or ``records[i].bit``.
        """
        records = record_list(raw, "[j, ell, bit]")
        n = len(records)
        j = np.empty(n, dtype=np.int64)
        ell = np.empty(n, dtype=np.int64)
        bits = np.empty(n, dtype=np.uint8)
        limits = (("j", self.mechanism.k), ("ell", self.mechanism.m), ("bit", 2))
        for i, rec in enumerate(records):
            j[i], ell[i], bits[i] = int_record(rec, f"records[{i}]", "[j, ell, bit]", limits)
        return HCMSBatch(j=j, ell=ell, bits=bits)

    # ---------------------------------------------------------------- simulation

    def privatize_many(self, values: Sequence[str | bytes], rng: RandomSource) -> HCMSBatch:
        """Privatize many values at once (the simulator's path); same distribution as ``privatize``.

        Repeated values are fingerprinted once.
        """
        try:
            position: dict[str | bytes, int] = {}
            codes = np.fromiter(
                (position.setdefault(v, len(position)) for v in values), dtype=np.int64, count=len(values)
            )
            distinct = [hashed_value(v) for v in position]
        except TypeError as exc:
            raise InputError(f"HCMS privatizes str or bytes values: {exc}") from exc
        fp = family_fingerprints(self.mechanism.family, distinct)
        return self.privatize_fingerprints(fp.take(codes), rng)

    def privatize_fingerprints(self, fp: Fingerprints, rng: RandomSource) -> HCMSBatch:
        """Privatize values given by their fingerprints under the mechanism's family (vectorised 003 Alg. 6)."""
        mech = self.mechanism
        n = len(fp)
        j = uniform_ints(rng, mech.k, n)
        ell = uniform_ints(rng, mech.m, n)
        h = evaluate(mech.family, fp, j)
        parity = (np.bitwise_count(ell & h) & 1).astype(np.uint8)
        b_plus = bernoulli(rng, mech.keep_coin, n).astype(np.uint8)
        return HCMSBatch(j=j, ell=ell, bits=b_plus ^ parity)

    # ------------------------------------------------------------------ estimation

    def variance(self, *, n: float, count: _Real, others_sum_sq: _Real) -> _Real:
        """Exact ``Var[f̃(d)]`` over coins and hash family (003 App. B, line before the bound).

        Args:
            n: number of reports.
            count: ``f(d)``, the true count of the queried value.
            others_sum_sq: ``Σ_{d' != d} f(d')**2``.
        """
        k, m, c2 = self.mechanism.k, self.mechanism.m, self.c_epsilon**2
        pair = 1 / m**2 + (1 - 1 / m) / (k * m)  # E[μ**2] for a value that is not d
        var_z = n * c2 - count - (n - count) * pair + (1 - 1 / m) * others_sum_sq / (k * m)
        return (m / (m - 1)) ** 2 * var_z

    def variance_bound(self, *, n: float, sum_sq: _Real) -> _Real:
        """The upper bound of 003 Thm 4.4: ``(m/(m-1))**2 (c_ε**2 + Σ f**2 / (n k m)) n``."""
        k, m = self.mechanism.k, self.mechanism.m
        return (m / (m - 1)) ** 2 * (self.c_epsilon**2 * n + sum_sq / (k * m))

    @property
    def bandwidth_bits(self) -> float:
        """Bits of one report: the hash index, the Hadamard coordinate and the bit."""
        return math.log2(self.mechanism.k) + math.log2(self.mechanism.m) + 1
