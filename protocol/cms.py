"""Count Mean Sketch (003 §4.1, Algorithms 1-2, Theorem 4.1): the device half.

A frequency oracle over strings: each device sends one hash index and an ``m``-bit
privatized vector, and the server keeps a ``k x m`` sketch that it queries for a dictionary
of candidates (:mod:`protocol.server.cms`: 003 Alg. 3-4, Thm 4.2, Appendix A).

**Client (003 Alg. 2).** For a value ``d`` (``str`` as UTF-8, or ``bytes``): draw ``j``
uniform in ``[k]``; set ``v = -1`` everywhere and ``v[h_j(d)] = +1``; flip every coordinate
independently with probability ``1 - p`` where ``p = e**(ε/2) / (1 + e**(ε/2))`` (the keep
coin, rounded down to a multiple of ``2**-64``). The record is ``(j, ṽ)``; ``ṽ`` travels as
``ceil(m/8)`` packed bytes, bit ``ℓ`` (numpy's big-endian bit order: byte ``ℓ // 8``, mask
``0x80 >> (ℓ % 8)``) is 1 exactly when ``ṽ_ℓ = +1``, and the padding bits of the last byte
are zero. On the wire a record is ``[j, bits]``. There is no permanent state: every event
is privatized afresh (event-level privacy, as deployed in 003 §3.2.1).

The ``m`` flips are exact ``2**-64`` coins resolved one byte at a time: a coin with
threshold ``T`` shows heads iff a uniform 64-bit ``U`` is below ``T``; its top byte decides
unless it equals ``T``'s top byte, and only then (probability ``1/256``) is a fresh 56-bit
remainder compared. The distribution is exactly ``T / 2**64`` and a record needs ``m`` bytes
of randomness instead of ``8 m``. A report draws :attr:`CountMeanSketch.draw_words` words up
front: the coin bytes, one word for ``j``, then spare words for the ties; the server half's
vectorised privatizer consumes the stream in the same layout (a test compares them).

**Privacy (003 Thm 4.1).** Given ``j``, the coordinates are independent and the vectors of
two values differ in at most the two coordinates ``h_j(d)`` and ``h_j(d')``, each
contributing a ratio of at most ``p / (1 - p)``. So every likelihood ratio is at most
``(p / (1 - p))**2 <= e**ε`` for the implemented coin; ``epsilon_report`` is
``2 ln(p / (1 - p))``, which is ε up to the coin's ``2**-64`` rounding, and is reached
whenever ``h_j(d) != h_j(d')`` for some ``j`` (always, for some pair of values, when
``m >= 2``).

**The hash family.** The family is 2-independent over keyed BLAKE2b fingerprints
(:mod:`protocol.hashing`), evaluated here one value at a time in pure Python
(:class:`ScalarHash`); the server evaluates the same functions over whole dictionaries.

This module is pure Python: a device privatizes without numpy.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar, Final

from protocol.checks import check_epsilon, check_int, check_seed, encoded_size
from protocol.errors import InputError
from protocol.hashing import HashFamily, fingerprint_key
from protocol.interfaces import EstimateKind, EventLevelStrings, MechanismEntry
from protocol.randomness import (
    SCALE,
    BinaryKeepCoin,
    Coin,
    RandomSource,
    random_bytes,
    uniform_draws,
)

__all__ = [
    "ENTRY",
    "K_MAX",
    "LOW56",
    "M_MAX",
    "CMSRecord",
    "CountMeanSketch",
    "DictionarySketch",
    "ScalarHash",
    "as_value_bytes",
]

K_MAX = 1 << 24
"""Largest accepted ``k`` (the deployed 65,536 with room; the sketch has ``k m`` cells)."""
M_MAX = 1 << 20
"""Largest accepted ``m`` (a record carries ``m`` bits; deployed: 256 and 1,024)."""
LOW56 = (1 << 56) - 1
"""The low 56 bits of a coin's threshold: what a tie on its top byte is decided by."""

_DISTRIBUTION_LIMIT = 1 << 20
# A coin's outcome as the ASCII digit of the packed vector's bit (flip = "1", keep = "0"),
# or "2" for a tie with the threshold's top byte, resolved afterwards.
_FLIP, _KEEP, _TIE = 0x31, 0x30, 0x32


def as_value_bytes(value: object) -> bytes:
    """The bytes a value is hashed as: ``str`` as UTF-8, ``bytes`` as is.

    Raises:
        InputError: for any other type, or a ``str`` that is not encodable (lone surrogates).
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputError(f"a str value must be encodable as UTF-8: {exc}") from exc
    raise InputError(f"a string value is str or bytes; got {type(value).__name__}")


class ScalarHash:
    """A :class:`HashFamily` evaluated for one value at a time (the client's path).

    Fingerprints with the family's key derived once (``protocol.hashing.fingerprint``
    derives it on every call), then :meth:`HashFamily.evaluate_fingerprint`; a test pins the
    equality with :meth:`HashFamily.evaluate_value`.
    """

    def __init__(self, family: HashFamily) -> None:
        self._family = family
        self._key = fingerprint_key(family.seed)

    def fingerprint(self, data: bytes) -> int:
        """The 64-bit fingerprint of ``data`` under the family's seed."""
        return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=self._key).digest(), "little")

    def at(self, fp: int, index: int) -> int:
        """``h_index`` of the value whose fingerprint is ``fp``."""
        return self._family.evaluate_fingerprint(fp, index)

    def __call__(self, data: bytes, index: int) -> int:
        """``h_index(data)``."""
        return self._family.evaluate_fingerprint(self.fingerprint(data), index)


@dataclass(frozen=True, kw_only=True)
class DictionarySketch(BinaryKeepCoin, EventLevelStrings):
    """The parameters that CMS and HCMS share: ``k`` public hash functions into ``[m]`` built
    from the use case's seed, and a report whose bits are kept with one coin
    (:class:`~protocol.randomness.BinaryKeepCoin`); the server keeps a ``k x m`` sketch that
    it queries for a dictionary.

    Each mechanism checks its own ``k`` and ``m`` (:meth:`_check_shape`).

    Args:
        epsilon: ε per report, in (0, 64].
        k: number of hash functions (rows of the sketch).
        m: columns of the sketch.
        seed: the use case's public hash seed (at least 16 bytes).
    """

    kind: ClassVar[EstimateKind] = EstimateKind.DICTIONARY
    epsilon: float
    k: int
    m: int
    seed: bytes

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        self._check_shape()
        check_seed(self.seed)

    def _check_shape(self) -> None:
        """``ParameterError`` for a ``k`` or ``m`` the mechanism does not take."""
        raise NotImplementedError

    @cached_property
    def family(self) -> HashFamily:
        """The public hash functions ``h_0 .. h_{k-1}`` into ``[m]`` (003 Alg. 1 and 5, step 1)."""
        return HashFamily(self.seed, count=self.k, range=self.m)


@dataclass(frozen=True, slots=True)
class CMSRecord:
    """One privatized report: the hash index ``j`` and the packed ``m``-bit vector (bit 1 = +1)."""

    index: int
    bits: bytes


@dataclass(frozen=True, kw_only=True)
class CountMeanSketch(DictionarySketch):
    """Apple's private Count Mean Sketch.

    The keep coin (:class:`~protocol.randomness.BinaryKeepCoin`) keeps a coordinate at
    ``ε / 2``: two values' vectors differ at two coordinates, so ε of one report is
    ``2 ln(p / (1 - p))`` (003 Thm 4.1).

    Args:
        epsilon: ε per report, in (0, 64].
        k: number of hash functions (rows of the sketch), in ``[1, 2**24]``.
        m: length of the privatized vector (columns of the sketch), in ``[2, 2**20]``.
        seed: the use case's public hash seed (at least 16 bytes).
    """

    name: ClassVar[str] = "cms"
    server: ClassVar[str] = "protocol.server.cms:CMSServer"
    record_type: ClassVar[type[CMSRecord]] = CMSRecord
    keep_shares: ClassVar[int] = 2

    def _check_shape(self) -> None:
        check_int(self.k, "k", low=1, high=K_MAX)
        check_int(self.m, "m", low=2, high=M_MAX)

    # ------------------------------------------------------------------ constants

    @cached_property
    def flip_coin(self) -> Coin:
        """The coin that flips a coordinate: the keep coin's complement, at least ``1 / (1 + e**(ε/2))``."""
        return self.keep_coin.complement

    @property
    def record_bytes(self) -> int:
        """Bytes of one packed vector: ``ceil(m / 8)``."""
        return (self.m + 7) // 8

    @cached_property
    def scalar_hash(self) -> ScalarHash:
        """:attr:`family` evaluated for one value at a time, as the client does."""
        return ScalarHash(self.family)

    @cached_property
    def draw_words(self) -> int:
        """Uniform words one report draws up front: ``m`` coin bytes, one for ``j``, spares for coin ties."""
        return (self.m + 7) // 8 + 5 + (self.m >> 7)

    # ---------------------------------------------------------------- client half

    def setup(self, rng: RandomSource) -> None:
        """No permanent state: CMS privatizes each event afresh (event-level privacy)."""
        return

    @cached_property
    def _coin_table(self) -> bytes:
        # Random byte -> the coin's outcome (_FLIP, _KEEP, or _TIE with the threshold's top
        # byte: a fresh 56-bit remainder decides).
        high = self.flip_coin.numerator >> 56
        return bytes(_FLIP if b < high else _TIE if b == high else _KEEP for b in range(256))

    @cached_property
    def _spare_words(self) -> struct.Struct:
        # The words after the coin bytes: j's, then the spares for ties.
        return struct.Struct(f"<{self.draw_words - self.record_bytes}Q")

    def privatize(self, value: str | bytes, state: None, rng: RandomSource) -> tuple[CMSRecord, None]:
        """One report for ``value`` (003 Alg. 2)."""
        return self.privatize_bytes(as_value_bytes(value), rng), None

    def privatize_bytes(self, data: bytes, rng: RandomSource, *, drawn: bytes | None = None) -> CMSRecord:
        """One report for a value given by its bytes (003 Alg. 2); the single-event client path.

        Works on Python bytes: a report is a few microseconds of work, done with a handful of
        byte-string operations.

        Args:
            data: the value's bytes.
            rng: the device's random source (for rare extra draws, or all of them).
            drawn: :attr:`draw_words` uniform words already drawn from ``rng`` for this report,
                as :func:`protocol.randomness.random_bytes` gives them (lets a caller combine several reports'
                draws into one); drawn here when omitted.
        """
        m, k = self.m, self.k
        coin_words = self.record_bytes
        # One draw: m coin bytes, a word for j, then words that resolve ties (expected m/256).
        if drawn is None:
            drawn = random_bytes(rng, 8 * self.draw_words)
        elif len(drawn) != 8 * self.draw_words:
            raise ValueError(f"expected {self.draw_words} pre-drawn words, got {len(drawn)} bytes")
        rest = list(self._spare_words.unpack_from(drawn, 8 * coin_words))
        # Step 1: j uniform in [k] (exactly: top bits for a power of two, else rejection).
        w = rest[0]
        if k & (k - 1) == 0:
            j = w >> (65 - k.bit_length()) if k > 1 else 0
        elif w < SCALE - SCALE % k:
            j = w % k
        else:
            j = uniform_draws(rng, k, 1)[0]
        # Step 4: the flips b, each exactly Pr = flip_coin (byte first, remainder on a tie),
        # as the ASCII digits of the packed vector's bits.
        coins = bytearray(drawn[:m].translate(self._coin_table))
        low = self.flip_coin.numerator & LOW56
        tie = coins.find(_TIE)
        spare = 1
        while tie != -1:
            if spare == len(rest):
                rest += rng.draw(8)
            coins[tie] = _FLIP if rest[spare] >> 8 < low else _KEEP
            spare += 1
            tie = coins.find(_TIE, tie + 1)
        # Steps 2, 3, 5: ṽ = v * b; in bits (1 = +1) v is the one-hot of h_j(d) and * is XOR
        # (which turns the digit "0" into "1" and back).
        coins[self.scalar_hash(data, j)] ^= 1
        # Bit ℓ is the ℓ-th digit, most significant first; the padding bits are zero.
        packed = int(coins, 2) << (8 * coin_words - m)
        return CMSRecord(j, packed.to_bytes(coin_words, "big"))

    def output_distribution(self, value: str | bytes) -> dict[tuple[int, bytes], Fraction]:
        """Exact ``Pr[(j, bits) | value]`` for every output, as the coins implement it.

        Only for small sketches (``k 2**m <= 2**20``): the output space is enumerated.
        """
        if self.k << self.m > _DISTRIBUTION_LIMIT:
            raise ValueError(f"output space k * 2**m too large to enumerate (k={self.k}, m={self.m})")
        fp = self.scalar_hash.fingerprint(as_value_bytes(value))
        p = self.keep_coin.probability
        q = 1 - p
        m = self.m
        # Bit ℓ of a vector is bit (m - 1 - ℓ) of its code, so its wire bytes are the code
        # shifted over the padding, big-endian.
        pad = 8 * self.record_bytes - m
        packed = [(code << pad).to_bytes(self.record_bytes, "big") for code in range(1 << m)]
        powers_p = [p**i for i in range(m + 1)]
        powers_q = [q**i for i in range(m + 1)]
        row_prob = Fraction(1, self.k)
        dist: dict[tuple[int, bytes], Fraction] = {}
        for j in range(self.k):
            shift = m - 1 - self.scalar_hash.at(fp, j)
            for code in range(1 << m):
                # Coordinates that differ from v: the ones away from h, and h itself if it is 0.
                at_h = (code >> shift) & 1
                mismatches = code.bit_count() - at_h + (1 - at_h)
                dist[(j, packed[code])] = row_prob * powers_p[m - mismatches] * powers_q[mismatches]
        return dist

    # ------------------------------------------------------------------- wire form

    def encode_records(self, records: Sequence[CMSRecord]) -> list[Any]:
        """The records' compact wire form: ``[j, bits]`` per record (``bits`` packed bytes)."""
        return [[r.index, r.bits] for r in records]

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: the largest index and the packed vector."""
        return encoded_size([self.k - 1, bytes(self.record_bytes)])

    def check_value(self, value: object) -> str | bytes:
        """A string (hashed as UTF-8) or bytes."""
        if not isinstance(value, str | bytes):
            raise InputError(f"takes a string; got {type(value).__name__} {value!r}")
        as_value_bytes(value)
        return value

    @property
    def fixed_categories(self) -> None:
        """A dictionary is queried (no fixed categories)."""
        return None


ENTRY: Final = MechanismEntry(name=CountMeanSketch.name, build=CountMeanSketch, epsilon_parameter=True, dictionary=True)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
