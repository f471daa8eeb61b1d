"""Hadamard Count Mean Sketch (003 §4.2, Algorithms 5-7, Theorems 4.3-4.4, Appendix B).

A frequency oracle over strings where each device sends one privatized bit plus two
indices, and the server keeps a ``k x m`` sketch.

**Client (003 Alg. 6).** For a value ``d``: draw ``j`` uniform in ``[k]`` and ``ℓ`` uniform in
``[m]``; ``w_ℓ = (H_m e_{h_j(d)})_ℓ = (-1)**popcount(ℓ AND h_j(d))`` is one entry of the
Sylvester-ordered Hadamard matrix of eq. (3); draw ``b = +1`` with probability
``p = e**ε / (e**ε + 1)`` (an exact coin, rounded down to a multiple of ``2**-64``) and
send ``(j, ℓ, w̃ = b * w_ℓ)``. On the wire a record is ``[j, ℓ, bit]`` with ``bit = 1`` exactly
when ``w̃ = +1``. There is no permanent state: every event is privatized afresh.

**Privacy (003 Thm 4.3).** ``Pr[(j, ℓ, w̃) | d] = p / (k m)`` or ``(1 - p) / (k m)``
depending only on whether ``w̃ = w_ℓ(d)``, so every likelihood ratio is at most
``p / (1 - p) <= e**ε`` for the implemented coin. ``epsilon_report`` is
``ln(p / (1 - p))`` exactly, equal to ε up to the coin's ``2**-64`` rounding, and the bound
is reached for every pair of values whose hashes differ in some row (there the Hadamard
entries differ for half of the ``ℓ``).

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
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar, Final, Self, TypeVar

import numpy as np
import numpy.typing as npt

from protocol.checks import check_epsilon, check_int, check_seed, encoded_size
from protocol.errors import InputError, MalformedReportError, ParameterError, StateError
from protocol.hashing import HashFamily, fingerprint
from protocol.interfaces import (
    EstimateKind,
    EventLevelStrings,
    MechanismEntry,
    Privatization,
    ValueType,
    own,
)
from protocol.randomness import SCALE, Coin, RandomSource, bernoulli, coin_at_most, dexp, uniform_ints
from protocol.server.contract import Aggregate, Batch, PlanFigures
from protocol.server.estimate import VectorEstimate
from protocol.server.hashing import Fingerprints, evaluate, family_fingerprints
from protocol.server.plain import array_from_plain, array_to_plain, require
from protocol.server.sketch import gather_sums

__all__ = [
    "ENTRY",
    "HCMSAggregate",
    "HCMSBatch",
    "HCMSRecord",
    "HadamardCountMeanSketch",
    "hadamard_rows",
    "sylvester",
]

_Real = TypeVar("_Real", float, npt.NDArray[np.float64])

_INT32_MAX = (1 << 31) - 1
_M_MAX = 1 << 32
_INNER_BITS = 10
"""The lowest ``2**10`` coordinates of each row are transformed by two small matrix products."""
_BLOCK_ELEMENTS = 1 << 16
"""Rows are transformed in blocks of about 512 KiB, so every butterfly stage runs in cache."""
_THREADED_ELEMENTS = 1 << 20
_CACHED_TABLE = 1 << 22


def sylvester(m: int) -> npt.NDArray[np.float64]:
    """The ``m x m`` Sylvester-ordered Hadamard matrix of 003 eq. (3).

    ``H[a, b] = (-1)**popcount(a AND b)``, which is the recursion
    ``H_2m = [[H_m, H_m], [H_m, -H_m]]`` unrolled. Symmetric, and ``H H = m I``.
    """
    if m < 1 or m & (m - 1):
        raise ValueError(f"a Sylvester matrix needs a power of two; got {m}")
    i = np.arange(m, dtype=np.uint64)
    odd = np.bitwise_count(i[:, None] & i[None, :]) & np.uint8(1)
    return np.where(odd.astype(bool), -1.0, 1.0)


def _transform_block(
    block: npt.NDArray[np.float64],
    buf: npt.NDArray[np.float64],
    h_last: npt.NDArray[np.float64],
    h_mid: npt.NDArray[np.float64] | None,
) -> None:
    """``block <- block @ H_m`` for each row of ``block``, in place (``buf`` is scratch).

    ``H_m`` is a Kronecker product of smaller Sylvester matrices (``H_m[ℓ, c]`` factors over
    the bits of ``ℓ`` and ``c``), so the low bits are done as two small matrix products over
    reshaped views and the remaining bits as radix-2 butterflies on contiguous halves.
    """
    r, m = block.shape
    a_last = h_last.shape[0]
    if h_mid is None:
        x2 = block.reshape(-1, a_last)
        y2 = buf[: block.size].reshape(x2.shape)
        np.matmul(x2, h_last, out=y2)
        np.copyto(x2, y2)
        h = a_last
    else:
        a_mid = h_mid.shape[0]
        x3 = block.reshape(-1, a_mid, a_last)
        y3 = buf[: block.size].reshape(x3.shape)
        np.matmul(x3, h_last, out=y3)
        np.matmul(h_mid, y3, out=x3)
        h = a_mid * a_last
    while h < m:
        v = block.reshape(r, m // (2 * h), 2, h)
        lo = v[:, :, 0, :]
        hi = v[:, :, 1, :]
        t = buf[: lo.size].reshape(lo.shape)
        np.subtract(lo, hi, out=t)
        np.add(lo, hi, out=lo)
        np.copyto(hi, t)
        h *= 2


def hadamard_rows(
    table: npt.NDArray[np.integer[Any]] | npt.NDArray[np.floating[Any]],
    *,
    workers: int | None = None,
) -> tuple[npt.NDArray[np.float64], float]:
    """Every row of ``table`` times ``H_m`` (003 Alg. 7 step 6), in float64.

    Args:
        table: a ``k x m`` array, ``m`` a power of two.
        workers: threads (numpy releases the GIL); defaults to the number of CPUs.

    Returns:
        ``(table @ H_m, Σ table**2)``; the sum of squares is taken on the way because the
        second-moment estimate needs it and the rows are in cache at that point.
    """
    k, m = table.shape
    if m < 1 or m & (m - 1):
        raise ValueError(f"row length must be a power of two; got {m}")
    out = np.empty((k, m), dtype=np.float64)
    if k == 0:
        return out, 0.0
    bits = m.bit_length() - 1
    inner = min(bits, _INNER_BITS)
    h_last = sylvester(1 << ((inner + 1) // 2))
    h_mid = sylvester(1 << (inner // 2)) if inner >= 2 else None
    rows_per_block = max(1, _BLOCK_ELEMENTS // m)
    threads = max(1, workers if workers is not None else (os.cpu_count() or 1))
    if k * m < _THREADED_ELEMENTS:
        threads = 1
    threads = min(threads, k)
    bounds = [k * t // threads for t in range(threads + 1)]

    def work(start: int, stop: int) -> float:
        buf = np.empty(rows_per_block * m, dtype=np.float64)
        total = 0.0
        for r0 in range(start, stop, rows_per_block):
            r1 = min(r0 + rows_per_block, stop)
            block = out[r0:r1]
            np.copyto(block, table[r0:r1])
            flat = block.reshape(-1)
            # einsum, not np.dot/np.vecdot: those call BLAS ddot, which OpenBLAS spreads over
            # threads that spin against the transform's own workers on a busy machine.
            total += float(np.einsum("i,i->", flat, flat))
            _transform_block(block, buf, h_last, h_mid)
        return total

    if threads == 1:
        return out, work(0, k)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = [pool.submit(work, bounds[t], bounds[t + 1]) for t in range(threads)]
        total = sum(f.result() for f in futures)
    return out, total


@dataclass(frozen=True, slots=True)
class HCMSRecord:
    """One privatized report: hash index ``j``, Hadamard coordinate ``ell`` and the bit (1 means ``w̃ = +1``)."""

    j: int
    ell: int
    bit: int


@dataclass(frozen=True, eq=False)
class HCMSBatch:
    """Records in columnar form: ``j`` and ``ell`` as ``int64``, ``bits`` as ``uint8`` zeros and ones."""

    j: npt.NDArray[np.int64]
    ell: npt.NDArray[np.int64]
    bits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.bits.size)


def _as_value_bytes(value: object) -> str | bytes:
    if isinstance(value, str | bytes):
        return value
    raise InputError(f"HCMS privatizes str or bytes values; got {type(value).__name__}")


@dataclass(frozen=True, kw_only=True)
class HadamardCountMeanSketch(EventLevelStrings):
    """Apple's Hadamard Count Mean Sketch (003 §4.2): one privatized bit per event.

    Args:
        epsilon: ε per report, in (0, 64].
        k: number of hash functions (rows of the sketch), at least 1.
        m: Hadamard dimension (columns of the sketch), a power of two in ``[2, 2**32]``.
        seed: the use case's public hash seed (at least 16 bytes).
    """

    name: ClassVar[str] = "hcms"
    server: ClassVar[str] = "protocol.server.contract:Unsplit"  # both halves in this class, for now
    privatization: ClassVar[Privatization] = Privatization.EVENT
    value_type: ClassVar[ValueType] = ValueType.STRING
    value_range: ClassVar[tuple[float, float] | None] = None
    kind: ClassVar[EstimateKind] = EstimateKind.DICTIONARY
    epsilon: float
    k: int
    m: int
    seed: bytes

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_int(self.k, "k", low=1)
        m = self.m
        if isinstance(m, bool) or not isinstance(m, int) or not 2 <= m <= _M_MAX or m & (m - 1):
            raise ParameterError(
                "m", "a power of two in [2, 2**32] (HCMS needs the Hadamard matrix H_m, defined for powers of two)", m
            )
        check_seed(self.seed)

    # ----------------------------------------------------------------- parameters

    @cached_property
    def family(self) -> HashFamily:
        """The public hash family ``h_0 .. h_{k-1}`` into ``[m]`` (003 Alg. 5 step 1)."""
        return HashFamily(self.seed, count=self.k, range=self.m)

    @cached_property
    def keep_coin(self) -> Coin:
        """The coin for ``b = +1`` (003 Alg. 6 step 6), rounded down so ``p / (1 - p) <= e**ε``."""
        e = dexp(self.epsilon)
        return coin_at_most(e / (e + 1))

    @property
    def keep_probability(self) -> float:
        """``Pr[b = +1]`` for the implemented coin."""
        return float(self.keep_coin.probability)

    @cached_property
    def c_epsilon(self) -> float:
        """``c_ε = 1 / E[b] = 1 / (2p - 1)`` for the implemented coin (003 Alg. 7 step 1)."""
        p = self.keep_coin.probability
        return float(1 / (2 * p - 1))

    @property
    def epsilon_report(self) -> float:
        """ε of one report: exactly ``ln(p / (1 - p))`` for the implemented coin (003 Thm 4.3), at most ``epsilon``."""
        p = self.keep_coin.probability
        return math.log(p / (1 - p))

    def _hash(self, fp: int, j: int) -> int:
        # The client's single-record path evaluates h_j in pure Python (one row of the
        # family's coefficients; protocol.hashing), never through numpy.
        return self.family.evaluate_fingerprint(fp, j)

    # ---------------------------------------------------------------- client half

    def setup(self, rng: RandomSource) -> None:
        """No permanent state: HCMS privatizes each event afresh (event-level privacy)."""
        return

    def privatize(self, value: str | bytes, state: None, rng: RandomSource) -> tuple[HCMSRecord, None]:
        """One report for ``value`` (003 Alg. 6)."""
        v = _as_value_bytes(value)
        w0, w1, w2 = rng.words(3).tolist()
        # Step 1: j uniform in [k], exactly: reject words at or above the largest multiple of k.
        limit = SCALE - SCALE % self.k
        while w0 >= limit:
            w0 = int(rng.words(1)[0])
        j = w0 % self.k
        # Step 5: ℓ uniform in [m] (m is a power of two: the top bits of a word).
        ell = w1 >> (64 - (self.m.bit_length() - 1))
        # Steps 2-4: w_ℓ = (H_m e_{h_j(d)})_ℓ = (-1)**popcount(ℓ AND h_j(d)).
        parity = (ell & self._hash(fingerprint(v, seed=self.seed), j)).bit_count() & 1
        # Steps 6-7: w̃ = b w_ℓ; bit 1 <=> w̃ = +1 <=> (b = +1) == (w_ℓ = +1).
        b_plus = w2 < self.keep_coin.numerator
        return HCMSRecord(j, ell, int(b_plus) ^ parity), None

    def privatize_many(self, values: Sequence[str | bytes], rng: RandomSource) -> HCMSBatch:
        """Privatize many values at once (the simulator's path); same distribution as ``privatize``.

        Repeated values are fingerprinted once.
        """
        try:
            position: dict[str | bytes, int] = {}
            codes = np.fromiter(
                (position.setdefault(v, len(position)) for v in values), dtype=np.int64, count=len(values)
            )
            distinct = [_as_value_bytes(v) for v in position]
        except TypeError as exc:
            raise InputError(f"HCMS privatizes str or bytes values: {exc}") from exc
        fp = family_fingerprints(self.family, distinct)
        return self.privatize_fingerprints(Fingerprints(lo=fp.lo[codes], hi=fp.hi[codes]), rng)

    def privatize_fingerprints(self, fp: Fingerprints, rng: RandomSource) -> HCMSBatch:
        """Privatize values given by their fingerprints under this family (vectorised 003 Alg. 6)."""
        n = len(fp)
        j = uniform_ints(rng, self.k, n)
        ell = uniform_ints(rng, self.m, n)
        h = evaluate(self.family, fp, j)
        parity = (np.bitwise_count(ell & h) & 1).astype(np.uint8)
        b_plus = bernoulli(rng, self.keep_coin, n).astype(np.uint8)
        return HCMSBatch(j=j, ell=ell, bits=b_plus ^ parity)

    def output_distribution(self, value: str | bytes) -> dict[tuple[int, int, int], Fraction]:
        """Exact ``Pr[(j, ℓ, bit) | value]`` for every output, as the coins implement it."""
        v = _as_value_bytes(value)
        fp = fingerprint(v, seed=self.seed)
        p = self.keep_coin.probability
        cell = Fraction(1, self.k * self.m)
        dist: dict[tuple[int, int, int], Fraction] = {}
        for j in range(self.k):
            h = self._hash(fp, j)
            for ell in range(self.m):
                w_bit = 1 - ((ell & h).bit_count() & 1)  # 1 <=> w_ℓ = +1
                dist[(j, ell, w_bit)] = cell * p
                dist[(j, ell, 1 - w_bit)] = cell * (1 - p)
        return dist

    # ------------------------------------------------------------------- wire form

    def batch(self, records: Sequence[HCMSRecord]) -> HCMSBatch:
        """Records in columnar form."""
        n = len(records)
        return HCMSBatch(
            j=np.fromiter((r.j for r in records), dtype=np.int64, count=n),
            ell=np.fromiter((r.ell for r in records), dtype=np.int64, count=n),
            bits=np.fromiter((r.bit for r in records), dtype=np.uint8, count=n),
        )

    def encode_records(self, records: Sequence[HCMSRecord]) -> list[Any]:
        """The records' compact wire form: ``[j, ℓ, bit]`` per record (a few msgpack bytes each)."""
        return [[r.j, r.ell, r.bit] for r in records]

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: the largest j and ℓ and the bit."""
        return encoded_size([self.k - 1, self.m - 1, 1])

    def decode_records(self, raw: object) -> HCMSBatch:
        """Strictly decode the wire form of :meth:`encode_records`.

        Raises:
            MalformedReportError: ``bad-type``, ``bad-length`` or ``out-of-range``, naming
                ``records[i]``, ``records[i].j``, ``records[i].ell`` or ``records[i].bit``.
        """
        if not isinstance(raw, list):
            raise MalformedReportError("bad-type", "records", "expected a list of [j, ell, bit]")
        n = len(raw)
        j = np.empty(n, dtype=np.int64)
        ell = np.empty(n, dtype=np.int64)
        bits = np.empty(n, dtype=np.uint8)
        limits = (("j", self.k), ("ell", self.m), ("bit", 2))
        for i, rec in enumerate(raw):
            if not isinstance(rec, list):
                raise MalformedReportError("bad-type", f"records[{i}]", "expected a list [j, ell, bit]")
            if len(rec) != 3:
                raise MalformedReportError("bad-length", f"records[{i}]", f"expected 3 entries, got {len(rec)}")
            for (field, bound), x in zip(limits, rec, strict=True):
                if type(x) is not int:
                    raise MalformedReportError("bad-type", f"records[{i}].{field}", "expected an integer")
                if not 0 <= x < bound:
                    raise MalformedReportError("out-of-range", f"records[{i}].{field}", f"must lie in [0, {bound})")
            j[i], ell[i], bits[i] = rec
        return HCMSBatch(j=j, ell=ell, bits=bits)

    # ------------------------------------------------------------------ server half

    # --- the contract of protocol.interfaces (plain forms for the shells)

    def encode_plain(self, records: Sequence[object]) -> list[object]:
        """Typed records in wire form."""
        return list(self.encode_records([own(r, HCMSRecord, "hcms record") for r in records]))

    def empty_batch(self) -> HCMSBatch:
        """No records."""
        return self.batch([])

    def restore_aggregate(self, data: object) -> HCMSAggregate:
        """An aggregate saved with ``to_plain``."""
        return HCMSAggregate.from_plain(self, data)

    def fold(self, aggregate: Aggregate, batch: Batch) -> None:
        """Fold a batch into an aggregate of this mechanism."""
        own(aggregate, HCMSAggregate, "hcms aggregate").add(own(batch, HCMSBatch, "hcms batch"))

    def check_value(self, value: object) -> str | bytes:
        """A string (hashed as UTF-8) or bytes."""
        if not isinstance(value, str | bytes):
            raise InputError(f"takes a string; got {type(value).__name__} {value!r}")
        return value

    @property
    def fixed_categories(self) -> None:
        """A dictionary is queried (no fixed categories)."""
        return None

    def estimate_frequencies(self, aggregate: Aggregate, candidates: Sequence[str]) -> VectorEstimate:
        """The estimated count of each dictionary entry."""
        return own(aggregate, HCMSAggregate, "hcms aggregate").estimate(candidates)

    def plan(self, n: float) -> PlanFigures:
        """The SE of a count from 003 Thm 4.4's bound, with ``Σf² <= 0.1 n²`` (the most frequent value
        holds at most a tenth of the reports; the planner's default)."""
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(float(self.variance_bound(n=n, sum_sq=_PLAN_TOP_SHARE * n * n))),
            unit="count",
            figures={
                "epsilon_report": self.epsilon_report,
                "bandwidth_bits": math.log2(self.k) + math.log2(self.m) + 1,
            },
            formulas=("003 Thm 4.4: Var <= (m/(m-1))^2 (c^2 + sum f^2/(n k m)) n, sum f^2 <= 0.1 n^2",),
        )

    def new_aggregate(self) -> HCMSAggregate:
        """An empty aggregate."""
        return HCMSAggregate(self)

    def variance(self, *, n: float, count: _Real, others_sum_sq: _Real) -> _Real:
        """Exact ``Var[f̃(d)]`` over coins and hash family (003 App. B, line before the bound).

        Args:
            n: number of reports.
            count: ``f(d)``, the true count of the queried value.
            others_sum_sq: ``Σ_{d' != d} f(d')**2``.
        """
        k, m, c2 = self.k, self.m, self.c_epsilon**2
        pair = 1 / m**2 + (1 - 1 / m) / (k * m)  # E[μ**2] for a value that is not d
        var_z = n * c2 - count - (n - count) * pair + (1 - 1 / m) * others_sum_sq / (k * m)
        return (m / (m - 1)) ** 2 * var_z

    def variance_bound(self, *, n: float, sum_sq: _Real) -> _Real:
        """The upper bound of 003 Thm 4.4: ``(m/(m-1))**2 (c_ε**2 + Σ f**2 / (n k m)) n``."""
        k, m = self.k, self.m
        return (m / (m - 1)) ** 2 * (self.c_epsilon**2 * n + sum_sq / (k * m))


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
        view = self._sums.view()
        view.flags.writeable = False
        return view

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

    def to_plain(self) -> dict[str, Any]:
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

    def _transformed(self) -> tuple[npt.NDArray[np.float64], float]:
        if self._cache is None:
            self._cache = hadamard_rows(self._sums)
        return self._cache

    def transformed(self) -> npt.NDArray[np.float64]:
        """``T = s H_m`` (integer-valued float64); the sketch of 003 Alg. 7 is ``M^H = k c_ε T``."""
        table = self._transformed()[0].view()
        table.flags.writeable = False
        return table

    def sketch_matrix(self) -> npt.NDArray[np.float64]:
        """``M^H`` exactly as 003 Alg. 7 returns it (a new array; queries use the cached ``T``)."""
        mech = self.mechanism
        return self._transformed()[0] * (mech.k * mech.c_epsilon)

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
        g_hat = n + k * m * mech.c_epsilon**2 * (sum_sq - n)
        f2 = (g_hat - n * n / m) / (1 - 1 / m)
        return float(min(max(f2, 0.0), float(n) * n))

    def estimate(self, candidates: Sequence[str | bytes], *, workers: int | None = None) -> VectorEstimate:
        """Estimated counts of ``candidates`` (003 Alg. 4 on ``M^H``) with standard errors."""
        checked = [_as_value_bytes(v) for v in candidates]
        return self.estimate_fingerprints(family_fingerprints(self.mechanism.family, checked), workers=workers)

    def estimate_fingerprints(self, fp: Fingerprints, *, workers: int | None = None) -> VectorEstimate:
        """As :meth:`estimate`, for candidates already fingerprinted under the mechanism's family."""
        mech = self.mechanism
        n, m = self._n, mech.m
        size = len(fp)
        if n == 0:
            nan = np.full(size, math.nan)
            return VectorEstimate(nan, nan.copy(), 0)
        table = self._transformed()[0]
        # 003 Alg. 4: (1/k) Σ_j M^H[j, h_j(d)] = c_ε Σ_j T[j, h_j(d)]; the gather is exact.
        gathered = gather_sums(table, mech.family, fp, workers=workers)
        values = (m / (m - 1)) * (mech.c_epsilon * gathered - n / m)
        f_hat = np.clip(values, 0.0, float(n))
        others = np.maximum(self.second_moment() - f_hat**2, 0.0)
        var = mech.variance(n=n, count=f_hat, others_sum_sq=others)
        return VectorEstimate(values, np.sqrt(np.maximum(var, 0.0)), n)


_PLAN_TOP_SHARE: Final = 0.1

ENTRY: Final = MechanismEntry(
    name=HadamardCountMeanSketch.name, build=HadamardCountMeanSketch, epsilon_parameter=True, dictionary=True
)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
