"""RAPPOR: Bloom filter + permanent + instantaneous randomized response (004 §2).

Client (004 §2). A device is a permanent member of one of ``cohorts`` cohorts, drawn
uniformly at setup (004 §4). For a value ``v``:

1. *Signal.* ``B`` is a ``k``-bit Bloom filter: bit ``h_{c·h+i}(v)`` is set for
   ``i = 0 .. h-1``, where ``c`` is the device's cohort and ``h_0, h_1, ...`` the public
   :class:`~protocol.hashing.HashFamily` ``(seed, count=cohorts·h, range=k)``. The basic
   variants (004 §2.1) map category number ``i`` to bit ``i`` and nothing else (``h = 1``).
2. *Permanent randomized response.* ``B'_i = 1`` w.p. ``f/2``, ``0`` w.p. ``f/2``, ``B_i``
   w.p. ``1 - f``; i.e. ``Pr[B'_i = 1 | B_i = 1] = 1 - f/2`` and ``Pr[B'_i = 1 | B_i = 0] =
   f/2`` (004 §3.1). ``B'`` is drawn once per distinct value and memoized for the life of
   the state; the memo is keyed by BLAKE2b of the value under a per-device secret key,
   never by the value.
3. *Instantaneous randomized response.* ``S_i = 1`` w.p. ``q`` if ``B'_i = 1`` and w.p.
   ``p`` otherwise, fresh for every report. The one-time variants (004 §2.1) skip this
   step and report ``B'``.

A record is ``(cohort, S)`` with ``S`` packed into ``ceil(k/8)`` bytes (bit ``i`` is bit
``7 - i mod 8`` of byte ``i // 8``, the padding bits are zero); on the wire ``[cohort, bytes]``.

Privacy, for the implemented coins. The ``f/2`` coin is rounded *up* to a multiple of
``2**-64`` and used as ``c = Pr[B'_i = 1 | B_i = 0]``, with ``Pr[B'_i = 1 | B_i = 1] = 1 - c``
exactly; ``q`` is rounded down and ``p`` up. Then (Theorem 1) ``B'`` satisfies
``ε∞ = 2h ln((1 - c) / c)``-LDP, whatever the number of reports on a value, and
(Lemma 1, Theorem 2) one report satisfies ``ε1 = h ln(q*(1 - p*) / (p*(1 - q*)))`` with
``q* = (1 - c) q + c p`` and ``p* = c q + (1 - c) p`` (with ``c = f/2`` these are Lemma 1's
``½f(p + q) + (1 - f)q`` and ``½f(p + q) + (1 - f)p``). For the one-time variants a
report *is* ``B'``, so one report costs ``ε∞``. Both bounds are reached by two values whose
Bloom filters are disjoint sets of ``h`` bits; the exact-LDP tests check this.

Server (004 §4 and Appendix). The aggregate keeps, per cohort ``j``, the number of reports
``N_j`` and the number ``c_ij`` of reports with bit ``i`` set. With ``T_ij`` the number of
reporting devices of cohort ``j`` whose Bloom bit ``i`` is set,
``E[c_ij] = q* T_ij + p* (N_j - T_ij)``, so

    t_ij = (c_ij - p* N_j) / (q* - p*)

is unbiased for ``T_ij`` (004 §4: ``p* = p + ½fq - ½fp`` and ``q* - p* = (1 - f)(q - p)``;
for the one-time variants ``q* = 1 - f/2``, ``p* = f/2``). For fixed data ``c_ij`` is a sum
of independent Bernoullis, ``T_ij`` with probability ``q*`` and ``N_j - T_ij`` with
probability ``p*``, so

    Var[t_ij] = (T_ij q*(1 - q*) + (N_j - T_ij) p*(1 - p*)) / (q* - p*)**2,

and the standard error plugs in ``t_ij`` clipped to ``[0, N_j]``. Under ``T_ij = 0`` with
``f = 0`` this is the Appendix's ``p(1 - p)N / (q - p)**2``. For the basic variants the
count of category ``i`` is ``Σ_j t_ij`` (the Appendix's ``T̂_i = (C_i - pN)/(q - p)``
generalised to ``f > 0``), whose variance is the sum over cohorts. The Bloom-filter
decoding (004 §4: LASSO selection, least squares, p-values) regresses the vector of
``t_ij`` on :meth:`Rappor.candidate_bits`; it lives with the collector.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import cached_property
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal, Self

import numpy as np
import numpy.typing as npt

from protocol.checks import check_int, check_probability, check_seed, encoded_size
from protocol.errors import InputError, ParameterError, StateError
from protocol.hashing import HashFamily, fingerprint
from protocol.interfaces import (
    EstimateKind,
    MechanismEntry,
    MemoizedState,
    Privatization,
    ValueType,
    own,
)
from protocol.randomness import (
    SCALE,
    Coin,
    RandomSource,
    bernoulli,
    coin_at_least,
    coin_at_most,
    uniform_ints,
)
from protocol.server.contract import Aggregate, Batch, PlanFigures
from protocol.server.estimate import VectorEstimate
from protocol.server.hashing import Fingerprints, evaluate, family_fingerprints
from protocol.server.plain import array_from_plain, array_to_plain, require
from protocol.server.records import decode_indexed_bits

__all__ = [
    "ENTRY",
    "VARIANTS",
    "BitEstimates",
    "Rappor",
    "RapporAggregate",
    "RapporBatch",
    "RapporRecord",
    "RapporState",
]

VARIANTS: tuple[str, ...] = ("standard", "one-time", "basic", "basic-one-time")
"""The four configurations of 004 §2 and §2.1."""

Stage = Literal["report", "permanent"]

MAX_K = 1 << 16
"""Largest Bloom filter / category count: bounds a record's size and an aggregate's memory."""
MAX_COHORTS = 1 << 16
"""Largest number of cohorts (the aggregate holds ``cohorts x k`` counts)."""

_MEMO_KEY_BYTES = 32
_MEMO_DIGEST_BYTES = 16
_MEMO_PERSON = b"rappor-memo"
_CHUNK = 1 << 16
"""Devices per block in the batch paths, so ``block x k`` coin words stay a few tens of MB."""
_DISTRIBUTION_MAX_K = 16

# _BYTE_BITS[v, b] is bit b (most significant first) of the byte value v.
_BYTE_BITS = ((np.arange(256, dtype=np.int64)[:, None] >> (7 - np.arange(8, dtype=np.int64))[None, :]) & 1).astype(
    np.int64
)


@dataclass(frozen=True, slots=True)
class RapporRecord:
    """One report: the device's cohort and the ``k`` reported bits, packed (``ceil(k/8)`` bytes)."""

    cohort: int
    bits: bytes


@dataclass(frozen=True, eq=False)
class RapporBatch:
    """Reports in columnar form.

    Attributes:
        cohorts: ``int64`` array ``(n,)`` of cohort numbers.
        bits: ``uint8`` array ``(n, ceil(k/8))`` of packed reports (zero padding bits).
    """

    cohorts: npt.NDArray[np.int64]
    bits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.cohorts.size)


@dataclass(frozen=True)
class RapporState:
    """A device's permanent RAPPOR state for one use case.

    Attributes:
        cohort: the device's cohort, uniform in ``[0, cohorts)``, drawn once at setup.
        memo_key: the per-device secret BLAKE2b key (32 bytes) the memo is keyed with.
        memo: ``{BLAKE2b(value, key=memo_key): packed B'}``, one entry per distinct value
            ever reported; an entry, once drawn, is never redrawn (004 §2 step 2).
    """

    cohort: int
    memo_key: bytes
    memo: Mapping[bytes, bytes]

    def to_plain(self) -> dict[str, Any]:
        """Plain, msgpack-ready data (the memo holds keyed hashes and ``B'`` only, no values)."""
        return {"cohort": self.cohort, "key": self.memo_key, "memo": dict(self.memo)}

    @classmethod
    def from_plain(cls, mechanism: Rappor, data: object) -> RapporState:
        """Restore a state saved by :meth:`to_plain`, checking it against ``mechanism``.

        Raises:
            StateError: on any malformed or mismatching field.
        """
        where = "rappor state"
        cohort = require(data, "cohort", int, where=where)
        key = require(data, "key", bytes, where=where)
        memo = require(data, "memo", dict, where=where)
        if not 0 <= cohort < mechanism.cohorts:
            raise StateError(f"{where}.cohort: expected an integer in [0, {mechanism.cohorts}); got {cohort}")
        if len(key) != _MEMO_KEY_BYTES:
            raise StateError(f"{where}.key: expected {_MEMO_KEY_BYTES} bytes; got {len(key)}")
        entries: dict[bytes, bytes] = {}
        for k, v in memo.items():
            if not isinstance(k, bytes) or len(k) != _MEMO_DIGEST_BYTES:
                raise StateError(f"{where}.memo: keys are {_MEMO_DIGEST_BYTES}-byte keyed hashes")
            if not isinstance(v, bytes) or len(v) != mechanism.report_bytes:
                raise StateError(f"{where}.memo: entries are {mechanism.report_bytes}-byte packed bit vectors")
            if v[-1] & mechanism.padding_mask:
                raise StateError(f"{where}.memo: an entry has non-zero padding bits")
            entries[k] = v
        return cls(cohort=cohort, memo_key=key, memo=MappingProxyType(entries))


@dataclass(frozen=True, eq=False)
class BitEstimates:
    """Per-cohort estimates ``t_ij`` of the number of devices with Bloom bit ``i`` set (004 §4).

    Attributes:
        values: ``(cohorts, k)`` estimates ``t_ij`` (row ``j`` is cohort ``j``).
        standard_errors: ``(cohorts, k)`` plug-in standard errors.
        cohort_sizes: ``(cohorts,)`` number of reports ``N_j`` per cohort.
        n: total number of reports.
    """

    values: npt.NDArray[np.float64]
    standard_errors: npt.NDArray[np.float64]
    cohort_sizes: npt.NDArray[np.int64]
    n: int

    def flat(self) -> VectorEstimate:
        """The ``Y`` vector of 004 §4 (cohort-major: entry ``j·k + i`` is ``t_ij``) with its SEs."""
        return VectorEstimate(self.values.ravel().copy(), self.standard_errors.ravel().copy(), self.n)


@dataclass(frozen=True, kw_only=True)
class Rappor(MemoizedState):
    """RAPPOR and its one-time / basic variants (004 §2, §2.1).

    Args:
        k: Bloom filter size in bits (for the basic variants: the number of categories).
        h: hash functions per cohort (1 for the basic variants).
        cohorts: number of cohorts (``m`` in 004 §4).
        f: permanent randomized response parameter, in [0, 1].
        p: ``Pr[S_i = 1 | B'_i = 0]``, in [0, 1].
        q: ``Pr[S_i = 1 | B'_i = 1]``, in [0, 1], greater than ``p``.
        seed: the use case's public hash seed (at least 16 bytes).
        variant: ``"standard"``, ``"one-time"``, ``"basic"`` or ``"basic-one-time"``.
        categories: for the basic variants, the distinct category strings (bit ``i`` is
            category ``i``); empty for the Bloom-filter variants.
    """

    state_type: ClassVar[type[RapporState]] = RapporState
    name: ClassVar[str] = "rappor"
    server: ClassVar[str] = "protocol.server.contract:Unsplit"  # both halves in this class, for now
    privatization: ClassVar[Privatization] = Privatization.STRING
    value_type: ClassVar[ValueType] = ValueType.STRING
    value_range: ClassVar[tuple[float, float] | None] = None
    k: int
    h: int
    cohorts: int
    f: float
    p: float
    q: float
    seed: bytes
    variant: str = "standard"
    categories: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_int(self.k, "k", low=1, high=MAX_K)
        check_int(self.h, "h", low=1, high=self.k)
        check_int(self.cohorts, "cohorts", low=1, high=MAX_COHORTS)
        object.__setattr__(self, "f", check_probability(self.f, "f"))
        object.__setattr__(self, "p", check_probability(self.p, "p"))
        object.__setattr__(self, "q", check_probability(self.q, "q"))
        if self.q <= self.p:
            raise ParameterError("q", f"greater than p = {self.p!r}", self.q)
        check_seed(self.seed)
        if not isinstance(self.variant, str) or self.variant not in VARIANTS:
            raise ParameterError("variant", f"one of {', '.join(VARIANTS)}", self.variant)
        cats = self.categories
        if isinstance(cats, str | bytes) or not isinstance(cats, Iterable):
            raise ParameterError("categories", "a sequence of distinct strings", cats)
        cats = tuple(cats)
        object.__setattr__(self, "categories", cats)
        if self.basic:
            if not cats or not all(isinstance(c, str) for c in cats) or len(set(cats)) != len(cats):
                raise ParameterError("categories", "a non-empty sequence of distinct strings (basic variants)", cats)
            if self.k != len(cats):
                raise ParameterError("k", f"the number of categories ({len(cats)}) for the basic variants", self.k)
            if self.h != 1:
                raise ParameterError("h", "1 for the basic variants (one bit per category, 004 §2.1)", self.h)
        elif cats:
            raise ParameterError("categories", "empty for the Bloom-filter variants", cats)
        if self.irr_one_coin.numerator <= self.irr_zero_coin.numerator:
            # Only possible when p and q are closer than 2**-64: the coins cannot tell them apart.
            raise ParameterError("q", f"greater than p = {self.p!r} by at least 2**-64", self.q)

    # ----- derived constants -------------------------------------------------------------

    @property
    def basic(self) -> bool:
        """Whether categories map to one bit each (004 §2.1 "Basic RAPPOR")."""
        return self.variant in ("basic", "basic-one-time")

    @property
    def one_time(self) -> bool:
        """Whether the instantaneous randomized response is skipped (004 §2.1 "One-time RAPPOR")."""
        return self.variant in ("one-time", "basic-one-time")

    @property
    def report_bytes(self) -> int:
        """Bytes of a packed ``k``-bit vector."""
        return (self.k + 7) // 8

    @property
    def padding_mask(self) -> int:
        """Bits of the last byte that must be zero."""
        used = self.k % 8
        return 0 if used == 0 else (1 << (8 - used)) - 1

    @cached_property
    def family(self) -> HashFamily:
        """The public hash family: function ``c·h + i`` is cohort ``c``'s ``i``-th Bloom hash."""
        return HashFamily(self.seed, count=self.cohorts * self.h, range=self.k)

    @cached_property
    def _category_index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.categories)}

    @cached_property
    def prr_coin(self) -> Coin:
        """``c = Pr[B'_i = 1 | B_i = 0]`` (``f/2`` rounded up); ``Pr[B'_i = 1 | B_i = 1] = 1 - c``."""
        return coin_at_least(Decimal(self.f) / 2)

    @cached_property
    def irr_one_coin(self) -> Coin:
        """``Pr[S_i = 1 | B'_i = 1]`` (``q`` rounded down)."""
        return coin_at_most(Decimal(self.q))

    @cached_property
    def irr_zero_coin(self) -> Coin:
        """``Pr[S_i = 1 | B'_i = 0]`` (``p`` rounded up)."""
        return coin_at_least(Decimal(self.p))

    def coordinate_probabilities(self, stage: Stage = "report") -> tuple[Fraction, Fraction]:
        """Exact ``(Pr[bit = 1 | B_i = 1], Pr[bit = 1 | B_i = 0])`` of one coordinate.

        Args:
            stage: ``"permanent"`` for ``B'`` (004 §3.1), ``"report"`` for what is sent
                (``q*``, ``p*`` of Lemma 1, or ``B'``'s for the one-time variants).
        """
        if stage not in ("report", "permanent"):
            raise ValueError(f"stage is 'report' or 'permanent'; got {stage!r}")
        c = self.prr_coin.probability
        if stage == "permanent" or self.one_time:
            return 1 - c, c
        q, p = self.irr_one_coin.probability, self.irr_zero_coin.probability
        return (1 - c) * q + c * p, c * q + (1 - c) * p

    @staticmethod
    def _log_odds_ratio(one: Fraction, zero: Fraction) -> float:
        # ln((one (1 - zero)) / (zero (1 - one))): the worst ratio of one coordinate that is
        # set under one value and clear under the other, summed over both outcomes.
        if zero == 0 or one == 1:
            return math.inf
        return math.log(one * (1 - zero) / (zero * (1 - one)))

    @property
    def epsilon_infinity(self) -> float:
        """Theorem 1: ``2h ln((1 - f/2) / (f/2))`` for the implemented coin (inf when ``f = 0``)."""
        one, zero = self.coordinate_probabilities("permanent")
        return self.h * self._log_odds_ratio(one, zero)

    @property
    def epsilon_one(self) -> float:
        """ε of one report: Theorem 2's ``h ln(q*(1 - p*) / (p*(1 - q*)))`` (``ε∞`` for one-time variants)."""
        one, zero = self.coordinate_probabilities("report")
        return self.h * self._log_odds_ratio(one, zero)

    @property
    def epsilon_report(self) -> float:
        """ε of one report: ``ε1`` with the instantaneous step, ``ε∞`` for the one-time variants."""
        return self.epsilon_one

    # ----- client ------------------------------------------------------------------------

    def setup(self, rng: RandomSource) -> RapporState:
        """Draw the device's cohort and memo key; the memo starts empty."""
        cohort = int(uniform_ints(rng, self.cohorts, 1)[0])
        key = rng.words(_MEMO_KEY_BYTES // 8).astype("<u8").tobytes()
        return RapporState(cohort=cohort, memo_key=key, memo=MappingProxyType({}))

    def _value_bytes(self, value: object) -> bytes:
        if self.basic:
            if not isinstance(value, str) or value not in self._category_index:
                raise InputError(f"basic RAPPOR takes one of its {self.k} categories; got {value!r}")
            return value.encode("utf-8")
        if isinstance(value, str):
            return value.encode("utf-8")
        if isinstance(value, bytes):
            return value
        raise InputError(f"RAPPOR takes a str or bytes value; got {type(value).__name__}")

    def bloom_positions(self, value: str | bytes, cohort: int) -> list[int]:
        """Step 1 (004 §2): the Bloom bits of ``value`` in ``cohort`` (may repeat on collision)."""
        vb = self._value_bytes(value)
        check_int(cohort, "cohort", low=0, high=self.cohorts - 1)
        return self._positions(vb, cohort)

    def _positions(self, vb: bytes, cohort: int) -> list[int]:
        if self.basic:
            return [self._category_index[vb.decode("utf-8")]]
        x = fingerprint(vb, seed=self.seed)
        fp = Fingerprints(lo=np.array([x & 0xFFFFFFFF], dtype=np.uint64), hi=np.array([x >> 32], dtype=np.uint64))
        idx = np.arange(cohort * self.h, (cohort + 1) * self.h, dtype=np.int64)
        return [int(b) for b in evaluate(self.family, fp, idx)]

    def bloom_bits(self, value: str | bytes, cohort: int) -> npt.NDArray[np.bool_]:
        """Step 1 as a ``k``-entry boolean vector."""
        out = np.zeros(self.k, dtype=np.bool_)
        out[self.bloom_positions(value, cohort)] = True
        return out

    def _check_state(self, state: object) -> RapporState:
        if not isinstance(state, RapporState):
            raise StateError(f"rappor: expected a RapporState; got {type(state).__name__}")
        if not 0 <= state.cohort < self.cohorts or len(state.memo_key) != _MEMO_KEY_BYTES:
            raise StateError("rappor: the state does not belong to these parameters")
        return state

    @cached_property
    def _irr_thresholds(self) -> npt.NDArray[np.uint64]:
        # Entry b is the threshold for B'_i = b. A numerator of 2**64 (q = 1) does not fit
        # in uint64; it is stored as 2**64 - 1 and the missing word is added back in _irr_coins.
        return np.array(
            [self.irr_zero_coin.numerator, min(self.irr_one_coin.numerator, SCALE - 1)],
            dtype=np.uint64,
        )

    def _irr_coins(self, words: npt.NDArray[np.uint64], thresholds: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        report = words < thresholds
        if self.irr_one_coin.numerator == SCALE:
            # q = 1: every set B' bit is reported set, including for the word 2**64 - 1.
            # Only set bits carry the threshold 2**64 - 1 (p < 1 - 2**-53 as a float).
            report |= thresholds == np.uint64(SCALE - 1)
        return report

    def _irr(self, bprime: npt.NDArray[np.uint8], rng: RandomSource) -> npt.NDArray[np.bool_]:
        """Step 3: ``S_i = 1`` w.p. ``q`` where ``B'_i = 1`` and w.p. ``p`` elsewhere (``bprime`` is 0/1)."""
        words = rng.words(int(bprime.size)).reshape(bprime.shape)
        return self._irr_coins(words, self._irr_thresholds[bprime])

    def _irr_packed(self, packed: bytes, rng: RandomSource) -> bytes:
        """Step 3 on a packed ``B'``, returning the packed report (the single-report fast path).

        With one word ``w_i`` per bit, ``S_i = [w_i < p] | (B'_i & [w_i < q])``: since the
        ``p`` threshold is below the ``q`` one, this is ``[w_i < q]`` where ``B'_i = 1`` and
        ``[w_i < p]`` elsewhere, the same coins as :meth:`_irr`, on packed integers.
        """
        words = rng.words(self.k)
        below_p = int.from_bytes(np.packbits(words < self._irr_thresholds[0]).tobytes(), "big")
        if self.irr_one_coin.numerator == SCALE:
            below_q = -1  # q = 1: every word is below the threshold
        else:
            below_q = int.from_bytes(np.packbits(words < self._irr_thresholds[1]).tobytes(), "big")
        report = below_p | (below_q & int.from_bytes(packed, "big"))
        return report.to_bytes(self.report_bytes, "big")

    def privatize(self, value: str | bytes, state: RapporState, rng: RandomSource) -> tuple[RapporRecord, RapporState]:
        """Report ``value``; returns the record and the state to persist *before* sending it.

        The permanent response ``B'`` is drawn the first time a value is seen and reused
        forever after (004 §2 step 2); the returned state then holds the new memo entry.
        """
        st = self._check_state(state)
        vb = self._value_bytes(value)
        memo_id = hashlib.blake2b(vb, digest_size=_MEMO_DIGEST_BYTES, key=st.memo_key, person=_MEMO_PERSON).digest()
        packed = st.memo.get(memo_id)
        new_state = st
        if packed is None:
            bloom = np.zeros(self.k, dtype=np.bool_)
            bloom[self._positions(vb, st.cohort)] = True
            # 004 §2 step 2 as a flip: B'_i = B_i xor Bernoulli(c), so Pr[B'_i = 1 | B_i = 1]
            # = 1 - c and Pr[B'_i = 1 | B_i = 0] = c, with c = f/2 (rounded up).
            bprime = bloom ^ bernoulli(rng, self.prr_coin, self.k)
            packed = np.packbits(bprime).tobytes()
            memo = dict(st.memo)
            memo[memo_id] = packed
            new_state = RapporState(cohort=st.cohort, memo_key=st.memo_key, memo=MappingProxyType(memo))
        if self.one_time:
            return RapporRecord(st.cohort, packed), new_state
        return RapporRecord(st.cohort, self._irr_packed(packed, rng)), new_state

    def _category_indices(self, values: Sequence[str | bytes]) -> npt.NDArray[np.int64]:
        index = self._category_index
        try:
            # map() and fromiter keep the per-value work in C; a miss (None) is a TypeError.
            return np.fromiter(map(index.get, values), dtype=np.int64, count=len(values))  # type: ignore[arg-type]
        except TypeError:
            bad = next(v for v in values if not isinstance(v, str) or v not in index)
            raise InputError(f"basic RAPPOR takes one of its {self.k} categories; got {bad!r}") from None

    def _bloom_matrix(self, values: Sequence[str | bytes], cohorts: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        n = len(values)
        out = np.zeros((n, self.k), dtype=np.bool_)
        rows = np.arange(n)
        if self.basic:
            out[rows, self._category_indices(values)] = True
            return out
        # Fingerprint each distinct value once (a fleet reports few distinct values);
        # dict.fromkeys and map keep the per-value work in C.
        try:
            distinct = dict.fromkeys(values)
        except TypeError:
            raise InputError("RAPPOR takes str or bytes values") from None
        for v in distinct:
            if not isinstance(v, str | bytes):
                raise InputError(f"RAPPOR takes str or bytes values; got {type(v).__name__}")
        number = {v: i for i, v in enumerate(distinct)}
        inverse = np.fromiter(map(number.__getitem__, values), dtype=np.int64, count=n)
        fp_distinct = family_fingerprints(self.family, distinct)
        fp = Fingerprints(lo=fp_distinct.lo[inverse], hi=fp_distinct.hi[inverse])
        for i in range(self.h):
            out[rows, evaluate(self.family, fp, cohorts * self.h + i)] = True
        return out

    def privatize_many(
        self,
        values: Sequence[str | bytes],
        cohorts: npt.ArrayLike,
        rng: RandomSource,
    ) -> RapporBatch:
        """One report from each of ``len(values)`` fresh devices (the simulator's and tests' path).

        Device ``d`` is in cohort ``cohorts[d]`` and reports ``values[d]``; its ``B'`` and
        (unless one-time) its ``S`` are drawn for this call, with the same distribution as
        :meth:`privatize` on a fresh state.
        """
        coh = np.asarray(cohorts, dtype=np.int64).reshape(-1)
        n = len(values)
        if coh.size != n:
            raise InputError(f"need one cohort per value; got {coh.size} cohorts for {n} values")
        if n and (int(coh.min()) < 0 or int(coh.max()) >= self.cohorts):
            raise InputError(f"cohorts must lie in [0, {self.cohorts})")
        bits = np.empty((n, self.report_bytes), dtype=np.uint8)
        for start in range(0, n, _CHUNK):
            stop = min(n, start + _CHUNK)
            bloom = self._bloom_matrix(values[start:stop], coh[start:stop])
            bprime = bloom ^ bernoulli(rng, self.prr_coin, bloom.size).reshape(bloom.shape)
            report = bprime if self.one_time else self._irr(bprime.view(np.uint8), rng)
            bits[start:stop] = np.packbits(report, axis=1)
        return RapporBatch(cohorts=coh.copy(), bits=bits)

    def output_distribution(self, value: str | bytes, *, stage: Stage = "report") -> dict[tuple[int, bytes], Fraction]:
        """Exact ``Pr[(cohort, bits) | value]`` over all outputs, for a fresh device (``k <= 16``).

        ``stage="permanent"`` gives the distribution of ``(cohort, B')`` (Theorem 1's output).
        """
        if self.k > _DISTRIBUTION_MAX_K:
            raise ValueError(f"output_distribution enumerates 2**k outputs; k must be <= {_DISTRIBUTION_MAX_K}")
        one, zero = self.coordinate_probabilities(stage)
        everything = np.arange(1 << self.k, dtype=np.int64)[:, None]
        outputs = ((everything >> np.arange(self.k, dtype=np.int64)[None, :]) & 1).astype(np.bool_)
        dist: dict[tuple[int, bytes], Fraction] = {}
        cohort_weight = Fraction(1, self.cohorts)
        for cohort in range(self.cohorts):
            bloom = self.bloom_bits(value, cohort)
            for out in outputs:
                prob = cohort_weight
                for b, s in zip(bloom, out, strict=True):
                    p1 = one if b else zero
                    prob *= p1 if s else 1 - p1
                dist[(cohort, np.packbits(out).tobytes())] = prob
        return dist

    # ----- records and wire --------------------------------------------------------------

    def batch(self, records: Sequence[RapporRecord]) -> RapporBatch:
        """Records in columnar form."""
        n = len(records)
        coh = np.fromiter((r.cohort for r in records), dtype=np.int64, count=n)
        raw = b"".join(r.bits for r in records)
        if len(raw) != n * self.report_bytes:
            raise InputError(f"every record carries {self.report_bytes} bytes of bits")
        bits = np.frombuffer(raw, dtype=np.uint8).reshape(n, self.report_bytes).copy()
        return RapporBatch(cohorts=coh, bits=bits)

    def encode_records(self, records: Sequence[RapporRecord]) -> list[Any]:
        """The records' compact wire form: ``[[cohort, packed bits], ...]``."""
        return [[r.cohort, r.bits] for r in records]

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: the largest cohort and the packed k bits."""
        return encoded_size([self.cohorts - 1, bytes((self.k + 7) // 8)])

    def decode_records(self, raw: object) -> RapporBatch:
        """Strictly decode the wire form of :meth:`encode_records`.

        Raises:
            MalformedReportError: ``bad-type``, ``bad-length``, ``out-of-range`` or
                ``bad-padding``, naming ``records[i]``, ``records[i].cohort`` or ``records[i].bits``.
        """
        cohorts, bits = decode_indexed_bits(raw, bound=self.cohorts, width=self.k, index_name="cohort")
        return RapporBatch(cohorts=cohorts, bits=bits)

    # ----- server ------------------------------------------------------------------------

    def candidate_positions(self, candidates: Sequence[str | bytes]) -> npt.NDArray[np.int64]:
        """Sparse design matrix of 004 §4: ``(len, cohorts, h)`` Bloom bit numbers per candidate."""
        if self.basic:
            idx = self._category_indices(candidates)
            return np.broadcast_to(idx[:, None, None], (idx.size, self.cohorts, 1)).copy()
        fp = family_fingerprints(self.family, candidates)
        out = np.empty((len(fp), self.cohorts, self.h), dtype=np.int64)
        for j in range(self.family.count):
            out[:, j // self.h, j % self.h] = evaluate(self.family, fp, j)
        return out

    def candidate_bits(self, candidates: Sequence[str | bytes]) -> npt.NDArray[np.uint8]:
        """Dense design-matrix bits of 004 §4: ``(len, cohorts, k)``, 1 where a candidate sets a bit.

        Reshaped to ``(len, cohorts·k)`` and transposed, it is the ``X`` that the vector of
        :meth:`BitEstimates.flat` is regressed on.
        """
        pos = self.candidate_positions(candidates)
        out = np.zeros((pos.shape[0], self.cohorts, self.k), dtype=np.uint8)
        m_idx = np.arange(pos.shape[0])[:, None, None]
        c_idx = np.arange(self.cohorts)[None, :, None]
        out[m_idx, c_idx, pos] = 1
        return out

    # --- the contract of protocol.interfaces (plain forms for the shells)

    @property
    def kind(self) -> EstimateKind:
        """Category counts for the basic variants; candidates decoded jointly otherwise (004 §4)."""
        return EstimateKind.CATEGORIES if self.basic else EstimateKind.CANDIDATES

    def privacy_figures(self) -> dict[str, float]:
        """ε1 of a report (Thm 2), the longitudinal ε∞ of the memoized ``B'`` (Thm 1), and ``f``,
        which a device's policy bounds from below."""
        return {
            "epsilon_report": self.epsilon_report,
            "epsilon_one": self.epsilon_one,
            "epsilon_infinity": self.epsilon_infinity,
            # What one memo can reveal of a value however many reports draw on it (004 Thm 1):
            # the cost of starting a new memo when the registry changes the parameters.
            "epsilon_longitudinal": self.epsilon_infinity,
            "f": self.f,
        }

    def check_value(self, value: object) -> str:
        """A string (for the basic variants, one of the categories)."""
        if not isinstance(value, str):
            raise InputError(f"takes a string; got {value!r}")
        if self.basic and value not in self._category_index:
            raise InputError(f"takes one of its {self.k} categories; got {value!r}")
        return value

    def parse_value(self, text: str) -> str:
        """The text itself."""
        return text

    def counter_input(self, total: float) -> str:
        """Not a counter: refused."""
        raise InputError("rappor is not a counter")

    def encode_plain(self, records: Sequence[object]) -> list[object]:
        """Typed records in wire form."""
        return list(self.encode_records([own(r, RapporRecord, "rappor record") for r in records]))

    def empty_batch(self) -> RapporBatch:
        """No records."""
        return self.batch([])

    def restore_aggregate(self, data: object) -> RapporAggregate:
        """An aggregate saved with ``to_plain``."""
        return RapporAggregate.from_plain(self, data)

    def fold(self, aggregate: Aggregate, batch: Batch) -> None:
        """Fold a batch into an aggregate of this mechanism."""
        own(aggregate, RapporAggregate, "rappor aggregate").add(own(batch, RapporBatch, "rappor batch"))

    @property
    def fixed_categories(self) -> tuple[str, ...] | None:
        """The categories of the basic variants; ``None`` (candidates are decoded) otherwise."""
        return self.categories if self.basic else None

    def estimate_frequencies(self, aggregate: Aggregate, candidates: Sequence[str]) -> VectorEstimate:
        """Basic variants: the count of each category (``candidates`` are the categories, in order).

        Raises:
            ParameterError: for the Bloom-filter variants, or candidates other than the categories.
        """
        if tuple(candidates) != self.categories:
            raise ParameterError("categories", "the candidates of direct decoding (basic variants)", candidates)
        return own(aggregate, RapporAggregate, "rappor aggregate").estimate_categories()

    def plan(self, n: float) -> PlanFigures:
        """004 Appendix: a bit count has ``sd = sqrt(p*(1-p*) N)/(q* - p*)`` under H0; a Bloom-decoded
        count averages the ``h̄ = k(1 - (1 - 1/k)^h)`` distinct bits of a candidate (1 for basic)."""
        q_star, p_star = (float(x) for x in self.coordinate_probabilities("report"))
        h_bar = 1.0 if self.basic else self.k * (1 - (1 - 1 / self.k) ** self.h)
        unit_bit = math.sqrt(p_star * (1 - p_star)) / (q_star - p_star)
        return PlanFigures(
            n=n,
            standard_error=unit_bit * math.sqrt(n / h_bar),
            unit="count",
            figures={**self.privacy_figures(), "bit_sd_under_h0": unit_bit * math.sqrt(n), "h_bar": h_bar},
            formulas=(
                "004 Thm 1: eps_inf = 2h ln((1-f/2)/(f/2)); Thm 2: eps_1 = h ln(q*(1-p*)/(p*(1-q*)))",
                "004 Appendix: sd(T_hat) = sqrt(p*(1-p*) N)/(q*-p*); count SE ~ sd/sqrt(h_bar)",
            ),
        )

    def new_aggregate(self) -> RapporAggregate:
        """An empty aggregate."""
        return RapporAggregate(self)


class RapporAggregate:
    """Per-cohort bit counts ``c_ij`` and report counts ``N_j`` (004 §4); merges by addition."""

    def __init__(
        self,
        mechanism: Rappor,
        *,
        counts: npt.NDArray[np.int64] | None = None,
        sizes: npt.NDArray[np.int64] | None = None,
    ) -> None:
        self.mechanism = mechanism
        shape = (mechanism.cohorts, mechanism.k)
        self.counts = np.zeros(shape, dtype=np.int64) if counts is None else counts
        self.sizes = np.zeros(mechanism.cohorts, dtype=np.int64) if sizes is None else sizes
        if self.counts.shape != shape or self.sizes.shape != (mechanism.cohorts,):
            raise ValueError("aggregate arrays do not match the mechanism's cohorts and k")

    @property
    def n(self) -> int:
        """Number of reports folded in."""
        return int(self.sizes.sum())

    def add(self, batch: RapporBatch) -> None:
        """Fold a batch of reports (vectorised: one ``bincount`` per byte of the report)."""
        m = self.mechanism
        n = len(batch)
        if batch.bits.shape != (n, m.report_bytes):
            raise ValueError(f"batch bits must have shape ({n}, {m.report_bytes})")
        if n == 0:
            return
        coh = batch.cohorts.astype(np.intp, copy=False)
        if int(coh.min()) < 0 or int(coh.max()) >= m.cohorts:
            raise ValueError(f"batch cohorts must lie in [0, {m.cohorts})")
        # Count, per cohort and byte position, how often each byte value occurs; a
        # (256 x 8) table of the bits of each byte value then turns those histograms into
        # per-bit counts. This touches every report byte once, with no unpacked copy.
        base = coh * 256
        columns = np.ascontiguousarray(batch.bits.T)
        hist = np.empty((m.cohorts, m.report_bytes, 256), dtype=np.int64)
        for b in range(m.report_bytes):
            hist[:, b, :] = np.bincount(base + columns[b], minlength=m.cohorts * 256).reshape(m.cohorts, 256)
        counts = (hist @ _BYTE_BITS).reshape(m.cohorts, m.report_bytes * 8)[:, : m.k]
        self.counts += counts
        self.sizes += np.bincount(coh, minlength=m.cohorts)

    def merge(self, other: Self) -> Self:
        """The aggregate of both inputs' reports."""
        if other.mechanism != self.mechanism:
            raise ValueError("cannot merge aggregates of different mechanisms")
        return type(self)(self.mechanism, counts=self.counts + other.counts, sizes=self.sizes + other.sizes)

    def to_plain(self) -> dict[str, Any]:
        """Plain, msgpack-ready data."""
        return {"counts": array_to_plain(self.counts), "sizes": array_to_plain(self.sizes)}

    @classmethod
    def from_plain(cls, mechanism: Rappor, data: object) -> RapporAggregate:
        """Restore an aggregate saved by :meth:`to_plain`.

        Raises:
            StateError: on malformed data or counts that no set of reports can produce.
        """
        where = "rappor aggregate"
        counts = array_from_plain(
            require(data, "counts", dict, where=where),
            dtype="<i8",
            shape=(mechanism.cohorts, mechanism.k),
            field=f"{where}.counts",
        )
        sizes = array_from_plain(
            require(data, "sizes", dict, where=where), dtype="<i8", shape=(mechanism.cohorts,), field=f"{where}.sizes"
        )
        if (sizes < 0).any() or (counts < 0).any() or (counts > sizes[:, None]).any():
            raise StateError(f"{where}: need 0 <= counts[j, i] <= sizes[j]")
        return cls(mechanism, counts=counts, sizes=sizes)

    def _variances(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        one, zero = self.mechanism.coordinate_probabilities("report")
        q_star, p_star = float(one), float(zero)
        n_j = self.sizes.astype(np.float64)[:, None]
        # Plug-in of Var[c_ij] = T q*(1-q*) + (N - T) p*(1-p*) (Lemma 1; independent reports).
        t_clip = np.clip(t, 0.0, n_j)
        var_c = t_clip * q_star * (1 - q_star) + (n_j - t_clip) * p_star * (1 - p_star)
        return var_c / float(one - zero) ** 2

    def estimate_bits(self) -> BitEstimates:
        """``t_ij`` (004 §4) with plug-in standard errors, for every cohort and bit.

        With ``f = 1`` the reports carry no signal (``q* = p*``): values are NaN and the
        standard errors infinite.
        """
        one, zero = self.mechanism.coordinate_probabilities("report")
        n_j = self.sizes.astype(np.float64)[:, None]
        shape = self.counts.shape
        if one == zero:
            return BitEstimates(np.full(shape, np.nan), np.full(shape, np.inf), self.sizes.copy(), self.n)
        t = (self.counts - float(zero) * n_j) / float(one - zero)
        return BitEstimates(t, np.sqrt(self._variances(t)), self.sizes.copy(), self.n)

    def estimate_categories(self) -> VectorEstimate:
        """Basic variants: the number of devices in each category, ``Σ_j t_ij``, with its SE.

        Raises:
            ParameterError: for the Bloom-filter variants (decode those against candidates).
        """
        if not self.mechanism.basic:
            raise ParameterError("variant", "basic or basic-one-time for direct decoding", self.mechanism.variant)
        bits = self.estimate_bits()
        values = bits.values.sum(axis=0)
        # Cohorts are independent, so their variances add.
        ses = np.sqrt((bits.standard_errors**2).sum(axis=0))
        return VectorEstimate(values, ses, self.n)

    def estimate(self) -> VectorEstimate:
        """Category counts for the basic variants; the flattened ``t_ij`` vector otherwise.

        For the Bloom-filter variants the entry ``j·k + i`` is ``t_ij``, the ``Y`` that the
        004 §4 decoding regresses on the candidates' :meth:`Rappor.candidate_bits`.
        """
        if self.mechanism.basic:
            return self.estimate_categories()
        return self.estimate_bits().flat()


ENTRY: Final = MechanismEntry(
    name=Rappor.name,
    build=Rappor,
    epsilon_parameter=False,
    converters={"categories": lambda v: tuple(v) if isinstance(v, list) else v},
    dictionary=True,
)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
