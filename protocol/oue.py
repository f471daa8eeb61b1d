"""Optimized unary encoding (``oue``), the device half (Wang, Blocki, Li, Jha, USENIX Security 2017, §4.3).

A device holding category ``v`` of ``k`` sends ``k`` bits: bit ``v`` is 1 with probability
``p = 1/2``, every other bit is 1 with probability ``q = 1 / (e**ε + 1)``, all independently.
Choosing ``p = 1/2`` rather than RAPPOR's symmetric ``p = 1 - q`` is what makes it optimal
among unary encodings: the variance of a count nobody holds is ``n q (1 - q) / (p - q)**2 =
n 4 e**ε / (e**ε - 1)**2`` (Wang et al. 2017 §4.3), as low as optimal local hashing's, at the
price of a ``k``-bit report. The server half (:mod:`protocol.server.oue`) counts the reports with
each bit set; a report supports every category whose bit it set (:mod:`protocol.server.support`).

**Coins.** ``q`` is rounded *up* to a multiple of ``2**-64`` (:func:`protocol.randomness.coin_at_least`):
a larger ``q`` keeps ``(1 - q) / q`` at or below ``e**ε``. Each bit's flip is resolved from one
random byte, a tie with the threshold's top byte by a spare word's 56-bit remainder
(:class:`protocol.randomness.ByteCoins`), so a report of ``k`` bits needs ``k`` bytes of randomness.
A report draws :attr:`OptimizedUnaryEncoding.draw_words` words: the ``k`` coin bytes (whole
words), one word whose top bit is the own category's fair bit, then spares for ties. The coin
byte at ``v`` is drawn (and a tie on it resolved) like any other and then overwritten, so the
server half's vectorised privatizer reads the stream in the same layout.

**Privacy.** Two values ``v, v'`` change only bits ``v`` and ``v'``; bit ``v`` is 1 with ``1/2``
under ``v`` and ``q`` under ``v'``, bit ``v'`` the other way round. The largest ratio is
``(1/2)(1 - q) / ((1/2) q) = (1 - q) / q <= e**ε`` for the implemented coin, reached by any
output with bit ``v`` set and bit ``v'`` clear.

The record is the packed ``k``-bit vector (bit ``i`` in byte ``i // 8`` under mask
``0x80 >> (i % 8)``, padding bits zero, as numpy's ``packbits`` writes it). No permanent state.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar, Final

from protocol.categories import FixedCategories, convert_categories
from protocol.checks import encoded_size
from protocol.interfaces import MechanismEntry
from protocol.randomness import (
    BYTE_FLIP,
    BYTE_KEEP,
    ByteCoins,
    Coin,
    RandomSource,
    coin_at_least,
    dexp,
    log_ratio,
    random_bytes,
)

__all__ = ["ENTRY", "OptimizedUnaryEncoding"]

_OUTPUT_LIMIT: Final = 1 << 16
"""Largest output space :meth:`OptimizedUnaryEncoding.output_distribution` enumerates (``k <= 16``)."""


@dataclass(frozen=True, kw_only=True)
class OptimizedUnaryEncoding(FixedCategories):
    """Optimized unary encoding over fixed categories; a record is the packed ``k``-bit vector.

    Args:
        epsilon, categories: as :class:`~protocol.categories.FixedCategories` (checked there).
    """

    name: ClassVar[str] = "oue"
    record_type: ClassVar[type[bytes]] = bytes
    server: ClassVar[str] = "protocol.server.oue:OUEServer"

    @cached_property
    def other_coin(self) -> Coin:
        """A bit other than the own category's is 1: ``1 / (e**ε + 1)``, rounded up."""
        return coin_at_least(1 / (dexp(self.epsilon) + 1))

    @cached_property
    def byte_coins(self) -> ByteCoins:
        """:attr:`other_coin` flipped a byte at a time."""
        return ByteCoins(self.other_coin)

    @property
    def support_probabilities(self) -> tuple[float, float]:
        """``(p*, q*) = (1/2, q)``: a report sets its own category's bit with ``1/2``, another's with ``q``."""
        return 0.5, float(self.other_coin.probability)

    @cached_property
    def epsilon_report(self) -> float:
        """``ln((1 - q) / q)`` for the implemented coin (at most ε)."""
        q = self.other_coin.probability
        return log_ratio((1 - q) / q)

    @property
    def record_bytes(self) -> int:
        """Bytes of one packed vector: ``ceil(k / 8)``."""
        return (self.k + 7) // 8

    @property
    def coin_words(self) -> int:
        """Words holding a report's ``k`` coin bytes."""
        return (self.k + 7) // 8

    @cached_property
    def draw_words(self) -> int:
        """Words a report draws up front: the coin bytes, the own bit's word, and spares for ties
        (``4 + k / 128``: twice the ``k / 256`` ties expected, and some)."""
        return self.coin_words + 1 + 4 + (self.k >> 7)

    def privatize(self, value: str, state: None, rng: RandomSource) -> tuple[bytes, None]:
        """One report for category ``value`` (Wang et al. 2017 §4.3)."""
        own = self.index_of(value)
        drawn = random_bytes(rng, 8 * self.draw_words)
        rest = list(struct.unpack_from(f"<{self.draw_words - self.coin_words}Q", drawn, 8 * self.coin_words))
        digits = self.byte_coins.digits(drawn[: self.k], rest[1:], rng)
        digits[own] = BYTE_FLIP if rest[0] >> 63 else BYTE_KEEP
        # Bit i is the i-th digit, most significant first; the padding bits are zero.
        packed = int(digits, 2) << (8 * self.record_bytes - self.k)
        return packed.to_bytes(self.record_bytes, "big"), None

    def output_distribution(self, value: str) -> dict[bytes, Fraction]:
        """Exact ``Pr[vector | value]`` for every vector, as the coins implement it (``k <= 16``)."""
        if 1 << self.k > _OUTPUT_LIMIT:
            raise ValueError(f"output space 2**k too large to enumerate (k={self.k})")
        own = self.index_of(value)
        q = self.other_coin.probability
        pad = 8 * self.record_bytes - self.k
        dist: dict[bytes, Fraction] = {}
        for code in range(1 << self.k):
            # Bit i of the vector is bit (k - 1 - i) of the code.
            ones = code.bit_count() - ((code >> (self.k - 1 - own)) & 1)
            prob = Fraction(1, 2) * q**ones * (1 - q) ** (self.k - 1 - ones)
            dist[(code << pad).to_bytes(self.record_bytes, "big")] = prob
        return dist

    def encode_records(self, records: Sequence[bytes]) -> list[Any]:
        """Records are their wire form already (packed vectors)."""
        return list(records)

    @property
    def max_record_bytes(self) -> int:
        """One packed vector, in msgpack."""
        return encoded_size(bytes(self.record_bytes))


ENTRY: Final = MechanismEntry(
    name=OptimizedUnaryEncoding.name,
    build=OptimizedUnaryEncoding,
    epsilon_parameter=True,
    converters={"categories": convert_categories},
)
"""This module's entry in the registry's table (:data:`protocol.registry.BUILTIN_MECHANISMS`)."""
