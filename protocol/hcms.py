"""Hadamard Count Mean Sketch (003 §4.2, Algorithms 5-6, Theorem 4.3): the device half.

A frequency oracle over strings where each device sends one privatized bit plus two
indices, and the server keeps a ``k x m`` sketch (:mod:`protocol.server.hcms`: 003 Alg. 7
and Alg. 4, Thm 4.4, Appendix B).

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

The hash family is 2-independent (``protocol.hashing``) over keyed-BLAKE2b fingerprints,
evaluated here one value at a time in pure Python. This module is pure Python: a device
privatizes without numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Final

from protocol.checks import check_int, encoded_size
from protocol.cms import DictionarySketch
from protocol.errors import InputError, ParameterError
from protocol.hashing import fingerprint
from protocol.interfaces import MechanismEntry
from protocol.randomness import SCALE, RandomSource

__all__ = ["ENTRY", "HCMSRecord", "HadamardCountMeanSketch", "hashed_value"]

_M_MAX = 1 << 32


@dataclass(frozen=True, slots=True)
class HCMSRecord:
    """One privatized report: hash index ``j``, Hadamard coordinate ``ell`` and the bit (1 means ``w̃ = +1``)."""

    j: int
    ell: int
    bit: int


def hashed_value(value: object) -> str | bytes:
    """A value as HCMS hashes it: a ``str`` (as UTF-8) or ``bytes``; ``InputError`` for anything else."""
    if isinstance(value, str | bytes):
        return value
    raise InputError(f"HCMS privatizes str or bytes values; got {type(value).__name__}")


@dataclass(frozen=True, kw_only=True)
class HadamardCountMeanSketch(DictionarySketch):
    """Apple's Hadamard Count Mean Sketch (003 §4.2): one privatized bit per event.

    The keep coin (:class:`~protocol.randomness.BinaryKeepCoin`) is the coin for ``b = +1``
    (003 Alg. 6 step 6); ε of one report is 003 Thm 4.3's ``ln(p / (1 - p))``.

    Args:
        epsilon: ε per report, in (0, 64].
        k: number of hash functions (rows of the sketch), at least 1.
        m: Hadamard dimension (columns of the sketch), a power of two in ``[2, 2**32]``.
        seed: the use case's public hash seed (at least 16 bytes).
    """

    name: ClassVar[str] = "hcms"
    server: ClassVar[str] = "protocol.server.hcms:HCMSServer"
    record_type: ClassVar[type[HCMSRecord]] = HCMSRecord

    def _check_shape(self) -> None:
        check_int(self.k, "k", low=1)
        m = self.m
        if isinstance(m, bool) or not isinstance(m, int) or not 2 <= m <= _M_MAX or m & (m - 1):
            raise ParameterError(
                "m", "a power of two in [2, 2**32] (HCMS needs the Hadamard matrix H_m, defined for powers of two)", m
            )

    # ----------------------------------------------------------------- parameters

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
        v = hashed_value(value)
        w0, w1, w2 = rng.draw(3)
        # Step 1: j uniform in [k], exactly: reject words at or above the largest multiple of k.
        limit = SCALE - SCALE % self.k
        while w0 >= limit:
            w0 = rng.draw(1)[0]
        j = w0 % self.k
        # Step 5: ℓ uniform in [m] (m is a power of two: the top bits of a word).
        ell = w1 >> (64 - (self.m.bit_length() - 1))
        # Steps 2-4: w_ℓ = (H_m e_{h_j(d)})_ℓ = (-1)**popcount(ℓ AND h_j(d)).
        parity = (ell & self._hash(fingerprint(v, seed=self.seed), j)).bit_count() & 1
        # Steps 6-7: w̃ = b w_ℓ; bit 1 <=> w̃ = +1 <=> (b = +1) == (w_ℓ = +1).
        b_plus = w2 < self.keep_coin.numerator
        return HCMSRecord(j, ell, int(b_plus) ^ parity), None

    def output_distribution(self, value: str | bytes) -> dict[tuple[int, int, int], Fraction]:
        """Exact ``Pr[(j, ℓ, bit) | value]`` for every output, as the coins implement it."""
        v = hashed_value(value)
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

    def encode_records(self, records: Sequence[HCMSRecord]) -> list[Any]:
        """The records' compact wire form: ``[j, ℓ, bit]`` per record (a few msgpack bytes each)."""
        return [[r.j, r.ell, r.bit] for r in records]

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: the largest j and ℓ and the bit."""
        return encoded_size([self.k - 1, self.m - 1, 1])

    def check_value(self, value: object) -> str | bytes:
        """A string (hashed as UTF-8) or bytes."""
        if not isinstance(value, str | bytes):
            raise InputError(f"takes a string; got {type(value).__name__} {value!r}")
        return value

    @property
    def fixed_categories(self) -> None:
        """A dictionary is queried (no fixed categories)."""
        return None


ENTRY: Final = MechanismEntry(
    name=HadamardCountMeanSketch.name, build=HadamardCountMeanSketch, epsilon_parameter=True, dictionary=True
)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
