"""Binary randomized response (Warner 1965): the single-bit report of 002.

Client: report the true bit with probability ``e**ε / (1 + e**ε)`` and the flipped bit
otherwise. Server (:mod:`protocol.server.randomized_response`): with ``λ̂`` the fraction of
ones among ``n`` reports and ``p`` the keep probability, the proportion of true ones is
``π̂ = (λ̂ - (1 - p)) / (2p - 1)``, unbiased, with ``Var[π̂] = p(1 - p) / (n (2p - 1)**2)``
whatever the true bits are (each report is a Bernoulli whose variance is ``p(1 - p)`` for
either bit), so the standard error is exact for the devices that reported. Sampling devices
from a larger population adds ``π(1 - π)/n``; the collector reports the estimate for the
reporting devices.

Privacy: ε-LDP per report, exactly: the keep probability is rounded down to a multiple of
``2**-64``, so ``Pr[1 | 1] / Pr[1 | 0] <= e**ε`` for the coins actually flipped. There is no
memoization: a use case that reports the same bit every period spends ε each time, and
the accountant charges it.

This module is the device half (pure Python): the parameters, the privatizer and the
record's wire form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Final

from protocol.checks import check_epsilon, encoded_size
from protocol.errors import InputError
from protocol.interfaces import EstimateKind, MechanismEntry, NoPermanentState, Privatization, RecordValue, ValueType
from protocol.randomness import BinaryKeepCoin, RandomSource, flips

__all__ = ["ENTRY", "RRRecord", "RandomizedResponse"]


@dataclass(frozen=True, slots=True)
class RRRecord:
    """One privatized bit."""

    bit: int


@dataclass(frozen=True, kw_only=True)
class RandomizedResponse(BinaryKeepCoin, NoPermanentState):
    """Warner's randomized response on one bit: the true bit is reported with the keep coin
    (:class:`~protocol.randomness.BinaryKeepCoin`), ``Pr[report = value] = p``.

    Args:
        epsilon: ε per report, in (0, 64].
    """

    name: ClassVar[str] = "rr"
    kind: ClassVar[EstimateKind] = EstimateKind.PROPORTION
    privatization: ClassVar[Privatization] = Privatization.EVENT
    value_type: ClassVar[ValueType] = ValueType.BIT
    value_range: ClassVar[tuple[float, float] | None] = (0.0, 1.0)
    record_type: ClassVar[type[RRRecord]] = RRRecord
    server: ClassVar[str] = "protocol.server.randomized_response:RRServer"
    epsilon: float

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)

    def privacy_figures(self) -> dict[str, float]:
        """ε of one report (no memo: every report spends it)."""
        return {"epsilon_report": self.epsilon_report}

    def setup(self, rng: RandomSource) -> None:
        """No permanent state: each report is fresh randomized response."""
        return

    def privatize(self, value: bool | int, state: None, rng: RandomSource) -> tuple[RRRecord, None]:
        """Report ``value`` (0/1 or bool) through randomized response."""
        bit = self.check_value(value)
        keep = flips(rng, self.keep_coin, 1)[0]
        return RRRecord(bit if keep else 1 - bit), None

    def output_distribution(self, value: int) -> dict[int, Fraction]:
        """Exact ``Pr[output | value]`` for each output bit, as the coins implement it."""
        p = self.keep_coin.probability
        return {value: p, 1 - value: 1 - p}

    def encode_records(self, records: Sequence[RRRecord]) -> list[Any]:
        """The records' compact wire form: a list of 0/1 integers."""
        return [r.bit for r in records]

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: one bit."""
        return encoded_size(1)

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


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})

ENTRY: Final = MechanismEntry(name=RandomizedResponse.name, build=RandomizedResponse, epsilon_parameter=True)
"""This module's entry in the registry's table (:data:`protocol.registry.BUILTIN_MECHANISMS`)."""
