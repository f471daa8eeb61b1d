"""Parameter validation shared by the mechanisms: one place, one message format."""

from __future__ import annotations

import math

from protocol.errors import ParameterError

__all__ = ["check_epsilon", "check_int", "check_power_of_two", "check_probability", "check_seed"]

EPSILON_MAX = 64.0
"""Largest accepted ε. Beyond it a report is practically the raw value and e**ε overflows coins."""


def check_epsilon(value: float, name: str = "epsilon") -> float:
    """ε must be a finite number in (0, 64]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ParameterError(name, f"a finite number in (0, {EPSILON_MAX:g}]", value)
    if not 0 < value <= EPSILON_MAX:
        raise ParameterError(name, f"in (0, {EPSILON_MAX:g}]", value)
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
