"""k-ary randomized response (``grr``), the device half: Warner's randomized response over ``k`` categories.

Also called direct encoding (Wang, Blocki, Li, Jha, USENIX Security 2017, §4.1) and the
k-randomized response of Kairouz, Bonawitz and Ramage (ICML 2016). A device holding category
``v`` reports ``v`` with probability ``p = e**ε / (e**ε + k - 1)`` and each other category with
``q = (1 - p) / (k - 1)``. The server half (:mod:`protocol.server.grr`) counts the reports of
each category ``C_v`` and estimates ``ĉ_v = (C_v - n q) / (p - q)``, with
``Var = (n q (1 - q) + f_v (p (1 - p) - q (1 - q))) / (p - q)**2``
(:mod:`protocol.server.support`). It is the best of the oracles when ``k < 3 e**ε + 2``
(Wang et al. 2017 §4.4); the planner compares it with the others (``ldp-collector plan``).

**Coins.** A report draws two uniform 64-bit words: the first decides whether ``v`` is kept
(the keep coin, ``p`` rounded down to a multiple of ``2**-64``), the second, taken modulo
``k - 1`` with rejection (:func:`protocol.randomness.uniform_word`), names the other category
reported otherwise (the ``i``-th category after skipping ``v``). Both words are drawn whatever
the coin shows, so the server half's vectorised privatizer reads the same stream.

**Privacy.** An output ``o`` has probability ``p`` under ``v = o`` and ``q`` under any other
value, so every likelihood ratio is at most ``p / q = p (k - 1) / (1 - p) <= e**ε`` for the
implemented coin; ``epsilon_report`` is that ratio's logarithm, reached for every pair of
values (a test enumerates the outputs).

A record is the reported category's index; no permanent state (event-level privacy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Final

from protocol.categories import FixedCategories, convert_categories
from protocol.checks import encoded_size
from protocol.interfaces import MechanismEntry
from protocol.randomness import KaryKeepCoin, RandomSource, uniform_word

__all__ = ["ENTRY", "GeneralizedRandomizedResponse"]

DRAW_WORDS: Final = 2
"""Uniform words a report draws: the keep coin's and the other category's."""


@dataclass(frozen=True, kw_only=True)
class GeneralizedRandomizedResponse(KaryKeepCoin, FixedCategories):
    """k-ary randomized response over fixed categories; a record is the reported category's index.

    Args:
        epsilon, categories: as :class:`~protocol.categories.FixedCategories` (checked there).
    """

    name: ClassVar[str] = "grr"
    record_type: ClassVar[type[int]] = int
    server: ClassVar[str] = "protocol.server.grr:GRRServer"

    @property
    def outcomes(self) -> int:
        """A report is one of the ``k`` categories."""
        return self.k

    @property
    def support_probabilities(self) -> tuple[float, float]:
        """``(p*, q*)``: a report supports its own category with ``p*`` and any other with ``q*``."""
        return float(self.p_exact), float(self.q_exact)

    def privatize(self, value: str, state: None, rng: RandomSource) -> tuple[int, None]:
        """The reported category's index: the own one with probability ``p``, else another, uniformly."""
        own = self.index_of(value)
        keep_word, other_word = rng.draw(DRAW_WORDS)
        other = uniform_word(rng, other_word, self.k - 1)
        if keep_word < self.keep_coin.numerator:
            return own, None
        return other + (other >= own), None

    def output_distribution(self, value: str) -> dict[int, Fraction]:
        """Exact ``Pr[index | value]`` for every index, as the coins implement it."""
        own = self.index_of(value)
        p, q = self.p_exact, self.q_exact
        return {i: p if i == own else q for i in range(self.k)}

    def encode_records(self, records: Sequence[int]) -> list[Any]:
        """Records are their wire form already (category indices)."""
        return list(records)

    @property
    def max_record_bytes(self) -> int:
        """The largest category index, in msgpack."""
        return encoded_size(self.k - 1)


ENTRY: Final = MechanismEntry(
    name=GeneralizedRandomizedResponse.name,
    build=GeneralizedRandomizedResponse,
    epsilon_parameter=True,
    converters={"categories": convert_categories},
)
"""This module's entry in the registry's table (:data:`protocol.registry.BUILTIN_MECHANISMS`)."""
