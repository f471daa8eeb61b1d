"""Optimal local hashing (``olh``) over a fixed hash family, the device half.

Optimal local hashing (Wang, Blocki, Li, Jha, USENIX Security 2017, §4.4) reaches the variance
``4 e**ε / (e**ε - 1)**2`` per report for a value nobody holds, the least of the pure protocols
and independent of the domain's size, with a report of ``log2(seeds) + log2(g)`` bits and no
dictionary on the device: like the Count Mean Sketch (003 §4.1) it serves open string domains,
the collector querying a dictionary of candidates afterwards. A device holding ``v`` draws a hash
function ``h_j`` (``j`` uniform in ``[seeds]``), hashes ``x = h_j(v)`` into ``[g]`` and reports
``(j, y)`` with ``y = x`` with probability ``p = e**ε / (e**ε + g - 1)`` and each other of the ``g``
values with ``q = (1 - p) / (g - 1)``; ``g = round(e**ε + 1)`` by default (Wang et al. 2017 §4.4).

**A fixed family.** Wang et al. draw a fresh hash function per report, so the server's
aggregate grows with the reports. Drawing ``j`` from a fixed public family of ``seeds`` functions
instead (the public-coin variant that fast local hashing, Cormode, Maddock and Maple, VLDB
2021, §4, studies) makes the aggregate a ``seeds x g`` table of counts that folds in a stream
and merges by addition, and a candidate's count is read from it in ``O(seeds)``
(:mod:`protocol.server.olh`). The price is that two values collide in a fixed share of the
rows rather than a fresh ``1/g`` each time: the estimate's variance, taken over the family
too, gains a term that grows with ``Σ f**2 / seeds`` (docs/estimation.md derives it, and the
SE shown includes it). The family is the one CMS uses (:mod:`protocol.hashing`: keyed BLAKE2b
fingerprints and 2-independent vector multiply-shift), here with ``count = seeds`` and
``range = g``, evaluated on a device one value at a time in pure Python.

**Coins.** A report draws three uniform words: ``j`` (taken modulo ``seeds`` with rejection,
:func:`protocol.randomness.uniform_word`), the keep coin (``p`` rounded down to a multiple of
``2**-64``), and the other value reported otherwise (modulo ``g - 1``, the ``i``-th value after
skipping ``x``). All three are drawn whatever the coin shows, so the server half's vectorised
privatizer reads the same stream.

**Privacy.** Given ``j``, an output ``y`` has probability ``p`` if ``y = h_j(v)`` and ``q``
otherwise, so every ratio between two values is at most ``p / q = p (g - 1) / (1 - p) <= e**ε``
for the implemented coin, reached where their hashes differ. No permanent state (event-level).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar, Final

from protocol.checks import EPSILON_MIN_MULTI, check_epsilon, check_int, check_seed, encoded_size
from protocol.cms import ScalarHash, as_value_bytes
from protocol.errors import InputError, ParameterError
from protocol.hashing import HashFamily
from protocol.interfaces import EstimateKind, EventLevelStrings, MechanismEntry
from protocol.randomness import KaryKeepCoin, RandomSource, uniform_word

__all__ = [
    "DEFAULT_SEEDS",
    "DRAW_WORDS",
    "ENTRY",
    "G_DEFAULT_MAX",
    "MAX_CELLS",
    "OLHRecord",
    "OptimalLocalHashing",
    "default_g",
    "default_seeds",
]

DEFAULT_SEEDS: Final = 4096
"""The family's size when a use case gives none (fewer when ``g`` is large: :func:`default_seeds`).

A candidate's estimate gathers ``seeds`` cells, so a dictionary query costs ``seeds`` times the
candidates; the collision term of the variance falls as ``1 / seeds``. At 4,096 it is about 5 %
of the coin term for a Zipf population of 20,000 reports and a dictionary query of 65,536
candidates stays within a few seconds; ``ldp-collector plan`` says what a larger family buys at a
use case's expected reports (docs/estimation.md, "Optimal local hashing")."""
MAX_CELLS: Final = 1 << 26
"""The largest aggregate (``seeds x g`` counts) a use case may ask for."""
_DEFAULT_CELLS: Final = 1 << 22
DRAW_WORDS: Final = 3
"""Uniform words a report draws: the hash index's, the keep coin's and the other value's."""
_OUTPUT_LIMIT: Final = 1 << 20


G_DEFAULT_MAX: Final = 4096
"""The largest default ``g``. Past ε ≈ 8.3 ``e**ε + 1`` would grow the ``seeds x g`` table (or
shrink the family, whose collision term then dominates) for a gain that no longer matters next
to that of a fixed list of categories (``grr``, ``ss``): the default stops here, with 1,024 hash
functions, and a count's variance rises above the optimum ``4 e**ε / (e**ε - 1)**2`` (1.12x at
ε = 9, 1.9x at ε = 10); ``ldp-collector plan oracles`` shows it. A use case may set ``g``."""


def default_g(epsilon: float) -> int:
    """``round(e**ε + 1)`` (Wang et al. 2017 §4.4), at least 2 and at most :data:`G_DEFAULT_MAX`."""
    return max(2, min(G_DEFAULT_MAX, round(math.exp(min(epsilon, 40.0)) + 1)))


def default_seeds(g: int) -> int:
    """:data:`DEFAULT_SEEDS`, halved until the ``seeds x g`` table holds at most ``2**22`` counts."""
    seeds = DEFAULT_SEEDS
    while seeds > 1 and seeds * g > _DEFAULT_CELLS:
        seeds //= 2
    return seeds


@dataclass(frozen=True, slots=True)
class OLHRecord:
    """One privatized report: the hash index ``j`` and the reported hash value ``y``."""

    index: int
    value: int


@dataclass(frozen=True, kw_only=True)
class OptimalLocalHashing(KaryKeepCoin, EventLevelStrings):
    """Optimal local hashing over a fixed public family of hash functions.

    Args:
        epsilon: ε per report, in (0, 64].
        seed: the use case's public hash seed (at least 16 bytes).
        g: the hash range; ``0`` (the default) takes ``round(e**ε + 1)``, at most 4,096.
        seeds: how many hash functions the family holds; ``0`` (the default) takes
            :func:`default_seeds`.
    """

    name: ClassVar[str] = "olh"
    server: ClassVar[str] = "protocol.server.olh:OLHServer"
    record_type: ClassVar[type[OLHRecord]] = OLHRecord
    kind: ClassVar[EstimateKind] = EstimateKind.DICTIONARY
    epsilon: float
    seed: bytes
    g: int = field(default=0)
    seeds: int = field(default=0)

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon, low=EPSILON_MIN_MULTI)
        check_seed(self.seed)
        if type(self.g) is int and self.g == 0:
            object.__setattr__(self, "g", default_g(self.epsilon))
        check_int(self.g, "g", low=2, high=1 << 24)
        if type(self.seeds) is int and self.seeds == 0:
            object.__setattr__(self, "seeds", default_seeds(self.g))
        check_int(self.seeds, "seeds", low=1, high=1 << 24)
        if self.seeds * self.g > MAX_CELLS:
            raise ParameterError("seeds", f"seeds x g <= {MAX_CELLS:,} (the aggregate's counts)", self.seeds)

    @cached_property
    def family(self) -> HashFamily:
        """The public hash functions ``h_0 .. h_{seeds-1}`` into ``[g]``."""
        return HashFamily(self.seed, count=self.seeds, range=self.g)

    @cached_property
    def scalar_hash(self) -> ScalarHash:
        """:attr:`family` evaluated for one value at a time, as the device does."""
        return ScalarHash(self.family)

    @property
    def outcomes(self) -> int:
        """A report's ``y`` is one of the ``g`` hash values (``p``: ``Pr[y = h_j(v)]``)."""
        return self.g

    def setup(self, rng: RandomSource) -> None:
        """No permanent state: each event is privatized afresh (event-level privacy)."""
        return

    def privatize(self, value: str | bytes, state: None, rng: RandomSource) -> tuple[OLHRecord, None]:
        """One report for ``value`` (Wang et al. 2017 §4.4, over the fixed family)."""
        return self.privatize_bytes(as_value_bytes(value), rng), None

    def privatize_bytes(self, data: bytes, rng: RandomSource) -> OLHRecord:
        """One report for a value given by its bytes."""
        index_word, keep_word, other_word = rng.draw(DRAW_WORDS)
        j = uniform_word(rng, index_word, self.seeds)
        other = uniform_word(rng, other_word, self.g - 1)
        x = self.scalar_hash(data, j)
        if keep_word < self.keep_coin.numerator:
            return OLHRecord(j, x)
        return OLHRecord(j, other + (other >= x))

    def output_distribution(self, value: str | bytes) -> dict[tuple[int, int], Fraction]:
        """Exact ``Pr[(j, y) | value]`` for every output, as the coins implement it (small families only)."""
        if self.seeds * self.g > _OUTPUT_LIMIT:
            raise ValueError(f"output space seeds x g too large to enumerate ({self.seeds} x {self.g})")
        fp = self.scalar_hash.fingerprint(as_value_bytes(value))
        p, q = self.p_exact / self.seeds, self.q_exact / self.seeds
        return {(j, y): p if y == self.scalar_hash.at(fp, j) else q for j in range(self.seeds) for y in range(self.g)}

    def check_value(self, value: object) -> str | bytes:
        """A string (hashed as UTF-8) or bytes."""
        if not isinstance(value, str | bytes):
            raise InputError(f"takes a string; got {type(value).__name__} {value!r}")
        as_value_bytes(value)
        return value

    def encode_records(self, records: Sequence[OLHRecord]) -> list[Any]:
        """The records' wire form: ``[j, y]`` per record."""
        return [[r.index, r.value] for r in records]

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: the largest index and value."""
        return encoded_size([self.seeds - 1, self.g - 1])

    @property
    def fixed_categories(self) -> None:
        """A dictionary is queried (no fixed categories)."""
        return None


ENTRY: Final = MechanismEntry(
    name=OptimalLocalHashing.name, build=OptimalLocalHashing, epsilon_parameter=True, dictionary=True
)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
