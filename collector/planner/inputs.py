"""What every planner shares: its error, its result type, and the checks on the command line's numbers."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from protocol.errors import ParameterError

__all__ = ["PlanError", "Result", "build", "ceil_n", "need", "positive"]

Result = dict[str, Any]
"""A plan: the parameters and what they give, by name, plus ``formulas`` (and ``solved``,
``options``). Any: a printed row of numbers, strings and lists, one shape per subcommand,
that goes only to the planner's text and JSON output."""

T = TypeVar("T")


class PlanError(ValueError):
    """A plan cannot be made from the given inputs (the message says what to change)."""


def need(value: float | int | None, name: str) -> float:
    """``value`` as a float, or a PlanError naming the option ``--name`` when it was not given."""
    if value is None:
        raise PlanError(f"--{name.replace('_', '-')} is required here")
    return float(value)


def positive(value: float | int | None, name: str) -> None:
    """Refuse a given ``--name`` that is not a finite positive number."""
    if value is not None and not (math.isfinite(float(value)) and float(value) > 0):
        raise PlanError(f"--{name.replace('_', '-')} must be a positive number; got {value!r}")


def ceil_n(x: float) -> int:
    """The smallest whole number of reports at least ``x`` (a PlanError when ``x`` is not finite)."""
    if not math.isfinite(x):
        raise PlanError("the target cannot be reached with these parameters at any n")
    return max(1, math.ceil(x - 1e-9))


def build(make: Callable[[], T]) -> T:
    """A mechanism built from the command line's numbers; its own refusal becomes a PlanError."""
    try:
        return make()
    except (ParameterError, ValueError) as exc:
        raise PlanError(str(exc)) from None
