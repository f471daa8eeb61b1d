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

Server (004 §4 and Appendix; :mod:`protocol.server.rappor`). The aggregate keeps, per cohort
``j``, the number of reports ``N_j`` and the number ``c_ij`` of reports with bit ``i`` set.
With ``T_ij`` the number of reporting devices of cohort ``j`` whose Bloom bit ``i`` is set,
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
``t_ij`` on the candidates' Bloom bits (:meth:`protocol.server.rappor.RapporServer.candidate_bits`);
it lives with the collector.

This module is the device half (pure Python): the parameters, the per-device state, the
privatizer and the record's wire form.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from functools import cached_property
from itertools import chain
from operator import lt
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal

from protocol.checks import check_int, check_probability, check_seed, encoded_size, require
from protocol.errors import InputError, ParameterError, StateError
from protocol.hashing import HashFamily, fingerprint
from protocol.interfaces import EstimateKind, MechanismEntry, MemoizedState, Privatization, ValueType
from protocol.plain import PlainDoc
from protocol.randomness import Coin, RandomSource, coin_at_least, coin_at_most, flips, random_bytes, uniform_draws

__all__ = [
    "ENTRY",
    "MAX_COHORTS",
    "MAX_K",
    "VARIANTS",
    "Rappor",
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
_DISTRIBUTION_MAX_K = 16
_DIGITS: Final = bytes.maketrans(b"\x00\x01", b"01")
"""Bytes 0/1 to the digits "0"/"1": a bit vector becomes the binary numeral ``int(_, 2)`` reads."""


@dataclass(frozen=True, slots=True)
class RapporRecord:
    """One report: the device's cohort and the ``k`` reported bits, packed (``ceil(k/8)`` bytes)."""

    cohort: int
    bits: bytes


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

    def to_plain(self) -> PlainDoc:
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
    server: ClassVar[str] = "protocol.server.rappor:RapporServer"
    record_type: ClassVar[type[RapporRecord]] = RapporRecord
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
        cohort = uniform_draws(rng, self.cohorts, 1)[0]
        key = random_bytes(rng, _MEMO_KEY_BYTES)
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
        return [self.family.evaluate_fingerprint(x, cohort * self.h + i) for i in range(self.h)]

    def bloom_bits(self, value: str | bytes, cohort: int) -> tuple[bool, ...]:
        """Step 1 as ``k`` booleans (entry ``i`` is Bloom bit ``i``)."""
        positions = set(self.bloom_positions(value, cohort))
        return tuple(i in positions for i in range(self.k))

    def _pack(self, bits: Iterable[bool]) -> bytes:
        """``k`` bits in wire order (bit ``i`` is bit ``7 - i mod 8`` of byte ``i // 8``, zero padding)."""
        numeral = bytes(bits).translate(_DIGITS).ljust(8 * self.report_bytes, b"0")
        return int(numeral, 2).to_bytes(self.report_bytes, "big")

    def _check_state(self, state: object) -> RapporState:
        if not isinstance(state, RapporState):
            raise StateError(f"rappor: expected a RapporState; got {type(state).__name__}")
        if not 0 <= state.cohort < self.cohorts or len(state.memo_key) != _MEMO_KEY_BYTES:
            raise StateError("rappor: the state does not belong to these parameters")
        return state

    def _permanent(self, vb: bytes, cohort: int, rng: RandomSource) -> bytes:
        """Step 2: ``B'``, packed; ``k`` coins of ``f/2`` (none if ``f = 0``)."""
        # 004 §2 step 2 as a flip: B'_i = B_i xor Bernoulli(c), so Pr[B'_i = 1 | B_i = 1]
        # = 1 - c and Pr[B'_i = 1 | B_i = 0] = c, with c = f/2 (rounded up).
        flipped = int.from_bytes(self._pack(flips(rng, self.prr_coin, self.k)), "big")
        top = 8 * self.report_bytes - 1
        bloom = sum(1 << (top - i) for i in set(self._positions(vb, cohort)))
        return (flipped ^ bloom).to_bytes(self.report_bytes, "big")

    @cached_property
    def _irr_byte_thresholds(self) -> tuple[tuple[int, ...], ...]:
        # Entry v: the thresholds of the eight bits of a byte v of B' (bit 7 first), q's where
        # B'_i = 1 and p's elsewhere (q = 1 is 2**64: every word is below it).
        zero, one = self.irr_zero_coin.numerator, self.irr_one_coin.numerator
        return tuple(tuple(one if v >> (7 - b) & 1 else zero for b in range(8)) for v in range(256))

    def _irr_packed(self, packed: bytes, rng: RandomSource) -> bytes:
        """Step 3 on a packed ``B'``, returning the packed report.

        One word ``w_i`` per bit: ``S_i = [w_i < q]`` where ``B'_i = 1`` and ``[w_i < p]``
        elsewhere, as :meth:`protocol.server.rappor.RapporServer.privatize_many` flips them.
        ``map`` and ``chain`` keep the per-bit work in C (``map`` stops after the ``k`` words,
        before the padding bits' thresholds). At ``k = 128`` this costs about twice numpy's two
        vectorised comparisons (``k`` comparisons in the interpreter against two array
        operations; docs/benchmarks.md, "RAPPOR's instantaneous response on a device"). A
        device sends a handful of reports a day, and without numpy it does not pay numpy's
        import (and at small ``k``, as the basic variants have, the pure path is the faster).
        """
        thresholds = chain.from_iterable(map(self._irr_byte_thresholds.__getitem__, packed))
        return self._pack(map(lt, rng.draw(self.k), thresholds))

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
            packed = self._permanent(vb, st.cohort, rng)
            memo = dict(st.memo)
            memo[memo_id] = packed
            new_state = RapporState(cohort=st.cohort, memo_key=st.memo_key, memo=MappingProxyType(memo))
        if self.one_time:
            return RapporRecord(st.cohort, packed), new_state
        return RapporRecord(st.cohort, self._irr_packed(packed, rng)), new_state

    def output_distribution(self, value: str | bytes, *, stage: Stage = "report") -> dict[tuple[int, bytes], Fraction]:
        """Exact ``Pr[(cohort, bits) | value]`` over all outputs, for a fresh device (``k <= 16``).

        ``stage="permanent"`` gives the distribution of ``(cohort, B')`` (Theorem 1's output).
        """
        if self.k > _DISTRIBUTION_MAX_K:
            raise ValueError(f"output_distribution enumerates 2**k outputs; k must be <= {_DISTRIBUTION_MAX_K}")
        one, zero = self.coordinate_probabilities(stage)
        outputs = [[bool((x >> i) & 1) for i in range(self.k)] for x in range(1 << self.k)]
        dist: dict[tuple[int, bytes], Fraction] = {}
        cohort_weight = Fraction(1, self.cohorts)
        for cohort in range(self.cohorts):
            bloom = self.bloom_bits(value, cohort)
            for out in outputs:
                prob = cohort_weight
                for b, s in zip(bloom, out, strict=True):
                    p1 = one if b else zero
                    prob *= p1 if s else 1 - p1
                dist[(cohort, self._pack(out))] = prob
        return dist

    # ----- records and wire --------------------------------------------------------------

    def encode_records(self, records: Sequence[RapporRecord]) -> list[Any]:
        """The records' compact wire form: ``[[cohort, packed bits], ...]``."""
        return [[r.cohort, r.bits] for r in records]

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: the largest cohort and the packed k bits."""
        return encoded_size([self.cohorts - 1, bytes((self.k + 7) // 8)])

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

    @property
    def fixed_categories(self) -> tuple[str, ...] | None:
        """The categories of the basic variants; ``None`` (candidates are decoded) otherwise."""
        return self.categories if self.basic else None


ENTRY: Final = MechanismEntry(
    name=Rappor.name,
    build=Rappor,
    epsilon_parameter=False,
    converters={"categories": lambda v: tuple(v) if isinstance(v, list) else v},
    dictionary=True,
)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
