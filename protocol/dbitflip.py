"""dBitFlip and dBitFlipPM: histograms of a counter over ``k`` buckets (000 §2.2, §3.4).

**Client (000 §2.2).** At setup a device draws ``d`` distinct buckets ``j_1 < … < j_d``
uniformly from ``[k]`` (exactly uniform: bounded integers by rejection, subsets by
rejection of repeats or a partial Fisher-Yates shuffle) and keeps them for good. A counter is first bucketed
(:mod:`protocol.buckets`) into ``v ∈ [k]``; the device then reports the ``d`` pairs
``(j_p, b_p)`` where ``b_p`` is 1 with probability ``p = e^{ε/2}/(e^{ε/2} + 1)`` if
``v = j_p`` and with probability ``q = 1/(e^{ε/2} + 1) = 1 - p`` otherwise.

**Permanent memoization, dBitFlipPM (000 §3.4)** (``memoize=True``, the default): at setup
the device also runs dBitFlip once for every bucket ``v ∈ [k]`` and stores the answers as
``f_d: [k] → {0, 1}^d``; afterwards it always sends ``f_d(v)`` for bucket ``v``. ``f_d`` is
drawn once and never redrawn, so repeating a bucket leaks nothing new, and since the ``k``
answers are independent draws, many buckets share each response (the protection against
the naive ``f_k`` memo of 000 §3.4). The memo is keyed by the bucket, never by the
counter. With ``memoize=False`` every report draws fresh bits (the buckets stay fixed).

**Privacy (exact, for the implemented coins).** ``p`` is the coin ``e^{ε/2}/(e^{ε/2}+1)``
rounded down to a multiple of ``2**-64`` and ``q`` is its exact complement, so one
coordinate's likelihood ratio is at most ``r = p/(1 - p) <= e^{ε/2}``. The bucket set is
independent of the value and, given the set, the bits are independent coordinates; two
values ``v != v'`` change the law of at most the two coordinates ``j_p = v`` and
``j_p' = v'``. Hence one report is ``2 ln r``-LDP (``<= ε``, reached when both values are
among the chosen buckets) for ``d >= 2``, and only ``ln r``-LDP (``<= ε/2``) for ``d = 1``,
where at most one reported coordinate can differ; :attr:`DBitFlip.epsilon_report` returns
this exact value (000 Theorem 2 states the bound ε for every ``d``; the ``d = 1`` case is
stronger than stated). With memoization a device whose bucket never changes reveals
nothing beyond its first report over any number of rounds; a device that moves between
``w`` buckets is covered by the behaviour-pattern guarantee of 000 §3.4/Theorem 4.

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

**Wire form of a record.** ``[[j_1, …, j_d], bits]``: the ``d`` distinct bucket indices and
the ``d`` bits packed into ``ceil(d/8)`` bytes, most significant bit first, in the order of
the listed buckets, with zero padding bits.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar, Final, Self

import numpy as np
import numpy.typing as npt

from protocol.buckets import Buckets, CustomBuckets, ExponentialBuckets, LinearBuckets, buckets_from_plain
from protocol.checks import check_epsilon, check_int, encoded_size, number_value, parse_number
from protocol.errors import MalformedReportError, ParameterError, StateError
from protocol.interfaces import (
    EstimateKind,
    MechanismEntry,
    MemoizedState,
    Privatization,
    ValueType,
    own,
)
from protocol.randomness import Coin, RandomSource, coin_at_most, dexp, uniform_ints
from protocol.server.contract import Aggregate, Batch, PlanFigures
from protocol.server.estimate import VectorEstimate
from protocol.server.plain import array_from_plain, array_to_plain, require

__all__ = [
    "ENTRY",
    "MAX_MEMO_BITS",
    "DBitFlip",
    "DBitFlipAggregate",
    "DBitFlipBatch",
    "DBitFlipRecord",
    "DBitFlipState",
    "DBitFlipStates",
]

MAX_MEMO_BITS = 1 << 20
"""Largest memo table ``k·d`` (bits, 128 KiB) a dBitFlipPM device keeps."""

_WORK_WORDS = 1 << 22
"""Batch paths work in chunks of about this many elements to bound memory."""

_MAX_OUTPUTS = 1 << 20
"""Largest output space :meth:`DBitFlip.output_distribution` enumerates."""


@dataclass(frozen=True, slots=True)
class DBitFlipRecord:
    """One report: the device's ``d`` buckets and one bit about each (same order)."""

    buckets: tuple[int, ...]
    bits: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class DBitFlipBatch:
    """Reports in columnar form: ``buckets`` (``int64``) and ``bits`` (``uint8`` 0/1), both ``(N, d)``."""

    buckets: npt.NDArray[np.int64]
    bits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.buckets.shape[0])


@dataclass(frozen=True, slots=True)
class DBitFlipState:
    """A device's permanent randomness.

    Attributes:
        buckets: the ``d`` buckets it reports on, strictly increasing.
        memo: with memoization, ``f_d`` packed row-major (bucket ``v``, then position ``p``:
            bit ``v·d + p``), most significant bit first, zero-padded to whole bytes;
            ``None`` without memoization.
    """

    buckets: tuple[int, ...]
    memo: bytes | None

    def answer(self, bucket: int) -> tuple[int, ...]:
        """The memoized ``f_d(bucket)``."""
        if self.memo is None:
            raise StateError("this state has no memo table (memoize=False)")
        d = len(self.buckets)
        memo = self.memo
        out = []
        for pos in range(bucket * d, bucket * d + d):
            out.append((memo[pos >> 3] >> (7 - (pos & 7))) & 1)
        return tuple(out)

    def to_plain(self) -> dict[str, Any]:
        """Plain, msgpack-ready data: ``{"buckets": [...], "memo": bytes | None}``."""
        return {"buckets": list(self.buckets), "memo": self.memo}

    @classmethod
    def from_plain(cls, mechanism: DBitFlip, data: object) -> DBitFlipState:
        """Restore a state saved by :meth:`to_plain`, checking it against ``mechanism``.

        Raises:
            StateError: on anything malformed or not matching ``mechanism``.
        """
        where = "dbitflip state"
        raw = require(data, "buckets", list, where=where)
        buckets = _checked_subset(raw, mechanism, where=f"{where}.buckets")
        if not isinstance(data, dict) or set(data) != {"buckets", "memo"}:
            raise StateError(f"{where}: expected exactly the fields 'buckets' and 'memo'")
        memo = data["memo"]
        if mechanism.memoize:
            if not isinstance(memo, bytes) or len(memo) != mechanism.memo_bytes:
                raise StateError(f"{where}.memo: expected {mechanism.memo_bytes} bytes of memoized bits")
            if memo[-1] & mechanism.memo_padding_mask:
                raise StateError(f"{where}.memo: padding bits must be zero")
        elif memo is not None:
            raise StateError(f"{where}.memo: expected None (memoize=False)")
        return cls(buckets, memo)


def _checked_subset(raw: list[Any], mechanism: DBitFlip, *, where: str) -> tuple[int, ...]:
    if len(raw) != mechanism.d:
        raise StateError(f"{where}: expected {mechanism.d} buckets, got {len(raw)}")
    for j in raw:
        if type(j) is not int or not 0 <= j < mechanism.k:
            raise StateError(f"{where}: expected integers in [0, {mechanism.k}); got {j!r}")
    if any(b <= a for a, b in itertools.pairwise(raw)):
        raise StateError(f"{where}: buckets must be strictly increasing")
    return tuple(raw)


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


@dataclass(frozen=True, kw_only=True)
class DBitFlip(MemoizedState):
    """dBitFlip (``memoize=False``) and dBitFlipPM (``memoize=True``) over a bucketed counter.

    Args:
        epsilon: the ε of 000 §2.2, in (0, 64]; each bit uses ``e^{ε/2}`` (see
            :attr:`epsilon_report` for the exact cost of one report).
        buckets: the bucketing of the counter (``k = buckets.count``).
        d: the number of buckets each device reports on, an integer in ``[1, k]``; with
            memoization also ``k·d <= 2**20`` (the memo table's size in bits).
        memoize: permanent memoization of ``f_d`` (dBitFlipPM, 000 §3.4).
    """

    state_type: ClassVar[type[DBitFlipState]] = DBitFlipState
    name: ClassVar[str] = "dbitflip"
    server: ClassVar[str] = "protocol.server.contract:Unsplit"  # both halves in this class, for now
    kind: ClassVar[EstimateKind] = EstimateKind.HISTOGRAM
    privatization: ClassVar[Privatization] = Privatization.COUNTER
    value_type: ClassVar[ValueType] = ValueType.NUMBER
    value_range: ClassVar[tuple[float, float] | None] = None
    epsilon: float
    buckets: Buckets
    d: int
    memoize: bool = True

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        if not isinstance(self.buckets, LinearBuckets | ExponentialBuckets | CustomBuckets):
            raise ParameterError("buckets", "a LinearBuckets, ExponentialBuckets or CustomBuckets", self.buckets)
        k = self.buckets.count
        check_int(self.d, "d", low=1, high=k)
        if not isinstance(self.memoize, bool):
            raise ParameterError("memoize", "True or False", self.memoize)
        if self.memoize and k * self.d > MAX_MEMO_BITS:
            raise ParameterError(
                "d", f"an integer in [1, {MAX_MEMO_BITS // k}] with memoize=True and k = {k} (k·d <= 2**20)", self.d
            )

    # -- parameters -------------------------------------------------------------------

    @property
    def k(self) -> int:
        """The number of buckets."""
        return self.buckets.count

    @cached_property
    def in_coin(self) -> Coin:
        """The coin for the coordinate of the device's own bucket: ``Pr[1] = p``."""
        e = dexp(self.epsilon / 2)
        coin = coin_at_most(e / (1 + e))
        # p < 1 for ε <= 64, so both thresholds fit in uint64 words.
        if not 0 < coin.numerator < 1 << 64:  # pragma: no cover - excluded by check_epsilon
            raise ParameterError("epsilon", "small enough that e^(ε/2)/(e^(ε/2)+1) < 1", self.epsilon)
        return coin

    @cached_property
    def out_coin(self) -> Coin:
        """The coin for every other coordinate: ``Pr[1] = q = 1 - p`` exactly."""
        return self.in_coin.complement

    @property
    def p(self) -> Fraction:
        """``Pr[bit = 1]`` on the device's own bucket, exactly as implemented."""
        return self.in_coin.probability

    @property
    def q(self) -> Fraction:
        """``Pr[bit = 1]`` on any other bucket, exactly as implemented (``1 - p``)."""
        return self.out_coin.probability

    @property
    def epsilon_report(self) -> float:
        """ε of one report, exact for the implemented coins.

        ``2 ln(p/(1-p))`` (at most ``epsilon``) when ``d >= 2``; ``ln(p/(1-p))`` (at most
        ``epsilon / 2``) when ``d = 1``, since two values then differ in at most one
        reported coordinate.
        """
        one = math.log(self.p / (1 - self.p))
        return one if self.d == 1 else 2 * one

    @property
    def memo_bytes(self) -> int:
        """Size of a packed memo table, ``ceil(k·d / 8)``."""
        return (self.k * self.d + 7) // 8

    @property
    def memo_padding_mask(self) -> int:
        """The padding bits of a memo table's last byte."""
        return (1 << (-self.k * self.d) % 8) - 1

    @property
    def bits_bytes(self) -> int:
        """Size of a record's packed bits, ``ceil(d / 8)``."""
        return (self.d + 7) // 8

    @cached_property
    def _in_threshold(self) -> np.uint64:
        return np.uint64(self.in_coin.numerator)

    @cached_property
    def _out_threshold(self) -> np.uint64:
        return np.uint64(self.out_coin.numerator)

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
        k, d = self.k, self.d
        if d == k:
            return np.tile(np.arange(k, dtype=np.int64), (n, 1))
        # Draw the smaller of the subset and its complement (equally uniform).
        m = min(d, k - d)
        out = np.empty((n, d), dtype=np.int64)
        rows_per_chunk = max(1, _WORK_WORDS // k)
        for lo in range(0, n, rows_per_chunk):
            rows = min(rows_per_chunk, n - lo)
            if _distinct_probability(k, m) >= 0.5:
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
        n, k, d = chosen.shape[0], self.k, self.d
        out = np.empty((n, self.memo_bytes), dtype=np.uint8)
        every = np.arange(k, dtype=np.int64)[None, :, None]
        rows_per_chunk = max(1, _WORK_WORDS // (k * d))
        for lo in range(0, n, rows_per_chunk):
            part = chosen[lo : lo + rows_per_chunk]
            bits = self._coin_bits(part[:, None, :] == every, rng)
            out[lo : lo + part.shape[0]] = np.packbits(bits.reshape(part.shape[0], k * d), axis=1)
        return out

    # -- client -----------------------------------------------------------------------

    def setup(self, rng: RandomSource) -> DBitFlipState:
        """Draw a device's permanent buckets and, with memoization, its ``f_d``."""
        return self.setup_many(1, rng).row(0)

    def setup_many(self, n: int, rng: RandomSource) -> DBitFlipStates:
        """Set up ``n`` devices at once (same distribution as ``n`` calls of :meth:`setup`)."""
        chosen = self._draw_subsets(n, rng)
        return DBitFlipStates(chosen, self._memo_tables(chosen, rng) if self.memoize else None)

    def _check_state(self, state: object) -> DBitFlipState:
        if not isinstance(state, DBitFlipState) or len(state.buckets) != self.d:
            raise StateError(f"dbitflip: expected a DBitFlipState with {self.d} buckets")
        if self.memoize != (state.memo is not None):
            raise StateError("dbitflip: the state's memo table does not match memoize")
        if state.memo is not None and len(state.memo) != self.memo_bytes:
            raise StateError(f"dbitflip: a memo table has {self.memo_bytes} bytes; got {len(state.memo)}")
        return state

    def privatize(self, value: float, state: DBitFlipState, rng: RandomSource) -> tuple[DBitFlipRecord, DBitFlipState]:
        """Report a counter value: ``f_d(v)`` with memoization, fresh dBitFlip bits without.

        Returns the record and the (unchanged) state.

        Raises:
            InputError: for a negative, NaN or infinite value.
            StateError: if ``state`` does not belong to this mechanism.
        """
        v = self.buckets.bucket_of(value)
        state = self._check_state(state)
        if self.memoize:
            return DBitFlipRecord(state.buckets, state.answer(v)), state
        words = rng.words(self.d).tolist()
        hi, lo = self.in_coin.numerator, self.out_coin.numerator
        bits = tuple(int(w < (hi if j == v else lo)) for j, w in zip(state.buckets, words, strict=True))
        return DBitFlipRecord(state.buckets, bits), state

    def privatize_many(
        self, values: npt.ArrayLike, rng: RandomSource, *, states: DBitFlipStates | None = None
    ) -> DBitFlipBatch:
        """Privatize many counter values at once.

        With ``states``, row ``i`` is reported by device ``i`` exactly as :meth:`privatize`
        would. Without, each value comes from a freshly set-up device; that is the same
        distribution as :meth:`setup_many` then ``privatize_many`` (a fresh device's memo
        entry for its bucket is one dBitFlip draw), without drawing the ``k - 1`` memo
        rows that would go unused.
        """
        v = self.buckets.buckets_of(values).reshape(-1)
        n = int(v.size)
        if states is None:
            chosen = self._draw_subsets(n, rng)
        else:
            if len(states) != n or states.buckets.shape != (n, self.d):
                raise StateError(f"dbitflip: need {n} states of {self.d} buckets; got {states.buckets.shape}")
            if self.memoize != (states.memo is not None):
                raise StateError("dbitflip: the states' memo tables do not match memoize")
            if states.memo is not None and states.memo.shape != (n, self.memo_bytes):
                raise StateError(f"dbitflip: memo tables have shape ({n}, {self.memo_bytes}); got {states.memo.shape}")
            chosen = states.buckets
        if states is not None and states.memo is not None:
            pos = v[:, None] * self.d + np.arange(self.d, dtype=np.int64)[None, :]
            byte = np.take_along_axis(states.memo, pos >> 3, axis=1)
            bits = (byte >> (7 - (pos & 7)).astype(np.uint8)) & np.uint8(1)
        else:
            bits = self._coin_bits(chosen == v[:, None], rng).view(np.uint8)
        return DBitFlipBatch(np.ascontiguousarray(chosen, dtype=np.int64), bits.astype(np.uint8, copy=False))

    def output_distribution(self, value: float) -> dict[tuple[tuple[int, ...], tuple[int, ...]], Fraction]:
        """Exact ``Pr[(buckets, bits) | value]`` of one report, as the coins implement it.

        The bucket set is uniform over the ``C(k, d)`` subsets; given it, the bits are
        independent. With memoization this is the law of a fresh device's answer (over its
        setup), which it then repeats.
        """
        v = self.buckets.bucket_of(value)
        subsets = math.comb(self.k, self.d)
        if subsets << self.d > _MAX_OUTPUTS:
            raise ValueError(f"output space too large to enumerate ({subsets} bucket sets × 2**{self.d} bits)")
        weight = Fraction(1, subsets)
        p, q = self.p, self.q
        out: dict[tuple[tuple[int, ...], tuple[int, ...]], Fraction] = {}
        for chosen in itertools.combinations(range(self.k), self.d):
            for bits in itertools.product((0, 1), repeat=self.d):
                prob = weight
                for j, b in zip(chosen, bits, strict=True):
                    one = p if j == v else q
                    prob *= one if b else 1 - one
                out[(chosen, bits)] = prob
        return out

    # -- wire ---------------------------------------------------------------------------

    def batch(self, records: Sequence[DBitFlipRecord]) -> DBitFlipBatch:
        """Records in columnar form."""
        n, d = len(records), self.d
        buckets = np.array([r.buckets for r in records], dtype=np.int64).reshape(n, d)
        bits = np.array([r.bits for r in records], dtype=np.uint8).reshape(n, d)
        return DBitFlipBatch(buckets, bits)

    def encode_records(self, records: Sequence[DBitFlipRecord]) -> list[Any]:
        """The compact wire form: a list of ``[[j_1, …, j_d], packed bits]``."""
        nbytes, shift = self.bits_bytes, (-self.d) % 8
        out = []
        for r in records:
            word = 0
            for b in r.bits:
                word = (word << 1) | b
            out.append([list(r.buckets), (word << shift).to_bytes(nbytes, "big")])
        return out

    def encode_batch(self, batch: DBitFlipBatch) -> list[Any]:
        """The wire form of a columnar batch (same as :meth:`encode_records` of its rows)."""
        packed = np.packbits(batch.bits, axis=1)
        return [[row, bytes(b)] for row, b in zip(batch.buckets.tolist(), packed, strict=True)]

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: d indices at the largest bucket and the bits.

        An upper bound (the indices are distinct), tight to within the width of an index.
        """
        return encoded_size([[self.k - 1] * self.d, bytes(self.bits_bytes)])

    def decode_records(self, raw: object) -> DBitFlipBatch:  # noqa: PLR0912  strict per-record decoder, one check per field
        """Strictly decode the wire form of :meth:`encode_records`.

        Raises:
            MalformedReportError: ``bad-type``, ``bad-length``, ``out-of-range``, ``duplicate``
                or ``bad-padding``, naming the field (``records[3].buckets[1]``,
                ``records[3].bits``, ...).
        """
        if not isinstance(raw, list):
            raise MalformedReportError("bad-type", "records", "expected a list of [buckets, bits]")
        k, d, nbytes = self.k, self.d, self.bits_bytes
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

    # --- the contract of protocol.interfaces (plain forms for the shells)

    def privacy_figures(self) -> dict[str, float]:
        """ε of one report; with memoization (dBitFlipPM) also what the memoized bits reveal of a
        value however many reports draw on them, ε (000 §3.4): the cost of starting a new memo
        when the registry changes the parameters. Without it every report's bits are fresh and
        the per-report charge already composes."""
        figures = {"epsilon_report": self.epsilon_report}
        if self.memoize:
            figures["epsilon_longitudinal"] = self.epsilon_report
        return figures

    def check_value(self, value: object) -> int | float:
        """One recorded increment: a finite non-negative number (bucketed at collection)."""
        return number_value(value)

    def parse_value(self, text: str) -> int | float:
        """A number typed on a command line."""
        return parse_number(text, integer=False)

    def counter_input(self, total: float) -> float:
        """The period's total as is: a total beyond the last edge falls into the last bucket."""
        return total

    def encode_plain(self, records: Sequence[object]) -> list[object]:
        """Typed records in wire form."""
        return list(self.encode_records([own(r, DBitFlipRecord, "dbitflip record") for r in records]))

    def empty_batch(self) -> DBitFlipBatch:
        """No records."""
        return self.batch([])

    def restore_aggregate(self, data: object) -> DBitFlipAggregate:
        """An aggregate saved with ``to_plain``."""
        return DBitFlipAggregate.from_plain(self, data)

    def fold(self, aggregate: Aggregate, batch: Batch) -> None:
        """Fold a batch into an aggregate of this mechanism."""
        own(aggregate, DBitFlipAggregate, "dbitflip aggregate").add(own(batch, DBitFlipBatch, "dbitflip batch"))

    @property
    def bucket_edges(self) -> tuple[float, ...]:
        """The ``k + 1`` bucket edges."""
        return tuple(float(e) for e in self.buckets.edges)

    def bucket_of(self, value: float) -> int:
        """The bucket of a recorded value."""
        return self.buckets.bucket_of(value)

    def estimate_histogram(self, aggregate: Aggregate) -> VectorEstimate:
        """The share of devices per bucket (000 eq. 3)."""
        return own(aggregate, DBitFlipAggregate, "dbitflip aggregate").estimate()

    def plan(self, n: float) -> PlanFigures:
        """Per bucket ``SE = sqrt(((k/d)(c + h) - h)/n)``, ``c = p(1-p)/(p-q)²`` (000 Thm 2's variance),
        at the share ``h = 1/k`` of a uniform histogram; the empty bucket's too."""
        k, d = self.k, self.d
        p, q = float(self.p), float(self.q)
        c = p * (1 - p) / (p - q) ** 2
        h = 1 / k
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(max(((k / d) * (c + h) - h) / n, 0.0)),
            unit="bucket share",
            figures={
                "epsilon_report": self.epsilon_report,
                "standard_error_empty_bucket": math.sqrt((k / d) * c / n),
            },
            formulas=("SE(bucket) = sqrt(((k/d)(c + h) - h)/n), c = p(1-p)/(p-q)^2, h = 1/k (000 Thm 2)",),
        )

    def new_aggregate(self) -> DBitFlipAggregate:
        """An empty aggregate."""
        return DBitFlipAggregate(self)


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

    def to_plain(self) -> dict[str, Any]:
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


def _distinct_probability(k: int, m: int) -> float:
    """Probability that ``m`` independent uniform draws from ``[k]`` are all distinct."""
    return math.prod(1 - i / k for i in range(m))


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


ENTRY: Final = MechanismEntry(
    name=DBitFlip.name,
    build=DBitFlip,
    epsilon_parameter=True,
    converters={"buckets": buckets_from_plain},
)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
