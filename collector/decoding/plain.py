"""The released-value record and the JSON-ready forms shared by the decoders.

Every decoder releases a value with the same numbers: an estimated count, its standard
error, a confidence interval and a one-sided test of ``count > 0``. :class:`ValueEstimate`
is that record, once; :class:`collector.decoding.rappor.DecodedString` (RAPPOR
candidates) and :class:`collector.decoding.sketches.FrequencyEntry` (dictionary entries
and SFP words) are its named kinds, so a reader of the collector's output sees one shape.

Released numbers can be infinite or NaN (a zero standard error gives ``z = inf``; an
unbounded threshold is ``-inf``), which JSON cannot carry: :func:`finite` writes them as
``null``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from protocol.plain import JsonObject

__all__ = ["ValueEstimate", "finite"]


def finite(x: float) -> float | None:
    """``x``, or ``None`` when it is infinite or NaN (JSON has no such numbers)."""
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class ValueEstimate:
    """A value with its estimated count, interval and test.

    Attributes:
        value: the candidate string, dictionary entry or word.
        count: estimated number of reports holding it.
        standard_error: its standard error.
        low: lower end of the confidence interval.
        high: upper end of the confidence interval.
        z: ``count / standard_error`` (the test statistic).
        p_value: one-sided p-value of ``count > 0``.
    """

    value: str | bytes
    count: float
    standard_error: float
    low: float
    high: float
    z: float
    p_value: float

    def to_plain(self) -> JsonObject:
        """JSON object; a ``bytes`` value is written in hex (JSON has no bytes)."""
        return {
            "value": self.value if isinstance(self.value, str) else self.value.hex(),
            "count": finite(self.count),
            "standard_error": finite(self.standard_error),
            "interval": [finite(self.low), finite(self.high)],
            "z": finite(self.z),
            "p_value": finite(self.p_value),
        }
