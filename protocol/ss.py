"""Subset selection (``ss``), the device half (Ye and Barg, IEEE Trans. Inf. Theory 2018; Wang et al. 2016).

A device holding category ``v`` of ``k`` reports a subset ``Y`` of ``d`` categories: every subset
that contains ``v`` has probability ``e**ε / Z`` and every other one ``1 / Z``
(``Z = C(k-1, d-1) e**ε + C(k-1, d)``). With ``d ≈ k / (e**ε + 1)`` its error attains the
minimax error of ε-LDP frequency estimation up to lower-order terms (Ye and Barg 2018 Thm 2),
below optimized unary encoding's and optimal local hashing's for moderate ``k``; ``d = 1`` is
k-ary randomized response. The server half (:mod:`protocol.server.ss`) counts how many reports
contain each category; with ``α = Pr[v ∈ Y | v]`` and ``β = Pr[v ∈ Y | w]`` for ``w != v``, the
support estimator of :mod:`protocol.server.support` applies with ``p* = α``, ``q* = β``.

**Sampling.** ``α = d e**ε / (d e**ε + k - d)``. A report draws ``d + 1`` uniform words: the first
decides whether ``v`` is in ``Y`` (the coin ``α``, rounded down); then ``Y`` holds ``v`` and
``d - 1`` others, or ``d`` others, drawn uniformly without replacement from the ``k - 1`` other
categories by Floyd's algorithm, one word each (:func:`protocol.randomness.sample_floyd`). So
``Pr[Y | v] = α / C(k-1, d-1)`` for ``v ∈ Y`` and ``(1 - α) / C(k-1, d)`` otherwise, the
distribution above for ``α`` exact.

**Privacy.** The largest ratio, between a ``Y`` containing ``v`` but not ``v'`` under ``v`` and
under ``v'``, is ``α C(k-1, d) / ((1 - α) C(k-1, d-1)) = α (k - d) / ((1 - α) d) <= e**ε`` for the
implemented coin (equal to ``e**ε`` for the ideal one).

**Wire form.** The smaller of two, fixed by ``k`` and ``d``: the ``d`` indices in increasing
order (``indices``), or the packed ``k``-bit membership vector (``bits``; bit ``i`` in byte
``i // 8``, mask ``0x80 >> (i % 8)``). A record's size grows with ``k`` (about
``k / (e**ε + 1)`` indices, or ``k / 8`` bytes): the planner says so. No permanent state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from itertools import combinations
from typing import Any, ClassVar, Final, Literal

from protocol.categories import FixedCategories, convert_categories
from protocol.checks import check_int, encoded_size
from protocol.interfaces import MechanismEntry
from protocol.randomness import Coin, RandomSource, coin_at_most, dexp, log_ratio, sample_floyd

__all__ = ["ENTRY", "SubsetSelection", "optimal_subset_size", "subset_support"]

_OUTPUT_LIMIT: Final = 1 << 16
"""Largest number of subsets :meth:`SubsetSelection.output_distribution` enumerates."""


def subset_support(k: int, d: int, alpha: float) -> tuple[float, float]:
    """``(α, β)``: a report of ``v`` contains ``v`` with ``α`` and contains a given ``w != v`` with ``β``."""
    beta = alpha * (d - 1) / (k - 1) + (1 - alpha) * d / (k - 1)
    return alpha, beta


def _ideal_alpha(k: int, d: int, epsilon: float) -> float:
    e = math.exp(epsilon)
    return d * e / (d * e + k - d)


def optimal_subset_size(k: int, epsilon: float) -> int:
    """The ``d`` in ``[1, k - 1]`` whose count of an unheld category has the least variance,
    ``β (1 - β) / (α - β)**2`` per report, searched around Ye and Barg's ``k / (e**ε + 1)``."""
    guess = k / (math.exp(min(epsilon, 700.0)) + 1)
    lo, hi = max(1, math.floor(guess) - 2), min(k - 1, math.ceil(guess) + 2)

    def variance(d: int) -> float:
        a, b = subset_support(k, d, _ideal_alpha(k, d, epsilon))
        return b * (1 - b) / (a - b) ** 2

    return min(range(lo, max(lo, hi) + 1), key=variance)


@dataclass(frozen=True, kw_only=True)
class SubsetSelection(FixedCategories):
    """Subset selection over fixed categories; a record is the reported subset.

    Args:
        epsilon, categories: as :class:`~protocol.categories.FixedCategories` (checked there).
        d: the subset size, in ``[1, k - 1]``; ``0`` (the default) takes the one of least variance
            (:func:`optimal_subset_size`, about ``k / (e**ε + 1)``).
    """

    name: ClassVar[str] = "ss"
    record_type: ClassVar[type[tuple[int, ...]]] = tuple
    server: ClassVar[str] = "protocol.server.ss:SSServer"
    d: int = field(default=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        cats = self.categories
        if type(self.d) is int and self.d == 0:
            object.__setattr__(self, "d", optimal_subset_size(len(cats), self.epsilon))
        check_int(self.d, "d", low=1, high=len(cats) - 1)

    @cached_property
    def include_coin(self) -> Coin:
        """``v ∈ Y``: ``d e**ε / (d e**ε + k - d)``, rounded down."""
        e = dexp(self.epsilon)
        return coin_at_most(self.d * e / (self.d * e + self.k - self.d))

    @property
    def support_probabilities(self) -> tuple[float, float]:
        """``(α, β)`` for the implemented coin (:func:`subset_support`)."""
        return subset_support(self.k, self.d, float(self.include_coin.probability))

    @cached_property
    def epsilon_report(self) -> float:
        """``ln(α (k - d) / ((1 - α) d))`` for the implemented coin (at most ε)."""
        a = self.include_coin.probability
        return log_ratio(a * (self.k - self.d) / ((1 - a) * self.d))

    @property
    def draw_words(self) -> int:
        """Words a report draws: the coin's, then one per Floyd step (``d`` at most)."""
        return self.d + 1

    @cached_property
    def wire_form(self) -> Literal["indices", "bits"]:
        """``indices`` when ``d`` indices take fewer bytes than the ``k``-bit vector, else ``bits``."""
        as_indices = encoded_size([self.k - 1] * self.d)
        return "indices" if as_indices < encoded_size(bytes((self.k + 7) // 8)) else "bits"

    def privatize(self, value: str, state: None, rng: RandomSource) -> tuple[tuple[int, ...], None]:
        """One subset for category ``value``, its members in increasing order."""
        own = self.index_of(value)
        words = rng.draw(self.draw_words)
        included = words[0] < self.include_coin.numerator
        others = sample_floyd(rng, words[1:], self.k - 1, self.d - 1 if included else self.d)
        members = [o + (o >= own) for o in others]
        if included:
            members.append(own)
        return tuple(sorted(members)), None

    def output_distribution(self, value: str) -> dict[tuple[int, ...], Fraction]:
        """Exact ``Pr[Y | value]`` for every subset, as the coins implement it (small ``k`` only)."""
        if math.comb(self.k, self.d) > _OUTPUT_LIMIT:
            raise ValueError(f"C(k, d) too large to enumerate (k={self.k}, d={self.d})")
        own = self.index_of(value)
        a = self.include_coin.probability
        with_own = a / math.comb(self.k - 1, self.d - 1)
        without = (1 - a) / math.comb(self.k - 1, self.d)
        return {s: with_own if own in s else without for s in combinations(range(self.k), self.d)}

    def encode_records(self, records: Sequence[tuple[int, ...]]) -> list[Any]:
        """Each subset as its increasing indices, or as its packed membership vector (:attr:`wire_form`)."""
        if self.wire_form == "indices":
            return [list(r) for r in records]
        nbytes = (self.k + 7) // 8
        out: list[Any] = []
        for r in records:
            code = 0
            for i in r:
                code |= 1 << (8 * nbytes - 1 - i)
            out.append(code.to_bytes(nbytes, "big"))
        return out

    @property
    def max_record_bytes(self) -> int:
        """One record at its largest, in msgpack."""
        if self.wire_form == "indices":
            return encoded_size([self.k - 1] * self.d)
        return encoded_size(bytes((self.k + 7) // 8))


ENTRY: Final = MechanismEntry(
    name=SubsetSelection.name,
    build=SubsetSelection,
    epsilon_parameter=True,
    converters={"categories": convert_categories},
)
"""This module's entry in the registry's table (:data:`protocol.registry.BUILTIN_MECHANISMS`)."""
