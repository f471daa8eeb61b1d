"""Dictionary queries on CMS/HCMS sketches (003 Alg. 4) and SFP word discovery (003 Alg. 10).

**Dictionary queries.** :func:`query_dictionary` estimates the count of every entry of a
dictionary (hundreds of thousands of entries at the deployed sizes, 003 §6.3-6.4) with
:meth:`CMSAggregate.estimate_fingerprints` / :meth:`HCMSAggregate.estimate_fingerprints`
(003 Alg. 4, gathered over the whole dictionary in blocks, so memory stays bounded), each
with the standard error of 003 Thm 4.2 / 4.4 (the exact variance before the bound, with
plug-ins; see :mod:`protocol.cms` and :mod:`protocol.hcms`). An entry is *released* when

* its estimated count is at least ``threshold`` (003 §3.2.2: the published histograms keep
  only the entries above a threshold), and
* if ``alpha`` is given, it passes the multiple-testing correction (one-sided
  ``count > 0``, over the whole dictionary; :mod:`collector.decoding.stats`).

The others are withheld and only their number is reported. The top-N list is the
released entries by decreasing count. Every released number comes with its SE and a
normal confidence interval (the estimate is a sum over ``n`` independent reports).

**Word discovery.** :func:`discover_words` runs 003 Alg. 10 (:func:`protocol.sfp.reconstruct`:
the top ``T`` (puzzle piece, fragment) pairs per position, their Cartesian products per
piece, the word oracle on the assembled dictionary) and releases the assembled words by the
same rule, the correction running over every word the puzzle assembled (the dictionary
Alg. 10 step 15 queries). Each word carries the word sketch's CMS standard error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from collector.decoding.plain import ValueEstimate, finite
from collector.decoding.stats import check_control, check_level, normal_sf, reject, z_interval
from protocol.cms import CMSAggregate, as_value_bytes
from protocol.hcms import HCMSAggregate
from protocol.sfp import SFPAggregate, reconstruct

__all__ = ["FrequencyEntry", "FrequencyRelease", "discover_words", "query_dictionary"]

Array = npt.NDArray[np.float64]

_BLOCK = 1 << 16
"""Dictionary entries fingerprinted and gathered per step."""


class FrequencyEntry(ValueEstimate):
    """A released dictionary entry or discovered word with its estimated count (fields: :class:`ValueEstimate`)."""


@dataclass(frozen=True, eq=False)
class FrequencyRelease:
    """What a dictionary query or a word discovery releases.

    Attributes:
        entries: the released values, largest count first (at most ``top_n``).
        tested: the number of values estimated (dictionary size, or words assembled).
        released: how many passed the release rule (before the ``top_n`` cut).
        withheld: ``tested - released``.
        n: number of reports.
        threshold: the count threshold of the release rule.
        alpha: level of the correction, or ``None`` when no test was applied.
        control: the correction (``"bonferroni"``, ``"bh"``, ``"storey"``) or ``None``.
        confidence: level of the intervals.
    """

    entries: list[FrequencyEntry]
    tested: int
    released: int
    withheld: int
    n: int
    threshold: float
    alpha: float | None
    control: str | None
    confidence: float

    def to_plain(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "entries": [e.to_plain() for e in self.entries],
            "tested": self.tested,
            "released": self.released,
            "withheld": self.withheld,
            "n": self.n,
            "threshold": finite(self.threshold),
            "alpha": self.alpha,
            "control": self.control,
            "confidence": self.confidence,
        }


@dataclass(frozen=True, kw_only=True)
class _Rule:
    """The release rule of one query or discovery.

    Checked on construction, which the public functions do first, so a bad rule fails
    before the dictionary gather or the puzzle reconstruction is paid for.

    Attributes:
        threshold: the smallest estimated count released (003 §3.2.2).
        alpha: level of the correction, or ``None`` for the count threshold only.
        control: the correction (checked even when ``alpha`` is ``None``).
        top_n: release at most this many values, or ``None``.
        confidence: level of the intervals.
    """

    threshold: float
    alpha: float | None
    control: str
    top_n: int | None
    confidence: float

    def __post_init__(self) -> None:
        if self.alpha is None:
            check_control(self.control)
        else:
            check_level(self.alpha, self.control)
        top_n = self.top_n
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
            raise ValueError(f"top_n must be a non-negative integer or None; got {top_n!r}")
        z_interval(self.confidence)


def _release(values: Sequence[str | bytes], counts: Array, ses: Array, *, n: int, rule: _Rule) -> FrequencyRelease:
    zc = z_interval(rule.confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(ses > 0, counts / ses, np.where(counts > 0, np.inf, 0.0))
    z = np.nan_to_num(z, nan=0.0)
    p = normal_sf(z)
    keep = np.nan_to_num(counts, nan=-np.inf) >= rule.threshold
    if rule.alpha is not None:
        keep &= reject(p, alpha=rule.alpha, control=rule.control)
    idx = np.flatnonzero(keep)
    idx = idx[np.argsort(-counts[idx], kind="stable")]
    released = int(idx.size)
    if rule.top_n is not None:
        idx = idx[: rule.top_n]
    entries = [
        FrequencyEntry(
            value=values[i],
            count=float(counts[i]),
            standard_error=float(ses[i]),
            low=float(counts[i] - zc * ses[i]),
            high=float(counts[i] + zc * ses[i]),
            z=float(z[i]),
            p_value=float(p[i]),
        )
        for i in idx.tolist()
    ]
    return FrequencyRelease(
        entries=entries,
        tested=len(values),
        released=released,
        withheld=len(values) - released,
        n=n,
        threshold=rule.threshold,
        alpha=rule.alpha,
        control=rule.control if rule.alpha is not None else None,
        confidence=rule.confidence,
    )


def query_dictionary(
    aggregate: CMSAggregate | HCMSAggregate,
    dictionary: Sequence[str | bytes],
    *,
    threshold: float = -math.inf,
    alpha: float | None = None,
    control: str = "bonferroni",
    top_n: int | None = None,
    confidence: float = 0.95,
    workers: int | None = None,
) -> FrequencyRelease:
    """Estimate every dictionary entry (003 Alg. 4) and release those that pass the rule.

    Args:
        aggregate: a CMS or HCMS aggregate.
        dictionary: the entries to query (``str`` or ``bytes``).
        threshold: the smallest estimated count released (003 §3.2.2).
        alpha: if given, also require significance at this level under ``control``.
        control: ``"bonferroni"``, ``"bh"`` or ``"storey"``, over the whole dictionary.
        top_n: release at most this many entries (the largest).
        confidence: level of the intervals.
        workers: threads for the gather (default: all CPUs).

    Raises:
        InputError: if an entry is neither ``str`` nor ``bytes``.
    """
    rule = _Rule(threshold=threshold, alpha=alpha, control=control, top_n=top_n, confidence=confidence)
    size = len(dictionary)
    counts = np.empty(size)
    ses = np.empty(size)
    family = aggregate.mechanism.family
    for start in range(0, size, _BLOCK):
        block = [as_value_bytes(v) for v in dictionary[start : start + _BLOCK]]
        est = aggregate.estimate_fingerprints(family.fingerprints(block), workers=workers)
        counts[start : start + len(block)] = est.values
        ses[start : start + len(block)] = est.standard_errors
    return _release(dictionary, counts, ses, n=aggregate.n, rule=rule)


def discover_words(
    aggregate: SFPAggregate,
    *,
    alphabet: str | Sequence[str],
    top_t: int,
    threshold: float = -math.inf,
    alpha: float | None = 0.05,
    control: str = "bonferroni",
    top_n: int | None = None,
    confidence: float = 0.95,
    max_words: int = 2_000_000,
    workers: int | None = None,
) -> FrequencyRelease:
    """Discover frequent unknown words (003 Alg. 10) and release those that pass the rule.

    Args:
        aggregate: the SFP reports.
        alphabet: the characters words are made of (include the space that pads short words).
        top_t: ``T``, (puzzle piece, fragment) pairs kept per position (003 Alg. 10 step 10).
        threshold: the smallest estimated word count released.
        alpha: significance level over all assembled words (``None``: count threshold only).
        control: ``"bonferroni"``, ``"bh"`` or ``"storey"``.
        top_n: release at most this many words.
        confidence: level of the intervals.
        max_words: refuse to score more assembled words than this (``ValueError``).
        workers: threads for the dictionary queries.
    """
    rule = _Rule(threshold=threshold, alpha=alpha, control=control, top_n=top_n, confidence=confidence)
    found = reconstruct(
        aggregate,
        alphabet=alphabet,
        top_t=top_t,
        threshold=-math.inf,
        max_words=max_words,
        workers=workers,
    )
    words = [w.word for w in found]
    counts = np.array([w.count for w in found], dtype=np.float64)
    ses = np.array([w.standard_error for w in found], dtype=np.float64)
    return _release(words, counts, ses, n=aggregate.n, rule=rule)
