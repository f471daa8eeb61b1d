"""Binary randomized response (Warner 1965): the single-bit report of 002.

Client: report the true bit with probability ``e**ε / (1 + e**ε)`` and the flipped bit
otherwise. Server: with ``λ̂`` the fraction of ones among ``n`` reports and ``p`` the keep
probability, the proportion of true ones is ``π̂ = (λ̂ - (1 - p)) / (2p - 1)``, unbiased,
with ``Var[π̂] = p(1 - p) / (n (2p - 1)**2)`` whatever the true bits are (each report
is a Bernoulli whose variance is ``p(1 - p)`` for either bit), so the standard error is
exact for the devices that reported. Sampling devices from a larger population adds
``π(1 - π)/n``; the collector reports the estimate for the reporting devices.

Privacy: ε-LDP per report, exactly: the keep probability is rounded down to a multiple of
``2**-64``, so ``Pr[1 | 1] / Pr[1 | 0] <= e**ε`` for the coins actually flipped. There is no
memoization: a use case that reports the same bit every period spends ε each time, and
the accountant charges it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar, Final

import numpy as np
import numpy.typing as npt

from protocol.bit_sum import BitSumAggregate
from protocol.checks import check_epsilon, encoded_size
from protocol.errors import InputError, MalformedReportError
from protocol.estimate import Estimate
from protocol.interfaces import (
    Aggregate,
    Batch,
    EstimateKind,
    MechanismEntry,
    NoPermanentState,
    PlanFigures,
    Privatization,
    RecordValue,
    ValueType,
    own,
    register_mechanism,
)
from protocol.randomness import Coin, RandomSource, bernoulli, coin_at_most, dexp

__all__ = ["ENTRY", "RRAggregate", "RRBatch", "RRRecord", "RandomizedResponse"]


@dataclass(frozen=True, slots=True)
class RRRecord:
    """One privatized bit."""

    bit: int


@dataclass(frozen=True, eq=False)
class RRBatch:
    """Privatized bits in columnar form (``uint8`` zeros and ones)."""

    bits: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return int(self.bits.size)


@dataclass(frozen=True, kw_only=True)
class RandomizedResponse(NoPermanentState):
    """Warner's randomized response on one bit.

    Args:
        epsilon: ε per report, in (0, 64].
    """

    name: ClassVar[str] = "rr"
    kind: ClassVar[EstimateKind] = EstimateKind.PROPORTION
    privatization: ClassVar[Privatization] = Privatization.EVENT
    value_type: ClassVar[ValueType] = ValueType.BIT
    value_range: ClassVar[tuple[float, float] | None] = (0.0, 1.0)
    epsilon: float

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)

    @cached_property
    def keep_coin(self) -> Coin:
        """The coin that decides whether the true bit is reported (heads = keep)."""
        e = dexp(self.epsilon)
        return coin_at_most(e / (1 + e))

    @property
    def keep_probability(self) -> float:
        """``Pr[report = value]`` for the implemented coin."""
        return float(self.keep_coin.probability)

    @property
    def epsilon_report(self) -> float:
        """ε of one report (exactly ``ln(p / (1 - p))`` for the implemented coin, at most ``epsilon``)."""
        p = self.keep_coin.probability
        return math.log(p / (1 - p))

    def setup(self, rng: RandomSource) -> None:
        """No permanent state: each report is fresh randomized response."""
        return

    def privatize(self, value: bool | int, state: None, rng: RandomSource) -> tuple[RRRecord, None]:
        """Report ``value`` (0/1 or bool) through randomized response."""
        bit = self.check_value(value)
        keep = bool(bernoulli(rng, self.keep_coin, 1)[0])
        return RRRecord(bit if keep else 1 - bit), None

    def privatize_many(self, values: npt.NDArray[np.uint8], rng: RandomSource) -> RRBatch:
        """Privatize many bits at once (the simulator's path); same distribution as ``privatize``."""
        v = np.asarray(values, dtype=np.uint8)
        if v.size and int(v.max()) > 1:
            raise InputError("randomized response takes bits (0 or 1)")
        keep = bernoulli(rng, self.keep_coin, int(v.size))
        return RRBatch(np.where(keep, v, 1 - v).astype(np.uint8))

    def output_distribution(self, value: int) -> dict[int, Fraction]:
        """Exact ``Pr[output | value]`` for each output bit, as the coins implement it."""
        p = self.keep_coin.probability
        return {value: p, 1 - value: 1 - p}

    def batch(self, records: Sequence[RRRecord]) -> RRBatch:
        """Records in columnar form."""
        return RRBatch(np.fromiter((r.bit for r in records), dtype=np.uint8, count=len(records)))

    def encode_records(self, records: Sequence[RRRecord]) -> list[Any]:
        """The records' compact wire form: a list of 0/1 integers."""
        return [r.bit for r in records]

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: one bit."""
        return encoded_size(1)

    def decode_records(self, raw: object) -> RRBatch:
        """Strictly decode the wire form of :meth:`encode_records`.

        Raises:
            MalformedReportError: ``bad-type`` or ``out-of-range``, naming ``records[i]``.
        """
        if not isinstance(raw, list):
            raise MalformedReportError("bad-type", "records", "expected a list")
        for i, bit in enumerate(raw):
            if type(bit) is not int:
                raise MalformedReportError("bad-type", f"records[{i}]", "expected an integer bit")
            if bit not in (0, 1):
                raise MalformedReportError("out-of-range", f"records[{i}]", "a bit is 0 or 1")
        return RRBatch(np.array(raw, dtype=np.uint8))

    def new_aggregate(self) -> RRAggregate:
        """An empty aggregate."""
        return RRAggregate(self)

    # --- the contract of protocol.interfaces (plain forms for the shells)

    def privacy_figures(self) -> dict[str, float]:
        """ε of one report (no memo: every report spends it)."""
        return {"epsilon_report": self.epsilon_report}

    def check_value(self, value: object) -> int:
        """A bit: 0, 1, False or True, as an int."""
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int) and value in (0, 1):
            return value
        raise InputError(f"takes a bit (0, 1, False or True); got {value!r}")

    def parse_value(self, text: str) -> int:
        """``0``/``1``, ``true``/``false``, ``yes``/``no``, ``on``/``off``."""
        low = text.strip().lower()
        if low in _TRUE:
            return 1
        if low in _FALSE:
            return 0
        raise InputError(f"takes 0/1 or true/false; got {text!r}")

    def counter_input(self, total: float) -> RecordValue:
        """Not a counter: refused."""
        raise InputError("randomized response is not a counter")

    def encode_plain(self, records: Sequence[object]) -> list[object]:
        """Typed records in wire form."""
        return list(self.encode_records([own(r, RRRecord, "rr record") for r in records]))

    def empty_batch(self) -> RRBatch:
        """No records."""
        return self.batch([])

    def restore_aggregate(self, data: object) -> RRAggregate:
        """An aggregate saved with ``to_plain``."""
        return RRAggregate.from_plain(self, data)

    def fold(self, aggregate: Aggregate, batch: Batch) -> None:
        """Fold a batch into an aggregate of this mechanism."""
        own(aggregate, RRAggregate, "rr aggregate").add(own(batch, RRBatch, "rr batch"))

    def estimate_mean(self, aggregate: Aggregate) -> Estimate:
        """The proportion of devices whose bit is 1."""
        return own(aggregate, RRAggregate, "rr aggregate").estimate()

    def estimate_count(self, aggregate: Aggregate) -> Estimate:
        """The number of devices whose bit is 1."""
        return own(aggregate, RRAggregate, "rr aggregate").estimate_count()

    def plan(self, n: float) -> PlanFigures:
        """``SE(π̂) = sqrt(p(1-p)/n) / (2p - 1)`` (the module docstring; exact for any bits)."""
        p = self.keep_probability
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(p * (1 - p) / n) / (2 * p - 1),
            unit="proportion",
            figures={"epsilon_report": self.epsilon_report, "keep_probability": p},
            formulas=("SE(proportion) = sqrt(p(1-p)/n)/(2p-1), p = e^eps/(1+e^eps)",),
        )


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


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


ENTRY: Final = register_mechanism(
    MechanismEntry(name=RandomizedResponse.name, build=RandomizedResponse, epsilon_parameter=True)
)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
