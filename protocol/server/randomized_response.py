"""The server half of binary randomized response: decode, fold, estimate (002; see
:mod:`protocol.randomized_response` for the randomizer and the estimator's derivation)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from protocol.errors import InputError
from protocol.randomized_response import RandomizedResponse, RRRecord
from protocol.randomness import RandomSource, bernoulli
from protocol.server.bit_sum import BitSumAggregate
from protocol.server.contract import PlainServer, PlanFigures
from protocol.server.estimate import Estimate
from protocol.server.records import decode_bits

__all__ = ["RRAggregate", "RRBatch", "RRServer"]


@dataclass(frozen=True, eq=False)
class RRBatch:
    """Privatized bits in columnar form (``uint8`` zeros and ones)."""

    bits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.bits.size)


class RRAggregate(BitSumAggregate[RandomizedResponse]):
    """Count of ones and of reports; merges by addition."""

    label = "rr aggregate"

    def estimate(self) -> Estimate:
        """The proportion of devices whose true bit is 1, with its standard error."""
        if self._n == 0:
            return Estimate(math.nan, math.nan, 0)
        p = self.mechanism.keep_probability
        lam = self.ones / self._n
        value = (lam - (1 - p)) / (2 * p - 1)
        se = math.sqrt(p * (1 - p) / self._n) / (2 * p - 1)
        return Estimate(value, se, self._n)

    def estimate_count(self) -> Estimate:
        """The number of devices whose true bit is 1, with its standard error."""
        e = self.estimate()
        return Estimate(e.value * self._n, e.standard_error * self._n, self._n)


class RRServer(PlainServer[RandomizedResponse, RRBatch, RRAggregate]):
    """Randomized response's server half."""

    batch_type: ClassVar[type[RRBatch]] = RRBatch
    aggregate_type: ClassVar[type[RRAggregate]] = RRAggregate

    def batch(self, records: Sequence[RRRecord]) -> RRBatch:
        """Typed records in columnar form."""
        return RRBatch(np.fromiter((r.bit for r in records), dtype=np.uint8, count=len(records)))

    def privatize_many(self, values: npt.NDArray[np.uint8], rng: RandomSource) -> RRBatch:
        """Privatize many bits at once (the simulator's path); same distribution as ``privatize``."""
        v = np.asarray(values, dtype=np.uint8)
        if v.size and int(v.max()) > 1:
            raise InputError("randomized response takes bits (0 or 1)")
        keep = bernoulli(rng, self.mechanism.keep_coin, int(v.size))
        return RRBatch(np.where(keep, v, 1 - v).astype(np.uint8))

    def decode_records(self, raw: object) -> RRBatch:
        """Strictly decode the wire form of ``encode_records``.

        Raises:
            MalformedReportError: ``bad-type`` or ``out-of-range``, naming ``records[i]``.
        """
        return RRBatch(decode_bits(raw, expected="expected a list"))

    def estimate_mean(self, aggregate: object) -> Estimate:
        """The proportion of devices whose bit is 1."""
        return self.own_aggregate(aggregate).estimate()

    def estimate_count(self, aggregate: object) -> Estimate:
        """The number of devices whose bit is 1."""
        return self.own_aggregate(aggregate).estimate_count()

    def plan(self, n: float) -> PlanFigures:
        """``SE(π̂) = sqrt(p(1-p)/n) / (2p - 1)`` (the module docstring; exact for any bits)."""
        p = self.mechanism.keep_probability
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(p * (1 - p) / n) / (2 * p - 1),
            unit="proportion",
            figures={"epsilon_report": self.mechanism.epsilon_report, "keep_probability": p},
            formulas=("SE(proportion) = sqrt(p(1-p)/n)/(2p-1), p = e^eps/(1+e^eps)",),
        )
