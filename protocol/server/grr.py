"""k-ary randomized response, the server half: decode, count, estimate, plan, privatize in bulk.

See :mod:`protocol.grr` for the randomizer, its coins and its privacy. A report supports the
one category it names, so ``C_v`` is the number of reports naming ``v`` and the estimate is the
support estimator of :mod:`protocol.server.support` with ``p* = p``, ``q* = q``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from protocol.errors import MalformedReportError
from protocol.grr import DRAW_WORDS, GeneralizedRandomizedResponse
from protocol.randomness import RandomSource, uniform_from_words
from protocol.server.contract import PlanFigures
from protocol.server.support import SupportAggregate, SupportServer

__all__ = ["GRRAggregate", "GRRBatch", "GRRServer", "decode_indices"]


def decode_indices(raw: object, bound: int) -> npt.NDArray[np.int64]:
    """A list of integers in ``[0, bound)``, strictly (``MalformedReportError`` naming the record)."""
    if not isinstance(raw, list):
        raise MalformedReportError("bad-type", "records", "expected a list of category indices")
    for i, c in enumerate(raw):
        # type() rather than isinstance(): bool is an int subclass and is not an index.
        if type(c) is not int:
            raise MalformedReportError("bad-type", f"records[{i}]", "expected an integer category index")
        if not 0 <= c < bound:
            raise MalformedReportError("out-of-range", f"records[{i}]", f"a category index in [0, {bound})")
    return np.array(raw, dtype=np.int64).reshape(len(raw))


@dataclass(frozen=True, eq=False)
class GRRBatch:
    """Reported category indices, one per record."""

    categories: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.categories.size)


class GRRAggregate(SupportAggregate):
    """Reports per category (``C_v``) and ``n``."""

    @classmethod
    def records_per_report(cls, mechanism: GeneralizedRandomizedResponse) -> int:
        """Every report names one category."""
        return 1

    def add(self, batch: GRRBatch) -> None:
        """Count the reported categories."""
        self.add_indices(batch.categories, len(batch))


class GRRServer(SupportServer[GeneralizedRandomizedResponse, GRRBatch, GRRAggregate]):
    """k-ary randomized response's server half."""

    batch_type: ClassVar[type[GRRBatch]] = GRRBatch
    aggregate_type: ClassVar[type[GRRAggregate]] = GRRAggregate

    def decode_records(self, raw: object) -> GRRBatch:
        """A list of category indices, strictly."""
        return GRRBatch(decode_indices(raw, self.mechanism.k))

    def batch(self, records: Sequence[int]) -> GRRBatch:
        """Typed records in columnar form."""
        return GRRBatch(np.array(records, dtype=np.int64).reshape(len(records)))

    def encode_batch(self, batch: GRRBatch) -> list[object]:
        """The batch's records in wire form (the simulator publishes them)."""
        return list(batch.categories.tolist())

    def privatize_many(self, values: Sequence[str], rng: RandomSource) -> GRRBatch:
        """Privatize many values, the device's coins in the device's layout (:mod:`protocol.grr`)."""
        mech = self.mechanism
        own = np.fromiter((mech.index_of(v) for v in values), dtype=np.int64, count=len(values))
        words = rng.words(DRAW_WORDS * own.size).reshape(own.size, DRAW_WORDS)
        other = uniform_from_words(rng, words[:, 1], mech.k - 1)
        other += other >= own
        keep = words[:, 0] < np.uint64(mech.keep_coin.numerator)
        return GRRBatch(np.where(keep, own, other))

    def plan(self, n: float) -> PlanFigures:
        """The SE of a category nobody holds: ``sqrt(n q (1 - q)) / (p - q)``."""
        return self.support_plan(
            n,
            bandwidth_bits=math.log2(self.mechanism.k),
            formula="Wang et al. 2017 Thm 2: Var = n q(1-q)/(p-q)^2, p = e^eps/(e^eps+k-1), q = (1-p)/(k-1)",
        )
