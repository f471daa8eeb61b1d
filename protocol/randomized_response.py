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
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from protocol.bit_sum import BitSumAggregate
from protocol.checks import check_epsilon
from protocol.errors import InputError, MalformedReportError
from protocol.estimate import Estimate
from protocol.randomness import Coin, RandomSource, bernoulli, coin_at_most, dexp

__all__ = ["RRAggregate", "RRBatch", "RRRecord", "RandomizedResponse"]


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
class RandomizedResponse:
    """Warner's randomized response on one bit.

    Args:
        epsilon: ε per report, in (0, 64].
    """

    name: ClassVar[str] = "rr"
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
        if isinstance(value, bool):
            bit = int(value)
        elif isinstance(value, int) and value in (0, 1):
            bit = value
        else:
            raise InputError(f"randomized response takes a bit (0, 1, False or True); got {value!r}")
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
