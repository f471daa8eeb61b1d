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

**Wire form of a record.** ``[[j_1, …, j_d], bits]``: the ``d`` distinct bucket indices and
the ``d`` bits packed into ``ceil(d/8)`` bytes, most significant bit first, in the order of
the listed buckets, with zero padding bits.

The estimator (000 eq. 3) and its variance are the server half's (:mod:`protocol.server.dbitflip`).

This module is the device half (pure Python): the parameters and their coins, the privacy
figures, setting up a device's buckets and memo, the privatizer and the record's wire form.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar, Final

from protocol.buckets import Buckets, CustomBuckets, ExponentialBuckets, LinearBuckets, buckets_from_plain
from protocol.checks import check_epsilon, check_int, encoded_size, number_value, parse_number, require
from protocol.errors import ParameterError, StateError
from protocol.interfaces import EstimateKind, MechanismEntry, MemoizedState, Privatization, ValueType
from protocol.plain import PlainDoc
from protocol.randomness import Coin, RandomSource, coin_at_most, dexp, sample_without_replacement, uniform_draws

__all__ = [
    "ENTRY",
    "MAX_MEMO_BITS",
    "DBitFlip",
    "DBitFlipRecord",
    "DBitFlipState",
]

MAX_MEMO_BITS = 1 << 20
"""Largest memo table ``k·d`` (bits, 128 KiB) a dBitFlipPM device keeps."""

_MAX_OUTPUTS = 1 << 20
"""Largest output space :meth:`DBitFlip.output_distribution` enumerates."""


@dataclass(frozen=True, slots=True)
class DBitFlipRecord:
    """One report: the device's ``d`` buckets and one bit about each (same order)."""

    buckets: tuple[int, ...]
    bits: tuple[int, ...]


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

    def to_plain(self) -> PlainDoc:
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
    record_type: ClassVar[type[DBitFlipRecord]] = DBitFlipRecord
    name: ClassVar[str] = "dbitflip"
    server: ClassVar[str] = "protocol.server.dbitflip:DBitFlipServer"
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

    # -- client -----------------------------------------------------------------------

    def setup(self, rng: RandomSource) -> DBitFlipState:
        """Draw a device's permanent buckets and, with memoization, its ``f_d``.

        The words are consumed in the order of the server half's ``setup_many`` for one
        device, so a seeded device's state is the same on either path.
        """
        chosen = self._draw_subset(rng)
        return DBitFlipState(chosen, self._memo_table(chosen, rng) if self.memoize else None)

    def _draw_subset(self, rng: RandomSource) -> tuple[int, ...]:
        """``d`` uniform distinct buckets of ``[k]``, increasing (000 §2.2: without replacement)."""
        k, d = self.k, self.d
        if d == k:
            return tuple(range(k))
        # Draw the smaller of the subset and its complement (equally uniform).
        m = min(d, k - d)
        if distinct_probability(k, m) >= 0.5:
            # m independent uniform buckets until they are distinct: conditioned on being
            # distinct they are a uniform draw without replacement.
            picked = sorted(uniform_draws(rng, k, m))
            while any(a == b for a, b in itertools.pairwise(picked)):
                picked = sorted(uniform_draws(rng, k, m))
        else:
            picked = sorted(sample_without_replacement(rng, k, m))
        if m == d:
            return tuple(picked)
        left_out = set(picked)
        return tuple(j for j in range(k) if j not in left_out)

    def _memo_table(self, chosen: tuple[int, ...], rng: RandomSource) -> bytes:
        """Packed ``f_d``: dBitFlip run once for every bucket (000 §3.4), bit ``v·d + p`` most
        significant first, zero-padded; one word per bit, bucket by bucket."""
        d = self.d
        # Bit v·d + p is 1 with probability p where bucket v is the p-th chosen one, q elsewhere.
        thresholds = [self.out_coin.numerator] * (self.k * d)
        for p, v in enumerate(chosen):
            thresholds[v * d + p] = self.in_coin.numerator
        bits = "".join("1" if w < t else "0" for w, t in zip(rng.draw(len(thresholds)), thresholds, strict=True))
        padded = bits + "0" * (8 * self.memo_bytes - len(bits))
        return int(padded, 2).to_bytes(self.memo_bytes, "big")

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
        words = rng.draw(self.d)
        hi, lo = self.in_coin.numerator, self.out_coin.numerator
        bits = tuple(int(w < (hi if j == v else lo)) for j, w in zip(state.buckets, words, strict=True))
        return DBitFlipRecord(state.buckets, bits), state

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

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: d indices at the largest bucket and the bits.

        An upper bound (the indices are distinct), tight to within the width of an index.
        """
        return encoded_size([[self.k - 1] * self.d, bytes(self.bits_bytes)])

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

    @property
    def bucket_edges(self) -> tuple[float, ...]:
        """The ``k + 1`` bucket edges."""
        return tuple(float(e) for e in self.buckets.edges)

    def bucket_of(self, value: float) -> int:
        """The bucket of a recorded value."""
        return self.buckets.bucket_of(value)


def distinct_probability(k: int, m: int) -> float:
    """Probability that ``m`` independent uniform draws from ``[k]`` are all distinct."""
    return math.prod(1 - i / k for i in range(m))


ENTRY: Final = MechanismEntry(
    name=DBitFlip.name,
    build=DBitFlip,
    epsilon_parameter=True,
    converters={"buckets": buckets_from_plain},
)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
