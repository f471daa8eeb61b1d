"""Basic RAPPOR decoded directly, and candidate files (split from :mod:`collector.decoding.rappor`,
which re-exports both).

**The basic variants** (004 §2.1) need no regression: category ``i`` has count ``Σ_j t_ij``
(:meth:`RapporAggregate.estimate_categories`, 004 Appendix ``T̂_i = (C_i - pN)/(q - p)``),
tested with the release rule (:mod:`collector.decoding.release`); :func:`decode_categories`.
**Candidate files** hold the strings the Bloom-filter variants are decoded against, one per
line; :func:`load_candidates`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from collector.decoding.arrays import Array, BoolArray
from collector.decoding.consistency import ConsistentEstimate, make_consistent
from collector.decoding.release import Release, ReleaseRule, release
from protocol.server.estimate import VectorEstimate
from protocol.server.rappor import RapporAggregate

__all__ = ["CategoryDecoding", "decode_categories", "load_candidates"]


def load_candidates(path: str | Path) -> list[str]:
    """Candidate strings from a UTF-8 text file, one per line.

    Blank lines are skipped and a trailing newline (``\\n`` or ``\\r\\n``) is not part of a
    candidate; other whitespace is kept (a candidate may contain spaces).

    Raises:
        ValueError: if a candidate occurs twice (naming it and its lines).
    """
    seen: dict[str, int] = {}
    out: list[str] = []
    with open(path, encoding="utf-8", newline="") as fh:
        for number, line in enumerate(fh, start=1):
            value = line.rstrip("\r\n") if line.endswith("\n") else line
            if not value:
                continue
            if value in seen:
                raise ValueError(f"{path}: candidate {value!r} on line {number} repeats line {seen[value]}")
            seen[value] = number
            out.append(value)
    return out


@dataclass(frozen=True, eq=False)
class CategoryDecoding:
    """Direct decoding of the basic variants: a count per category.

    Attributes:
        categories: the category strings (bit ``i`` is category ``i``).
        estimate: counts with standard errors (``Σ_j t_ij``).
        z: test statistics ``(count - max(T, 0)) / SE``; ``p_values``: their one-sided p-values.
        detected: released by the rule (threshold and corrected test).
        consistent: the counts projected to be non-negative and sum to ``n``, when asked for.
        detail: every category with the rule's verdict (:mod:`collector.decoding.release`).
    """

    categories: tuple[str, ...]
    estimate: VectorEstimate
    z: Array
    p_values: Array
    detected: BoolArray
    control: str
    alpha: float
    consistent: ConsistentEstimate | None
    detail: Release


def decode_categories(
    aggregate: RapporAggregate,
    *,
    alpha: float = 0.05,
    control: str = "bonferroni",
    consistent: bool = False,
    rule: ReleaseRule | None = None,
) -> CategoryDecoding:
    """Decode basic (one-time) RAPPOR directly: category counts, the release rule, optional consistency.

    Args:
        aggregate: the reports.
        alpha: level of the test of ``count > 0`` when no ``rule`` is given.
        control: its correction.
        consistent: also project the counts onto non-negative values summing to ``n``.
        rule: the use case's release rule (threshold, test, ``min_reports``); it overrides
            ``alpha`` and ``control``.

    Raises:
        ParameterError: for the Bloom-filter variants (use :class:`RapporDecoder`).
    """
    if rule is None:
        rule = ReleaseRule(threshold=0.0, alpha=alpha, control=control)
    est = aggregate.estimate_categories()
    names = aggregate.mechanism.categories or tuple(str(i) for i in range(len(est)))
    detail = release(names, est.values, est.standard_errors, n=aggregate.n, rule=rule)
    cons = make_consistent(est, total=float(aggregate.n)) if consistent else None
    return CategoryDecoding(
        categories=aggregate.mechanism.categories,
        estimate=est,
        z=detail.z,
        p_values=detail.p_values,
        detected=detail.released,
        control=rule.control,
        alpha=rule.alpha if rule.alpha is not None else math.nan,
        consistent=cons,
        detail=detail,
    )
