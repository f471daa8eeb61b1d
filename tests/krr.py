"""A toy eighth mechanism, written outside the packages: k-ary randomized response.

Generalized ("direct encoding") randomized response over ``k`` fixed categories: a device
reports its own category with probability ``p = e**ε / (e**ε + k - 1)`` and each other one
with ``q = (1 - p) / (k - 1)``. With ``C_v`` reports of category ``v`` among ``n``, the count
``ĉ_v = (C_v - n q) / (p - q)`` is unbiased with ``Var = n q (1 - q) / (p - q)**2`` for a
category nobody holds (the planner's figure). It is ε-LDP per report for the implemented
coin: the keep coin is rounded down, which lowers ``p``, and the other categories are drawn
uniformly, so every output ratio is ``p / q <= e**ε``.

It exists to show that the two halves of the contract are all a mechanism needs: the device
half (:class:`KaryRandomizedResponse`, :mod:`protocol.interfaces`) and the server half
(:class:`KrrServer`, :mod:`protocol.server.contract`), here in one module.
``tests/test_eighth_mechanism.py`` parses a registry with :data:`ENTRY` beside the built-in
entries and drives it through the agent, the collector's store and estimate, and the planner,
none of which names it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt

from protocol.checks import check_epsilon, encoded_size
from protocol.errors import InputError, MalformedReportError, ParameterError, StateError
from protocol.interfaces import EstimateKind, MechanismEntry, NoPermanentState, Privatization, ValueType
from protocol.randomness import Coin, RandomSource, coin_at_most, dexp, flips, uniform_draws
from protocol.server.contract import PlainServer, PlanFigures
from protocol.server.estimate import VectorEstimate
from protocol.server.parallel import Threads
from protocol.server.plain import require

__all__ = ["ENTRY", "KaryRandomizedResponse", "KrrAggregate", "KrrBatch", "KrrServer"]


# --- the device half -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KaryRandomizedResponse(NoPermanentState):
    """k-ary randomized response over fixed categories; a record is the reported category's index.

    Args:
        epsilon: ε of one report.
        categories: the distinct category names (at least two).
    """

    name: ClassVar[str] = "krr"
    kind: ClassVar[EstimateKind] = EstimateKind.CATEGORIES
    privatization: ClassVar[Privatization] = Privatization.EVENT
    value_type: ClassVar[ValueType] = ValueType.STRING
    value_range: ClassVar[tuple[float, float] | None] = None
    record_type: ClassVar[type[int]] = int
    server: ClassVar[str] = "tests.krr:KrrServer"
    epsilon: float
    categories: tuple[str, ...]

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        cats = tuple(self.categories)
        if len(cats) < 2 or len(set(cats)) != len(cats) or not all(isinstance(c, str) for c in cats):
            raise ParameterError("categories", "at least two distinct strings", self.categories)
        object.__setattr__(self, "categories", cats)

    @property
    def k(self) -> int:
        """The number of categories."""
        return len(self.categories)

    @cached_property
    def keep_coin(self) -> Coin:
        """Report the own category: ``e**ε / (e**ε + k - 1)``, rounded down."""
        e = dexp(self.epsilon)
        return coin_at_most(e / (e + self.k - 1))

    @property
    def p(self) -> float:
        """``Pr[report = own category]`` as implemented."""
        return float(self.keep_coin.probability)

    @property
    def q(self) -> float:
        """``Pr[report = a given other category]``."""
        return (1 - self.p) / (self.k - 1)

    @property
    def epsilon_report(self) -> float:
        """``ln(p / q)`` for the implemented coin (at most ε)."""
        return math.log(self.p / self.q)

    @property
    def fixed_categories(self) -> tuple[str, ...]:
        """The categories."""
        return self.categories

    def privacy_figures(self) -> dict[str, float]:
        """ε of one report."""
        return {"epsilon_report": self.epsilon_report}

    def check_value(self, value: object) -> str:
        """One of the categories."""
        if not isinstance(value, str) or value not in self.categories:
            raise InputError(f"takes one of its {self.k} categories; got {value!r}")
        return value

    def parse_value(self, text: str) -> str:
        """The text itself."""
        return text

    def counter_input(self, total: float) -> str:
        """Not a counter."""
        raise InputError("krr is not a counter")

    def privatize(self, value: str, state: None, rng: RandomSource) -> tuple[int, None]:
        """The reported category's index: the own one with probability ``p``, else another, uniformly."""
        own_index = self.categories.index(self.check_value(value))
        if flips(rng, self.keep_coin, 1)[0]:
            return own_index, None
        other = uniform_draws(rng, self.k - 1, 1)[0]
        return other + (other >= own_index), None

    def encode_records(self, records: Sequence[int]) -> list[Any]:
        """Records are their wire form already (category indices)."""
        return list(records)

    @property
    def max_record_bytes(self) -> int:
        """The largest category index, in msgpack."""
        return encoded_size(self.k - 1)


ENTRY = MechanismEntry(
    name=KaryRandomizedResponse.name,
    build=KaryRandomizedResponse,
    epsilon_parameter=True,
    converters={"categories": lambda v: tuple(v) if isinstance(v, list) else v},
)
"""The entry a test parses registries with, beside ``protocol.registry.BUILTIN_MECHANISMS``."""


# --- the server half -----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class KrrBatch:
    """Reported category indices, one per record."""

    categories: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.categories.size)


class KrrAggregate:
    """Reports per category; merges by addition."""

    def __init__(self, mechanism: KaryRandomizedResponse, counts: npt.NDArray[np.int64] | None = None) -> None:
        self.mechanism = mechanism
        self.counts = np.zeros(mechanism.k, dtype=np.int64) if counts is None else counts

    @classmethod
    def from_plain(cls, mechanism: KaryRandomizedResponse, data: object) -> Self:
        """An aggregate saved with :meth:`to_plain`; ``StateError`` if it does not fit."""
        counts = require(data, "counts", list, where="krr aggregate")
        if len(counts) != mechanism.k or not all(type(c) is int and c >= 0 for c in counts):
            raise StateError(f"krr aggregate: expected {mechanism.k} non-negative counts")
        return cls(mechanism, np.array(counts, dtype=np.int64))

    @property
    def n(self) -> int:
        """Reports folded in."""
        return int(self.counts.sum())

    def add(self, batch: KrrBatch) -> None:
        """Count the reported categories."""
        self.counts += np.bincount(batch.categories, minlength=self.mechanism.k)

    def merge(self, other: Self) -> Self:
        """Both inputs' reports."""
        return type(self)(self.mechanism, self.counts + other.counts)

    def to_plain(self) -> dict[str, list[int]]:
        """Plain counts."""
        return {"counts": [int(c) for c in self.counts]}


class KrrServer(PlainServer[KaryRandomizedResponse, KrrBatch, KrrAggregate]):
    """k-ary randomized response's server half."""

    batch_type: ClassVar[type[KrrBatch]] = KrrBatch
    aggregate_type: ClassVar[type[KrrAggregate]] = KrrAggregate

    def decode_records(self, raw: object) -> KrrBatch:
        """A list of category indices, strictly."""
        k = self.mechanism.k
        if not isinstance(raw, list):
            raise MalformedReportError("bad-type", "records", "expected a list")
        for i, c in enumerate(raw):
            if type(c) is not int or not 0 <= c < k:
                raise MalformedReportError("out-of-range", f"records[{i}]", f"a category index in [0, {k})")
        return KrrBatch(np.array(raw, dtype=np.int64))

    def estimate_frequencies(
        self, aggregate: object, candidates: Sequence[str], *, threads: Threads | None = None
    ) -> VectorEstimate:
        """``ĉ_v = (C_v - n q) / (p - q)`` with its plug-in SE (one pass: ``threads`` are not needed)."""
        agg, mech = self.own_aggregate(aggregate), self.mechanism
        if tuple(candidates) != mech.categories:
            raise ParameterError("candidates", "the categories, in order", candidates)
        n, p, q = agg.n, mech.p, mech.q
        counts = agg.counts.astype(np.float64)
        values = (counts - n * q) / (p - q)
        share = np.clip(counts / n, 0.0, 1.0) if n else np.zeros(mech.k)
        return VectorEstimate(values, np.sqrt(n * share * (1 - share)) / (p - q), n)

    def plan(self, n: float) -> PlanFigures:
        """The SE of a category nobody holds, ``sqrt(n q (1 - q)) / (p - q)``."""
        p, q = self.mechanism.p, self.mechanism.q
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(n * q * (1 - q)) / (p - q),
            unit="count",
            figures={"epsilon_report": self.mechanism.epsilon_report},
            formulas=("SE(count) = sqrt(n q (1-q))/(p-q), p = e^eps/(e^eps+k-1), q = (1-p)/(k-1)",),
        )
