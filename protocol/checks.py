"""Validation shared by the mechanisms: one place, one message format.

Two kinds, kept apart by who is at fault (docs/design.md, convention 7): a mechanism's parameters (a
caller's mistake, :class:`~protocol.errors.ParameterError`) and the records a report
carries (hostile or malformed input, :class:`~protocol.errors.MalformedReportError` with
a reason and the field). The record checks serve the mechanisms whose record is
``[index, packed bits]`` (CMS ``[j, bits]``, RAPPOR ``[cohort, bits]``, and SFP's two CMS
halves), so their decoders refuse the same faults with the same reasons. Saved state and
saved aggregates that do not fit raise :class:`~protocol.errors.StateError` (:func:`require`).
"""

from __future__ import annotations

import math
from typing import Any

import msgpack

from protocol.errors import InputError, MalformedReportError, ParameterError, StateError

__all__ = [
    "EPSILON_MIN_MULTI",
    "check_epsilon",
    "check_indexed_bits",
    "check_int",
    "check_packed_bits",
    "check_power_of_two",
    "check_probability",
    "check_seed",
    "count_value",
    "encoded_size",
    "number_value",
    "parse_number",
    "require",
    "string_value",
]

EPSILON_MAX = 64.0
"""Largest accepted ε. Beyond it a report is practically the raw value and e**ε overflows coins."""


EPSILON_MIN_MULTI = 1e-9
"""Smallest ε of a mechanism that reports one of several outputs with probabilities near ``1/k``
(the frequency oracles): below it the coins' ``2**-64`` rounding is no longer small against the
gap between the own output's probability and the others', and a count's variance overflows."""


def check_epsilon(value: float, name: str = "epsilon", *, low: float = 0.0) -> float:
    """ε must be a finite number in (0, 64] (at least ``low`` when one is given)."""
    allowed = f"in (0, {EPSILON_MAX:g}]" if low == 0 else f"in [{low:g}, {EPSILON_MAX:g}]"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ParameterError(name, f"a finite number {allowed}", value)
    if not (0 < value <= EPSILON_MAX and value >= low):
        raise ParameterError(name, allowed, value)
    return float(value)


def check_int(value: int, name: str, *, low: int, high: int | None = None) -> int:
    """An integer in ``[low, high]`` (``high`` None: unbounded)."""
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParameterError(name, allowed, value)
    if value < low or (high is not None and value > high):
        raise ParameterError(name, allowed, value)
    return value


def check_power_of_two(value: int, name: str, *, low: int = 1, high: int = 1 << 32) -> int:
    """A power of two in ``[low, high]``."""
    allowed = f"a power of two in [{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, int) or value < low or value > high or value & (value - 1):
        raise ParameterError(name, allowed, value)
    return value


def check_probability(value: float, name: str, *, low_open: bool = False, high_open: bool = False) -> float:
    """A probability in [0, 1] (either end optionally excluded)."""
    lo = "(" if low_open else "["
    hi = ")" if high_open else "]"
    allowed = f"a number in {lo}0, 1{hi}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ParameterError(name, allowed, value)
    if value < 0 or value > 1 or (low_open and value == 0) or (high_open and value == 1):
        raise ParameterError(name, allowed, value)
    return float(value)


def check_seed(value: bytes, name: str = "seed") -> bytes:
    """A public hash seed: at least 16 bytes."""
    if not isinstance(value, bytes) or len(value) < 16:
        raise ParameterError(name, "bytes of length >= 16", value)
    return value


def check_indexed_bits(
    index: object, bits: object, *, bound: int, width: int, field: str, index_name: str = "index"
) -> tuple[int, bytes]:
    """Check one record's wire parts ``(index, bits)`` strictly; return them typed.

    Args:
        index: must be an ``int`` (not a ``bool``) in ``[0, bound)``.
        bits: must be ``bytes`` holding exactly ``width`` bits, packed (``ceil(width / 8)``
            bytes) with the unused low bits of the last byte zero, as ``np.packbits`` writes
            them. Non-zero padding is refused rather than masked: a correct client never
            sends it, so it marks a forged or corrupted record.
        bound: the number of allowed index values.
        width: the number of bits.
        field: the record's path, such as ``records[3]``.
        index_name: the index's name under ``field`` (``index``, ``cohort``).

    Raises:
        MalformedReportError: ``bad-type``, ``out-of-range``, ``bad-length`` or ``bad-padding``,
            naming ``{field}.{index_name}`` or ``{field}.bits``.
    """
    # type() rather than isinstance(): bool is an int subclass and is not an index.
    if type(index) is not int:
        raise MalformedReportError("bad-type", f"{field}.{index_name}", "expected an integer")
    if not 0 <= index < bound:
        raise MalformedReportError("out-of-range", f"{field}.{index_name}", f"must lie in [0, {bound})")
    return index, check_packed_bits(bits, width=width, field=f"{field}.bits")


def check_packed_bits(bits: object, *, width: int, field: str) -> bytes:
    """``bits`` as ``bytes`` holding exactly ``width`` packed bits with zero padding, strictly.

    The unused low bits of the last byte must be zero, as ``np.packbits`` writes them: a
    correct client never sends others, so they mark a forged or corrupted record.

    Raises:
        MalformedReportError: ``bad-type``, ``bad-length`` or ``bad-padding``, naming ``field``.
    """
    if type(bits) is not bytes:
        raise MalformedReportError("bad-type", field, "expected bytes")
    nbytes = (width + 7) // 8
    if len(bits) != nbytes:
        raise MalformedReportError("bad-length", field, f"expected {nbytes} bytes, got {len(bits)}")
    pad = 8 * nbytes - width
    if pad and bits[-1] & ((1 << pad) - 1):
        raise MalformedReportError("bad-padding", field, f"the last {pad} bits must be zero")
    return bits


def require(data: object, key: str, kind: type | tuple[type, ...], *, where: str) -> Any:
    """``data[key]``, checked to be a ``kind``; a clear :class:`StateError` otherwise (saved
    state and aggregates in plain form: a device's state is checked with it, so it is here,
    in pure Python, rather than with the server's array forms)."""
    if not isinstance(data, dict):
        raise StateError(f"{where}: expected a mapping, got {type(data).__name__}")
    if key not in data:
        raise StateError(f"{where}: missing field {key!r}")
    value = data[key]
    if isinstance(value, bool) and kind is int:
        raise StateError(f"{where}.{key}: expected int, got bool")
    if not isinstance(value, kind):
        raise StateError(f"{where}.{key}: expected {kind}, got {type(value).__name__}")
    return value


# --- recorded values (the agent's ``record``) ----------------------------------------------
# An InputError here completes the sentence "use case NAME (MECHANISM) ...": what the use
# case takes, and what was found.

MAX_COUNTER = float(1 << 53)
"""Largest counter value or total kept (beyond it floats lose integers)."""


def count_value(value: object, m: int) -> int:
    """A recorded increment of a count (1BitMean's input, 000 §2.1): an integer in ``[0, 2**53]``.

    An increment above ``m`` is taken: the period's total is clipped to ``m`` when it is
    privatized (``counter_input``), the one rule every counter follows beyond its range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"counts integers; got {value!r}")
    _in_counter_range(value)
    if not isinstance(value, int):
        raise InputError(f"counts integers; got {value!r}")
    return value


def number_value(value: object) -> int | float:
    """A finite non-negative number up to ``2**53`` (a counter that is bucketed, 000 §2.2)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"counts numbers; got {value!r}")
    return _in_counter_range(value)


def _in_counter_range(value: int | float) -> int | float:
    if not math.isfinite(value) or value < 0 or value > MAX_COUNTER:
        raise InputError(f"takes counter increments: {value!r} is out of range [0, 2**53]")
    return value


def parse_number(text: str, *, integer: bool) -> int | float:
    """A number typed on a command line (an integer only, if ``integer``: ``1e3`` is 1000)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        raise InputError(f"counts numbers; got {text!r}") from None
    if integer and number.is_integer() and abs(number) <= MAX_COUNTER:
        return int(number)
    return number  # check_value then says what is wrong with it (not an integer, out of range)


def string_value(value: object, *, accept_bytes: bool = False) -> str | bytes:
    """A string (or bytes, if the mechanism hashes bytes too)."""
    if isinstance(value, str) or (accept_bytes and isinstance(value, bytes)):
        return value
    raise InputError(f"takes a string; got {value!r}")


def encoded_size(wire_form: object) -> int:
    """Bytes of ``wire_form`` in msgpack (bin for bytes), as a report carries it.

    The mechanisms give their largest record's wire form to this, so the registry can bound
    a use case's largest report from its parameters alone (``UseCase.max_report_bytes``).
    """
    return len(msgpack.packb(wire_form, use_bin_type=True))
