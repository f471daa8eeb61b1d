"""Exact checks of the ε-LDP inequality over a finite output space."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

TOLERANCE = 1e-9


def max_log_ratio(distributions: Sequence[Mapping[Any, Fraction]]) -> float:
    """``max over inputs v, v' and outputs o of ln(Pr[o | v] / Pr[o | v'])``.

    Each mapping is one input's exact output distribution; outputs missing from a mapping
    have probability 0. Infinite if some output is possible under one input only.
    """
    outputs = set().union(*(d.keys() for d in distributions))
    worst = 0.0
    for o in outputs:
        probs = [d.get(o, Fraction(0)) for d in distributions]
        hi, lo = max(probs), min(probs)
        if hi == 0:
            continue
        if lo == 0:
            return math.inf
        worst = max(worst, math.log(hi / lo))
    return worst


def assert_tight_ldp(distributions: Sequence[Mapping[Any, Fraction]], epsilon: float) -> None:
    """The ratio never exceeds ``e**ε`` and reaches it (within 1e-9, relative)."""
    for d in distributions:
        assert sum(d.values()) == 1, "an output distribution must sum to exactly 1"
    worst = max_log_ratio(distributions)
    assert worst <= epsilon + TOLERANCE, f"leaks more than ε: ln ratio {worst!r} > {epsilon!r}"
    assert worst >= epsilon - TOLERANCE, f"bound not tight: ln ratio {worst!r} < {epsilon!r}"
