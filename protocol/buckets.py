"""Bucketing of a counter into ``k`` histogram buckets: linear, exponential and custom edges.

dBitFlip (000 §2.2) estimates a histogram "of counter values in a discretized domain with
``k`` buckets"; the Windows telemetry talk (002) lists the three bucketings a client
offers: linear, exponential and custom. This module is that discretization. It is the
mechanism's coarse input: a device's memo table (000 §3.4, ``f_d``) is keyed by the bucket,
never by the raw counter.

Every bucketing has ``count`` buckets and ``count + 1`` edges ``e_0 < e_1 < ... < e_count``;
bucket ``i`` is the half-open interval ``[e_i, e_{i+1})``:

* :class:`LinearBuckets` ``(low, high, count)``: equal widths on ``[low, high)``,
  ``e_i = low + i·(high - low)/count``.
* :class:`ExponentialBuckets` ``(start, factor, count)``: ``[0, start)``,
  ``[start, start·factor)``, ``[start·factor, start·factor²)``, …, and the last bucket
  ``[start·factor^(count-2), ∞)`` open-ended, i.e. ``e_0 = 0``, ``e_i = start·factor^(i-1)``
  for ``1 <= i <= count - 1`` and ``e_count = ∞``.
* :class:`CustomBuckets` ``(edges)``: the given strictly increasing edges.

**Values outside the range are clamped**: a counter below ``e_0`` falls in bucket 0 and one
at or above the last finite edge in bucket ``count - 1``. A counter that overflows the
range most likely belongs to the top bucket's population, and dropping it would bias the
histogram; the clamping is part of the published bucketing, so the estimate's meaning is
"fraction of devices whose clamped counter falls in the bucket". Negative values, NaN
and infinities are not counters and raise :class:`~protocol.errors.InputError`.

**Exact edges.** An edge is the float64 nearest to its exact value (linear edges are
computed in rational arithmetic, exponential ones as exact integers when ``start`` and
``factor`` are integers and with 60-digit decimals otherwise), and a value ``x`` is in
bucket ``i`` exactly when ``e_i <= x < e_{i+1}`` with the comparison made exactly (Python
compares ``int`` with ``float`` exactly). So ``LinearBuckets(low=0, high=1, count=10)`` puts
``0.3`` in bucket 3 (there is no ``0.1 * 3 = 0.30000000000000004`` drift) and integer
counters meet integer edges exactly. Edges are limited to ``[0, 2**53]``, where every
integer is a float64.

This module is what a device needs (pure Python): the edges and :meth:`bucket_of` for one
value. Bucketing many values at once, with the same answers, is the server's
(:func:`protocol.server.buckets.buckets_of`, numpy).
"""

from __future__ import annotations

import bisect
import itertools
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Context, Decimal
from fractions import Fraction
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from protocol.errors import InputError, ParameterError
from protocol.plain import PlainDoc

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "MAX_BUCKETS",
    "MAX_EDGE",
    "Buckets",
    "CustomBuckets",
    "ExponentialBuckets",
    "LinearBuckets",
    "buckets_from_plain",
]

MAX_BUCKETS = 65_536
"""Largest number of buckets (a bucket index then fits in 16 bits)."""

MAX_EDGE = 1 << 53
"""Largest finite edge: every integer up to it is exactly a float64."""

_DECIMAL = Context(prec=60)


def _number(value: object, name: str, allowed: str) -> float:
    """``value`` if it is a finite ``int`` or ``float`` (not ``bool``); a ParameterError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParameterError(name, allowed, value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ParameterError(name, allowed, value)
    return value


def _number_within(value: object, name: str, allowed: str, within: Callable[[float], bool]) -> float:
    """``value`` if it is a finite number (as :func:`_number`) for which ``within`` holds; a
    ParameterError naming ``allowed`` otherwise."""
    number = _number(value, name, allowed)
    if not within(number):
        raise ParameterError(name, allowed, value)
    return number


def _count(value: object, name: str = "count") -> int:
    allowed = f"an integer in [2, {MAX_BUCKETS}]"
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= MAX_BUCKETS:
        raise ParameterError(name, allowed, value)
    return value


def _counter_value(value: object) -> int | float:
    """A counter value as an exact Python number, or InputError."""
    # A numpy integer or float scalar counts as the Python number it holds; it is recognised by
    # its type's module, so that a device, which has no numpy, never imports it.
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and isinstance(value, numbers.Real) and callable(item):
        value = item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"a counter value is a finite non-negative number; got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"a counter value is a finite non-negative number; got {value!r}")
    if value < 0:
        raise InputError(f"a counter value is a finite non-negative number; got {value!r}")
    return value


class _Bucketing:
    """Shared bucket lookup over ``edges`` (a tuple of ``count + 1`` numbers)."""

    kind: ClassVar[str]

    if TYPE_CHECKING:
        # Declared for the type checker only: a subclass's edges are a computed property or a
        # dataclass field, and a real property here would become that field's default.
        @property
        def edges(self) -> tuple[float, ...]: ...

    @cached_property
    def interior(self) -> tuple[float, ...]:
        """The interior edges ``e_1 .. e_{count-1}``: the number of them at or below ``x`` is
        ``x``'s (clamped) bucket."""
        return tuple(self.edges[1:-1])

    def bucket_of(self, value: float | np.integer[Any] | np.floating[Any]) -> int:
        """The bucket of one counter value (clamped into ``[0, count - 1]``).

        Raises:
            InputError: for a negative, NaN or infinite value, or a non-number.
        """
        return bisect.bisect_right(self.interior, _counter_value(value))


def _check_edges_distinct(edges: Sequence[float], name: str, got: object) -> None:
    if any(b <= a for a, b in itertools.pairwise(edges)):
        raise ParameterError(name, "small enough that every bucket edge is a distinct float64", got)


@dataclass(frozen=True, kw_only=True)
class LinearBuckets(_Bucketing):
    """``count`` buckets of equal width on ``[low, high)``; values outside are clamped.

    Args:
        low: the lower edge, a number in ``[0, 2**53)``.
        high: the upper edge, a number in ``(low, 2**53]``.
        count: the number of buckets, an integer in ``[2, 65536]``.
    """

    kind: ClassVar[str] = "linear"
    low: float
    high: float
    count: int

    def __post_init__(self) -> None:
        low = _number_within(self.low, "low", f"a finite number in [0, {MAX_EDGE})", lambda x: 0 <= x < MAX_EDGE)
        _number_within(self.high, "high", f"a finite number in ({low!r}, {MAX_EDGE}]", lambda x: low < x <= MAX_EDGE)
        _count(self.count)
        _check_edges_distinct(self.edges, "count", self.count)

    @cached_property
    def edges(self) -> tuple[float, ...]:
        """``low + i·(high - low)/count`` for ``i = 0..count``, each the float64 nearest the exact value."""
        low, high = Fraction(self.low), Fraction(self.high)
        width = (high - low) / self.count
        return tuple(_exact_float(low + i * width) for i in range(self.count + 1))

    def to_plain(self) -> PlainDoc:
        """``{"kind": "linear", "low": ..., "high": ..., "count": ...}``."""
        return {"kind": self.kind, "low": self.low, "high": self.high, "count": self.count}


@dataclass(frozen=True, kw_only=True)
class ExponentialBuckets(_Bucketing):
    """``[0, start)``, ``[start, start·factor)``, …, ``[start·factor^(count-2), ∞)``.

    Args:
        start: the upper edge of the first bucket, a number in ``(0, 2**53]``.
        factor: the ratio of consecutive edges, a number ``> 1``.
        count: the number of buckets, an integer in ``[2, 65536]``; the last finite edge
            ``start·factor^(count-2)`` must not exceed ``2**53``.
    """

    kind: ClassVar[str] = "exponential"
    start: float
    factor: float
    count: int

    def __post_init__(self) -> None:
        start = _number_within(self.start, "start", f"a finite number in (0, {MAX_EDGE}]", lambda x: 0 < x <= MAX_EDGE)
        factor = _number_within(self.factor, "factor", "a finite number > 1", lambda x: x > 1)
        _count(self.count)
        # The last finite edge start·factor^(count-2) must stay <= 2**53 (checked in logs
        # first so a huge count does not build a huge number).
        top_log = math.log(start) + (self.count - 2) * math.log(factor)
        if top_log > math.log(MAX_EDGE) + 1e-9 or self.edges[-2] > MAX_EDGE:
            raise ParameterError("count", f"small enough that start·factor^(count-2) <= {MAX_EDGE} (2**53)", self.count)
        _check_edges_distinct(self.edges[:-1], "factor", self.factor)

    @cached_property
    def edges(self) -> tuple[float, ...]:
        """``(0, start, start·factor, …, start·factor^(count-2), inf)``."""
        finite: list[float] = [0.0]
        if _is_integral(self.start) and _is_integral(self.factor):
            # Exact integers (<= 2**53 after validation, so exact as float64 too).
            s, f = int(self.start), int(self.factor)
            finite += [float(s * f**i) for i in range(self.count - 1)]
        else:
            s_dec, f_dec = Decimal(self.start), Decimal(self.factor)
            value = s_dec
            for _ in range(self.count - 1):
                finite.append(float(value))
                value = _DECIMAL.multiply(value, f_dec)
        return (*finite, math.inf)

    def to_plain(self) -> PlainDoc:
        """``{"kind": "exponential", "start": ..., "factor": ..., "count": ...}``."""
        return {"kind": self.kind, "start": self.start, "factor": self.factor, "count": self.count}


@dataclass(frozen=True, kw_only=True)
class CustomBuckets(_Bucketing):
    """Buckets ``[edges[i], edges[i+1])`` for given strictly increasing edges.

    Args:
        edges: at least 3 and at most 65537 strictly increasing finite numbers in
            ``[0, 2**53]`` (``count = len(edges) - 1`` buckets).
    """

    kind: ClassVar[str] = "custom"
    edges: tuple[float, ...]

    def __post_init__(self) -> None:
        allowed = f"a list of 3 to {MAX_BUCKETS + 1} strictly increasing finite numbers in [0, {MAX_EDGE}]"
        raw = self.edges
        if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
            raise ParameterError("edges", allowed, raw)
        values = tuple(raw)
        if not 3 <= len(values) <= MAX_BUCKETS + 1:
            raise ParameterError("edges", allowed, raw)
        for i, e in enumerate(values):
            _number_within(e, f"edges[{i}]", f"a finite number in [0, {MAX_EDGE}]", lambda x: 0 <= x <= MAX_EDGE)
        for i in range(1, len(values)):
            if not values[i] > values[i - 1]:
                raise ParameterError(f"edges[{i}]", f"greater than edges[{i - 1}] = {values[i - 1]!r}", values[i])
        object.__setattr__(self, "edges", values)

    @property
    def count(self) -> int:
        """The number of buckets, ``len(edges) - 1``."""
        return len(self.edges) - 1

    def to_plain(self) -> PlainDoc:
        """``{"kind": "custom", "edges": [...]}``."""
        return {"kind": self.kind, "edges": list(self.edges)}


Buckets: TypeAlias = LinearBuckets | ExponentialBuckets | CustomBuckets
"""Any bucketing."""


def _exact_float(x: Fraction) -> float:
    # Fraction.__float__ rounds correctly (to nearest) for these magnitudes.
    return float(x)


def _is_integral(x: float) -> bool:
    return isinstance(x, int) or (isinstance(x, float) and x.is_integer())


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()

_FIELDS: dict[str, tuple[str, ...]] = {
    "linear": ("low", "high", "count"),
    "exponential": ("start", "factor", "count"),
    "custom": ("edges",),
}


def buckets_from_plain(data: object) -> Buckets:
    """A bucketing from its plain form (``to_plain``), e.g. a registry entry.

    ``{"kind": "linear", "low": 0, "high": 86400, "count": 32}``,
    ``{"kind": "exponential", "start": 60, "factor": 2, "count": 12}`` or
    ``{"kind": "custom", "edges": [0, 60, 600, 3600]}``.

    Raises:
        ParameterError: naming the field: not a mapping (``buckets``), a missing or unknown
            ``kind``, a missing or unexpected field, or a field of the wrong type or range.
    """
    kinds = ", ".join(repr(k) for k in _FIELDS)
    if not isinstance(data, dict):
        raise ParameterError("buckets", f"a mapping with a 'kind' key ({kinds})", data)
    kind = data.get("kind", _MISSING)
    if kind is _MISSING:
        raise ParameterError("kind", f"present, one of {kinds}", kind)
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise ParameterError("kind", f"one of {kinds}", kind)
    fields = _FIELDS[kind]
    for key in data:
        if key != "kind" and key not in fields:
            raise ParameterError(str(key), f"absent: {kind} buckets take only {', '.join(fields)}", data[key])
    for key in fields:
        if key not in data:
            raise ParameterError(key, f"present: {kind} buckets take {', '.join(fields)}", _MISSING)
    if kind == "linear":
        return LinearBuckets(low=data["low"], high=data["high"], count=data["count"])
    if kind == "exponential":
        return ExponentialBuckets(start=data["start"], factor=data["factor"], count=data["count"])
    edges = data["edges"]
    if not isinstance(edges, list | tuple):
        raise ParameterError("edges", "a list of strictly increasing numbers", edges)
    return CustomBuckets(edges=tuple(edges))
