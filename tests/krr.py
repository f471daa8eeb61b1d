"""A toy eighth mechanism, written outside the packages: k-ary randomized response.

Generalized ("direct encoding") randomized response over ``k`` fixed categories: a device
reports its own category with probability ``p = e**ε / (e**ε + k - 1)`` and each other one
with ``q = (1 - p) / (k - 1)``. With ``C_v`` reports of category ``v`` among ``n``, the count
``ĉ_v = (C_v - n q) / (p - q)`` is unbiased with ``Var = n q (1 - q) / (p - q)**2`` for a
category nobody holds (the planner's figure). It is ε-LDP per report for the implemented
coin: the keep coin is rounded down, which lowers ``p``, and the other categories are drawn
uniformly, so every output ratio is ``p / q <= e**ε``.

It exists to show that the contract of :mod:`protocol.interfaces` is all a mechanism needs:
``tests/test_eighth_mechanism.py`` registers :data:`ENTRY` and drives it through the agent,
the collector's store and estimate, and the planner, none of which names it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Self

import numpy as np
import numpy.typing as npt

from protocol.checks import check_epsilon, encoded_size
from protocol.errors import InputError, MalformedReportError, ParameterError, StateError
from protocol.estimate import VectorEstimate
from protocol.interfaces import (
    Aggregate,
    Batch,
    EstimateKind,
    MechanismEntry,
    PlanFigures,
    Privatization,
    ValueType,
    own,
)
from protocol.plain import require
from protocol.randomness import Coin, RandomSource, bernoulli, coin_at_most, dexp, uniform_ints

__all__ = ["ENTRY", "KaryRandomizedResponse", "KrrAggregate", "KrrBatch"]


@dataclass(frozen=True, eq=False)
class KrrBatch:
    """Reported category indices, one per record."""

    categories: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.categories.size)


@dataclass(frozen=True, kw_only=True)
class KaryRandomizedResponse:
    """k-ary randomized response over fixed categories.

    Args:
        epsilon: ε of one report.
        categories: the distinct category names (at least two).
    """

    name: ClassVar[str] = "krr"
    kind: ClassVar[EstimateKind] = EstimateKind.CATEGORIES
    privatization: ClassVar[Privatization] = Privatization.EVENT
    value_type: ClassVar[ValueType] = ValueType.STRING
    value_range: ClassVar[tuple[float, float] | None] = None
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

    # --- the contract

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

    def setup_plain(self, rng: RandomSource) -> None:
        """No permanent state."""
        return

    def check_state_plain(self, data: object) -> None:
        """Only ``None`` fits."""
        if data is not None:
            raise StateError("krr keeps no permanent state")

    def privatize_plain(self, value: object, state: object, rng: RandomSource) -> tuple[object, None]:
        """The reported category's index (its wire form)."""
        own_index = self.categories.index(self.check_value(value))
        if bool(bernoulli(rng, self.keep_coin, 1)[0]):
            return own_index, None
        other = int(uniform_ints(rng, self.k - 1, 1)[0])
        return other + (other >= own_index), None

    def encode_plain(self, records: Sequence[object]) -> list[object]:
        """Records are their wire form already (category indices)."""
        return [int(own(r, int, "krr record")) for r in records]

    def decode_records(self, raw: object) -> KrrBatch:
        """A list of category indices, strictly."""
        if not isinstance(raw, list):
            raise MalformedReportError("bad-type", "records", "expected a list")
        for i, c in enumerate(raw):
            if type(c) is not int or not 0 <= c < self.k:
                raise MalformedReportError("out-of-range", f"records[{i}]", f"a category index in [0, {self.k})")
        return KrrBatch(np.array(raw, dtype=np.int64))

    @property
    def max_record_bytes(self) -> int:
        """The largest category index, in msgpack."""
        return encoded_size(self.k - 1)

    def empty_batch(self) -> KrrBatch:
        """No records."""
        return KrrBatch(np.zeros(0, dtype=np.int64))

    def new_aggregate(self) -> KrrAggregate:
        """An empty aggregate."""
        return KrrAggregate(self, np.zeros(self.k, dtype=np.int64))

    def restore_aggregate(self, data: object) -> KrrAggregate:
        """An aggregate saved with ``to_plain``."""
        counts = require(data, "counts", list, where="krr aggregate")
        if len(counts) != self.k or not all(type(c) is int and c >= 0 for c in counts):
            raise StateError(f"krr aggregate: expected {self.k} non-negative counts")
        return KrrAggregate(self, np.array(counts, dtype=np.int64))

    def fold(self, aggregate: Aggregate, batch: Batch) -> None:
        """Count the reported categories."""
        agg = own(aggregate, KrrAggregate, "krr aggregate")
        agg.counts += np.bincount(own(batch, KrrBatch, "krr batch").categories, minlength=self.k)

    @property
    def fixed_categories(self) -> tuple[str, ...]:
        """The categories."""
        return self.categories

    def estimate_frequencies(self, aggregate: Aggregate, candidates: Sequence[str]) -> VectorEstimate:
        """``ĉ_v = (C_v - n q) / (p - q)`` with its plug-in SE."""
        agg = own(aggregate, KrrAggregate, "krr aggregate")
        if tuple(candidates) != self.categories:
            raise ParameterError("candidates", "the categories, in order", candidates)
        n, p, q = agg.n, self.p, self.q
        counts = agg.counts.astype(np.float64)
        values = (counts - n * q) / (p - q)
        share = np.clip(counts / n, 0.0, 1.0) if n else np.zeros(self.k)
        return VectorEstimate(values, np.sqrt(n * share * (1 - share)) / (p - q), n)

    def plan(self, n: float) -> PlanFigures:
        """The SE of a category nobody holds, ``sqrt(n q (1 - q)) / (p - q)``."""
        p, q = self.p, self.q
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(n * q * (1 - q)) / (p - q),
            unit="count",
            figures={"epsilon_report": self.epsilon_report},
            formulas=("SE(count) = sqrt(n q (1-q))/(p-q), p = e^eps/(e^eps+k-1), q = (1-p)/(k-1)",),
        )


class KrrAggregate:
    """Reports per category; merges by addition."""

    def __init__(self, mechanism: KaryRandomizedResponse, counts: npt.NDArray[np.int64]) -> None:
        self.mechanism = mechanism
        self.counts = counts

    @property
    def n(self) -> int:
        """Reports folded in."""
        return int(self.counts.sum())

    def merge(self, other: Self) -> Self:
        """Both inputs' reports."""
        return type(self)(self.mechanism, self.counts + other.counts)

    def to_plain(self) -> dict[str, list[int]]:
        """Plain counts."""
        return {"counts": [int(c) for c in self.counts]}


ENTRY = MechanismEntry(
    name=KaryRandomizedResponse.name,
    build=KaryRandomizedResponse,
    epsilon_parameter=True,
    converters={"categories": lambda v: tuple(v) if isinstance(v, list) else v},
)
"""The entry a test registers (:func:`protocol.interfaces.registered_mechanism`)."""
