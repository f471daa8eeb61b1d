"""The released-value record shared by the decoders.

Every decoder releases a value with the same numbers: an estimated count, its standard
error, a confidence interval and a one-sided test of ``count > 0``. :class:`ValueEstimate`
is that record, once; :class:`collector.decoding.rappor.DecodedString` (RAPPOR
candidates) and :class:`collector.decoding.sketches.FrequencyEntry` (dictionary entries
and SFP words) are its named kinds, so a reader of the collector's output sees one shape.
What a person reads of them is built once as a typed result (``collector.results``, by
``collector.estimation``) and becomes JSON only there.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ValueEstimate"]


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
