"""The server half of dBitFlip and dBitFlipPM: decode, fold, estimate, plan, and the
vectorised simulation paths (000 §2.2, §3.4; see :mod:`protocol.dbitflip` for the client, the
implemented coins ``p`` and ``q = 1 - p``, the privacy figures and the wire form).

**Estimator (000 eq. 3).** Each received bit ``b`` about bucket ``v`` gives
``Y = (b - q)/(p - q)``, which is ``(b(e^{ε/2}+1) - 1)/(e^{ε/2} - 1)`` for ideal coins and
has ``E[Y] = 1{device's bucket = v}`` for the implemented ones. The estimate of the
fraction of the ``n`` reporting devices in bucket ``v`` is

    ĥ(v) = k/(n d) · Σ_{received bits about v} Y,

exactly unbiased: device ``i`` reports on ``v`` with probability ``d/k``, independently of
its value.

**Variance of ĥ(v)** (derived here; devices independent). Write ``c = p(1-p)/(p-q)²`` (the
variance of one ``Y``, the same whether or not the device is in ``v`` because ``q = 1 - p``)
and ``h = h(v)``. For device ``i`` let ``Z_i = I_i Y_i`` with ``I_i = 1{v ∈ its buckets}``
(``Pr = d/k``) and ``x_i = 1{its bucket = v}``: ``E[Z_i] = (d/k) x_i`` and
``E[Z_i²] = (d/k)(c + x_i)``. Summing, ``Var[ĥ(v)] = (k/(nd))² Σ_i Var[Z_i]``, i.e.

    Var[ĥ(v)] = ((k/d)(c + h) - h) / n,

which combines the bit noise ``(k/d)·c/n`` with the randomness of which devices report on
``v`` (``h(k/d - 1)/n``; zero when ``d = k``). The standard error plugs in ``ĥ`` clipped to
``[0, 1]``.

**Normalised variant** (``estimate(normalised=True)``): ``h̃(v) = Σ Y / N_v`` with ``N_v`` the
number of bits received about ``v``. Given ``N_v``, the reporting devices are a uniform
sample without replacement of size ``N_v`` (every device is included independently with
the same probability), so ``h̃`` is conditionally unbiased with
``Var[h̃(v) | N_v] = c/N_v + h(1-h)/N_v · (n - N_v)/(n - 1)``. It removes the noise of
``N_v`` and is never worse; eq. (3) stays the default because it is the paper's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt

from protocol.checks import require
from protocol.dbitflip import DBitFlip, DBitFlipRecord, DBitFlipState, distinct_probability
from protocol.errors import MalformedReportError, StateError
from protocol.plain import PlainDoc
from protocol.randomness import RandomSource, uniform_ints
from protocol.server.buckets import buckets_of
from protocol.server.contract import PlainServer, PlanFigures
from protocol.server.estimate import VectorEstimate
from protocol.server.plain import array_from_plain, array_to_plain

__all__ = ["DBitFlipAggregate", "DBitFlipBatch", "DBitFlipServer", "DBitFlipStates"]

_WORK_WORDS = 1 << 22
"""Batch paths work in chunks of about this many elements to bound memory."""


@dataclass(frozen=True, eq=False)
class DBitFlipBatch:
    """Reports in columnar form: ``buckets`` (``int64``) and ``bits`` (``uint8`` 0/1), both ``(N, d)``."""

    buckets: npt.NDArray[np.int64]
    bits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.buckets.shape[0])


@dataclass(frozen=True, eq=False)
class DBitFlipStates:
    """Many devices' states in columnar form (the simulator's and the tests' path).

    Attributes:
        buckets: ``(n, d)`` ``int64``, each row strictly increasing.
        memo: ``(n, memo_bytes)`` ``uint8`` packed memo tables, or ``None`` without memoization.
    """

    buckets: npt.NDArray[np.int64]
    memo: npt.NDArray[np.uint8] | None

    def __len__(self) -> int:
        return int(self.buckets.shape[0])

    def row(self, i: int) -> DBitFlipState:
        """Device ``i``'s state as a single :class:`DBitFlipState`."""
        memo = None if self.memo is None else self.memo[i].tobytes()
        return DBitFlipState(tuple(int(j) for j in self.buckets[i]), memo)

    @classmethod
    def stack(cls, states: Sequence[DBitFlipState], mechanism: DBitFlip) -> DBitFlipStates:
        """Columnar form of single states (all made by ``mechanism``)."""
        buckets = np.array([s.buckets for s in states], dtype=np.int64).reshape(len(states), mechanism.d)
        if not mechanism.memoize:
            return cls(buckets, None)
        memo = np.frombuffer(b"".join(s.memo or b"" for s in states), dtype=np.uint8)
        return cls(buckets, memo.reshape(len(states), mechanism.memo_bytes).copy())


class DBitFlipAggregate:
    """Per-bucket sums of received bits and counts of received bits, and ``n``; merges by addition."""

    def __init__(
        self,
        mechanism: DBitFlip,
        *,
        ones: npt.NDArray[np.int64] | None = None,
        counts: npt.NDArray[np.int64] | None = None,
        n: int = 0,
    ) -> None:
        self.mechanism = mechanism
        k = mechanism.k
        self.ones = np.zeros(k, dtype=np.int64) if ones is None else ones
        self.counts = np.zeros(k, dtype=np.int64) if counts is None else counts
        self._n = n

    @property
    def n(self) -> int:
        """Number of reports (devices) folded in."""
        return self._n

    def add(self, batch: DBitFlipBatch) -> None:
        """Fold a batch of reports (vectorised: two ``bincount`` passes)."""
        k, d = self.mechanism.k, self.mechanism.d
        if batch.buckets.shape != (len(batch), d) or batch.bits.shape != batch.buckets.shape:
            raise ValueError(f"dbitflip: a batch has shape (N, {d}); got {batch.buckets.shape}")
        idx = batch.buckets.reshape(-1)
        counts = np.bincount(idx, minlength=k)
        # Float weights are exact here: every bin holds an integer below 2**53.
        ones = np.bincount(idx, weights=batch.bits.reshape(-1), minlength=k).astype(np.int64)
        if counts.size != k:
            raise ValueError(f"dbitflip: bucket index out of range [0, {k})")
        self.counts += counts
        self.ones += ones
        self._n += len(batch)

    def merge(self, other: Self) -> Self:
        """The aggregate of both inputs' reports."""
        if other.mechanism != self.mechanism:
            raise ValueError("cannot merge aggregates of different mechanisms")
        return type(self)(
            self.mechanism, ones=self.ones + other.ones, counts=self.counts + other.counts, n=self._n + other._n
        )

    def to_plain(self) -> PlainDoc:
        """Plain, msgpack-ready data."""
        return {"ones": array_to_plain(self.ones), "counts": array_to_plain(self.counts), "n": self._n}

    @classmethod
    def from_plain(cls, mechanism: DBitFlip, data: object) -> DBitFlipAggregate:
        """Restore an aggregate saved by :meth:`to_plain`.

        Raises:
            StateError: on anything malformed or inconsistent (``ones <= counts``, and the
                counts sum to ``n·d`` since every report carries ``d`` bits).
        """
        where = "dbitflip aggregate"
        k = mechanism.k
        ones = array_from_plain(
            require(data, "ones", dict, where=where), dtype="<i8", shape=(k,), field=f"{where}.ones"
        )
        counts = array_from_plain(
            require(data, "counts", dict, where=where), dtype="<i8", shape=(k,), field=f"{where}.counts"
        )
        n = require(data, "n", int, where=where)
        if n < 0:
            raise StateError(f"{where}.n: expected a non-negative count; got {n}")
        if bool((ones < 0).any()) or bool((ones > counts).any()):
            raise StateError(f"{where}: need 0 <= ones <= counts in every bucket")
        if int(counts.sum()) != n * mechanism.d:
            raise StateError(f"{where}: the counts must sum to n·d = {n * mechanism.d}; got {int(counts.sum())}")
        return cls(mechanism, ones=ones, counts=counts, n=n)

    def estimate(self, *, normalised: bool = False) -> VectorEstimate:
        """The fraction of reporting devices in each bucket, with per-bucket standard errors.

        Args:
            normalised: ``False`` (default) for 000 eq. (3); ``True`` for ``Σ Y / N_v`` (see
                the module docstring). Buckets without a received bit are NaN there.
        """
        mech, n = self.mechanism, self._n
        k, d = mech.k, mech.d
        if n == 0:
            nan = np.full(k, math.nan)
            return VectorEstimate(nan, nan.copy(), 0)
        p, q = float(mech.p), float(mech.q)
        c = p * (1 - p) / (p - q) ** 2
        ones = self.ones.astype(np.float64)
        counts = self.counts.astype(np.float64)
        y_sum = (ones - q * counts) / (p - q)
        if not normalised:
            values = (k / (n * d)) * y_sum
            h = np.clip(values, 0.0, 1.0)
            var = ((k / d) * (c + h) - h) / n
            return VectorEstimate(values, np.sqrt(var), n)
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.where(counts > 0, y_sum / counts, math.nan)
            h = np.clip(values, 0.0, 1.0)
            finite = (n - counts) / (n - 1) if n > 1 else np.zeros(k)
            var = np.where(counts > 0, (c + h * (1 - h) * finite) / counts, math.nan)
        return VectorEstimate(values, np.sqrt(var), n)

    def estimate_counts(self, *, normalised: bool = False) -> VectorEstimate:
        """The number of reporting devices in each bucket, with standard errors."""
        e = self.estimate(normalised=normalised)
        return VectorEstimate(e.values * self._n, e.standard_errors * self._n, self._n)


class DBitFlipServer(PlainServer[DBitFlip, DBitFlipBatch, DBitFlipAggregate]):
    """dBitFlip's server half."""

    batch_type: ClassVar[type[DBitFlipBatch]] = DBitFlipBatch
    aggregate_type: ClassVar[type[DBitFlipAggregate]] = DBitFlipAggregate

    def batch(self, records: Sequence[DBitFlipRecord]) -> DBitFlipBatch:
        """Typed records in columnar form."""
        n, d = len(records), self.mechanism.d
        buckets = np.array([r.buckets for r in records], dtype=np.int64).reshape(n, d)
        bits = np.array([r.bits for r in records], dtype=np.uint8).reshape(n, d)
        return DBitFlipBatch(buckets, bits)

    def encode_batch(self, batch: DBitFlipBatch) -> list[Any]:
        """The wire form of a columnar batch (the same as the device's ``encode_records`` of its rows)."""
        packed = np.packbits(batch.bits, axis=1)
        return [[row, bytes(b)] for row, b in zip(batch.buckets.tolist(), packed, strict=True)]

    def decode_records(self, raw: object) -> DBitFlipBatch:  # noqa: PLR0912  strict per-record decoder, one check per field
        """Strictly decode the wire form of the device's ``encode_records``.

        Raises:
            MalformedReportError: ``bad-type``, ``bad-length``, ``out-of-range``, ``duplicate``
                or ``bad-padding``, naming the field (``records[3].buckets[1]``,
                ``records[3].bits``, ...).
        """
        if not isinstance(raw, list):
            raise MalformedReportError("bad-type", "records", "expected a list of [buckets, bits]")
        mech = self.mechanism
        k, d, nbytes = mech.k, mech.d, mech.bits_bytes
        pad_mask = (1 << (-d) % 8) - 1
        flat: list[int] = []
        chunks: list[bytes] = []
        for i, rec in enumerate(raw):
            if type(rec) is not list:
                raise MalformedReportError("bad-type", f"records[{i}]", "expected [buckets, bits]")
            if len(rec) != 2:
                raise MalformedReportError("bad-length", f"records[{i}]", "expected [buckets, bits]")
            js, bits = rec
            if type(js) is not list:
                raise MalformedReportError("bad-type", f"records[{i}].buckets", "expected a list of bucket indices")
            if len(js) != d:
                raise MalformedReportError("bad-length", f"records[{i}].buckets", f"expected {d} bucket indices")
            for p, j in enumerate(js):
                if type(j) is not int:
                    raise MalformedReportError("bad-type", f"records[{i}].buckets[{p}]", "expected an integer")
                if not 0 <= j < k:
                    raise MalformedReportError("out-of-range", f"records[{i}].buckets[{p}]", f"a bucket is in [0, {k})")
            if d > 1 and len(set(js)) != d:
                raise MalformedReportError("duplicate", f"records[{i}].buckets", "bucket indices must be distinct")
            if type(bits) is not bytes:
                raise MalformedReportError("bad-type", f"records[{i}].bits", "expected packed bits (bytes)")
            if len(bits) != nbytes:
                raise MalformedReportError("bad-length", f"records[{i}].bits", f"expected {nbytes} bytes")
            if bits[-1] & pad_mask:
                raise MalformedReportError("bad-padding", f"records[{i}].bits", "padding bits must be zero")
            flat.extend(js)
            chunks.append(bits)
        n = len(raw)
        buckets = np.array(flat, dtype=np.int64).reshape(n, d)
        packed = np.frombuffer(b"".join(chunks), dtype=np.uint8).reshape(n, nbytes)
        return DBitFlipBatch(buckets, np.ascontiguousarray(np.unpackbits(packed, axis=1, count=d)))

    def estimate_histogram(self, aggregate: object) -> VectorEstimate:
        """The share of devices per bucket (000 eq. 3)."""
        return self.own_aggregate(aggregate).estimate()

    def plan(self, n: float) -> PlanFigures:
        """Per bucket ``SE = sqrt(((k/d)(c + h) - h)/n)``, ``c = p(1-p)/(p-q)²`` (000 Thm 2's variance),
        at the share ``h = 1/k`` of a uniform histogram; the empty bucket's too."""
        mech = self.mechanism
        k, d = mech.k, mech.d
        p, q = float(mech.p), float(mech.q)
        c = p * (1 - p) / (p - q) ** 2
        h = 1 / k
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(max(((k / d) * (c + h) - h) / n, 0.0)),
            unit="bucket share",
            figures={
                "epsilon_report": mech.epsilon_report,
                "standard_error_empty_bucket": math.sqrt((k / d) * c / n),
            },
            formulas=("SE(bucket) = sqrt(((k/d)(c + h) - h)/n), c = p(1-p)/(p-q)^2, h = 1/k (000 Thm 2)",),
        )

    # ------------------------------------------------------------------ simulation paths

    @cached_property
    def _in_threshold(self) -> np.uint64:
        return np.uint64(self.mechanism.in_coin.numerator)

    @cached_property
    def _out_threshold(self) -> np.uint64:
        return np.uint64(self.mechanism.out_coin.numerator)

    def _coin_bits(self, own: npt.NDArray[np.bool_], rng: RandomSource) -> npt.NDArray[np.bool_]:
        """One exact coin per entry: ``Pr[1] = p`` where ``own`` (the value's own bucket), ``q`` elsewhere.

        A uniform word ``w`` gives ``1`` when ``w < threshold``. Since ``p >= 1/2 >= q`` (the
        ``q`` threshold is at most the ``p`` one), ``where(own, w < T_p, w < T_q)`` equals
        ``(w < T_q) | (own & (w < T_p))``, which avoids building a threshold array.
        """
        words = rng.words(int(own.size)).reshape(own.shape)
        return (words < self._out_threshold) | (own & (words < self._in_threshold))

    def _draw_subsets(self, n: int, rng: RandomSource) -> npt.NDArray[np.int64]:
        """``n`` uniform ``d``-subsets of ``[k]``, each row sorted (000 §2.2: without replacement)."""
        k, d = self.mechanism.k, self.mechanism.d
        if d == k:
            return np.tile(np.arange(k, dtype=np.int64), (n, 1))
        # Draw the smaller of the subset and its complement (equally uniform).
        m = min(d, k - d)
        out = np.empty((n, d), dtype=np.int64)
        rows_per_chunk = max(1, _WORK_WORDS // k)
        for lo in range(0, n, rows_per_chunk):
            rows = min(rows_per_chunk, n - lo)
            if distinct_probability(k, m) >= 0.5:
                picked = _rejection_subsets(rng, k, m, rows)
            else:
                picked = _fisher_yates_subsets(rng, k, m, rows)
            if m == d:
                out[lo : lo + rows] = picked
            else:
                keep = np.ones((rows, k), dtype=np.bool_)
                keep[np.arange(rows)[:, None], picked] = False
                out[lo : lo + rows] = np.nonzero(keep)[1].reshape(rows, d)
        return out

    def _memo_tables(self, chosen: npt.NDArray[np.int64], rng: RandomSource) -> npt.NDArray[np.uint8]:
        """Packed ``f_d`` for each row of ``chosen``: dBitFlip run once for every bucket (000 §3.4)."""
        n, k, d = chosen.shape[0], self.mechanism.k, self.mechanism.d
        out = np.empty((n, self.mechanism.memo_bytes), dtype=np.uint8)
        every = np.arange(k, dtype=np.int64)[None, :, None]
        rows_per_chunk = max(1, _WORK_WORDS // (k * d))
        for lo in range(0, n, rows_per_chunk):
            part = chosen[lo : lo + rows_per_chunk]
            bits = self._coin_bits(part[:, None, :] == every, rng)
            out[lo : lo + part.shape[0]] = np.packbits(bits.reshape(part.shape[0], k * d), axis=1)
        return out

    def setup_many(self, n: int, rng: RandomSource) -> DBitFlipStates:
        """Set up ``n`` devices at once (the same distribution as ``n`` calls of the device's
        ``setup``; ``setup_many(1, rng)`` consumes the words ``setup`` does, giving the same state)."""
        chosen = self._draw_subsets(n, rng)
        return DBitFlipStates(chosen, self._memo_tables(chosen, rng) if self.mechanism.memoize else None)

    def privatize_many(
        self, values: npt.ArrayLike, rng: RandomSource, *, states: DBitFlipStates | None = None
    ) -> DBitFlipBatch:
        """Privatize many counter values at once.

        With ``states``, row ``i`` is reported by device ``i`` exactly as the device's
        ``privatize`` would (the same coins, in the same order, for each value in turn).
        Without, each value comes from a freshly set-up device; that is the same
        distribution as :meth:`setup_many` then ``privatize_many`` (a fresh device's memo
        entry for its bucket is one dBitFlip draw), without drawing the ``k - 1`` memo
        rows that would go unused.
        """
        mech = self.mechanism
        d = mech.d
        v = buckets_of(mech.buckets, values).reshape(-1)
        n = int(v.size)
        if states is None:
            chosen = self._draw_subsets(n, rng)
        else:
            if len(states) != n or states.buckets.shape != (n, d):
                raise StateError(f"dbitflip: need {n} states of {d} buckets; got {states.buckets.shape}")
            if mech.memoize != (states.memo is not None):
                raise StateError("dbitflip: the states' memo tables do not match memoize")
            if states.memo is not None and states.memo.shape != (n, mech.memo_bytes):
                raise StateError(f"dbitflip: memo tables have shape ({n}, {mech.memo_bytes}); got {states.memo.shape}")
            chosen = states.buckets
        if states is not None and states.memo is not None:
            pos = v[:, None] * d + np.arange(d, dtype=np.int64)[None, :]
            byte = np.take_along_axis(states.memo, pos >> 3, axis=1)
            bits = (byte >> (7 - (pos & 7)).astype(np.uint8)) & np.uint8(1)
        else:
            bits = self._coin_bits(chosen == v[:, None], rng).view(np.uint8)
        return DBitFlipBatch(np.ascontiguousarray(chosen, dtype=np.int64), bits.astype(np.uint8, copy=False))


def _rejection_subsets(rng: RandomSource, k: int, m: int, rows: int) -> npt.NDArray[np.int64]:
    """``rows`` uniform ``m``-subsets of ``[k]``, sorted, by drawing ``m`` independent buckets until distinct.

    Conditioned on being distinct, ``m`` independent uniform draws are a uniform ordered
    draw without replacement, so the sorted row is a uniform subset. Used when a row is
    accepted with probability at least 1/2.
    """
    out = np.sort(uniform_ints(rng, k, rows * m).reshape(rows, m), axis=1)
    if m == 1:
        return out
    todo = np.flatnonzero(np.any(out[:, 1:] == out[:, :-1], axis=1))
    while todo.size:
        draw = np.sort(uniform_ints(rng, k, todo.size * m).reshape(todo.size, m), axis=1)
        ok = np.all(draw[:, 1:] != draw[:, :-1], axis=1)
        out[todo[ok]] = draw[ok]
        todo = todo[~ok]
    return out


def _fisher_yates_subsets(rng: RandomSource, k: int, m: int, rows: int) -> npt.NDArray[np.int64]:
    """``rows`` uniform ``m``-subsets of ``[k]``, sorted, by ``m`` steps of a partial Fisher-Yates shuffle."""
    pool = np.tile(np.arange(k, dtype=np.int64), (rows, 1))
    idx = np.arange(rows)
    for i in range(m):
        j = i + uniform_ints(rng, k - i, rows)
        held = pool[idx, i].copy()
        pool[idx, i] = pool[idx, j]
        pool[idx, j] = held
    return np.sort(pool[:, :m], axis=1)
