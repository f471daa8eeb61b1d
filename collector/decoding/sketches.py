"""Dictionary queries on CMS/HCMS sketches (003 Alg. 4) and SFP word discovery (003 Alg. 10).

**Dictionary queries.** :func:`query_dictionary` estimates the count of every entry of a
dictionary (hundreds of thousands of entries at the deployed sizes, 003 §6.3-6.4) with
:meth:`CMSAggregate.estimate_fingerprints` / :meth:`HCMSAggregate.estimate_fingerprints`
(003 Alg. 4, gathered over the whole dictionary in blocks, so memory stays bounded), each
with the standard error of 003 Thm 4.2 / 4.4 (the exact variance before the bound, with
plug-ins; see :mod:`protocol.server.cms` and :mod:`protocol.server.hcms`). An entry is
*released* by the one rule of :mod:`collector.decoding.release`: its estimated count is at
least ``threshold`` (003 §3.2.2) and, if ``alpha`` is given, it passes the one-sided test of
``count > max(threshold, 0)`` corrected over the whole dictionary. Every entry's estimate
and verdict is kept (:attr:`FrequencyRelease.detail`). The top-N list is the released
entries by decreasing count. Every released number comes with its SE and a
normal confidence interval (the estimate is a sum over ``n`` independent reports).

**Word discovery.** :func:`discover_words` runs 003 Alg. 10
(:func:`protocol.server.sfp.reconstruct`: the top ``T`` (puzzle piece, fragment) pairs per
position, their Cartesian products per piece, the word oracle on the assembled dictionary)
and releases the assembled words by the same rule, the correction running over every word the
puzzle assembled (the dictionary Alg. 10 step 15 queries) that a padded word can be: a string
with padding inside it (:func:`producible`) is withheld untested. Each word carries the word
sketch's CMS standard error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collector.decoding.plain import ValueEstimate
from collector.decoding.release import Release, ReleaseRule, release
from protocol.cms import as_value_bytes
from protocol.server.cms import CMSAggregate
from protocol.server.hashing import family_fingerprints
from protocol.server.hcms import HCMSAggregate
from protocol.server.parallel import Threads
from protocol.server.sfp import SFPAggregate, reconstruct

__all__ = [
    "NOT_PRODUCIBLE",
    "PADDING",
    "FrequencyEntry",
    "FrequencyRelease",
    "discover_words",
    "producible",
    "query_dictionary",
]

_BLOCK = 1 << 16
"""Dictionary entries fingerprinted and gathered per step."""


class FrequencyEntry(ValueEstimate):
    """A released dictionary entry or discovered word with its estimated count (fields: :class:`ValueEstimate`)."""


@dataclass(frozen=True, eq=False)
class FrequencyRelease:
    """What a dictionary query or a word discovery releases.

    Attributes:
        entries: the released values, largest count first (at most ``top_n``).
        tested: the number of values in the correction (dictionary size, or the words
            assembled that a padded word can be).
        released: how many passed the release rule (before the ``top_n`` cut).
        withheld: values estimated but not released.
        n: number of reports.
        threshold: the count threshold of the release rule.
        alpha: level of the correction, or ``None`` when no test was applied.
        control: the correction (``"bonferroni"``, ``"bh"``, ``"storey"``, ``"pfer"``) or ``None``.
        confidence: level of the intervals.
        detail: every value estimated, with the rule's verdict and reasons
            (:class:`collector.decoding.release.Release`).
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
    detail: Release


def _rule(
    *, threshold: float, alpha: float | None, control: str, top_n: int | None, confidence: float, min_reports: int = 0
) -> ReleaseRule:
    """The release rule of one query or discovery, checked before any work is paid for."""
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
        raise ValueError(f"top_n must be a non-negative integer or None; got {top_n!r}")
    return ReleaseRule(
        min_reports=min_reports, threshold=threshold, alpha=alpha, control=control, confidence=confidence
    )


def _frequency_release(detail: Release, *, top_n: int | None) -> FrequencyRelease:
    idx = detail.order(detail.released)
    released = len(idx)
    if top_n is not None:
        idx = idx[:top_n]
    entries = [FrequencyEntry(**vars(detail.entry(i))) for i in idx]
    rule = detail.rule
    return FrequencyRelease(
        entries=entries,
        tested=detail.tested,
        released=released,
        withheld=len(detail.values) - released,
        n=detail.n,
        threshold=rule.threshold,
        alpha=rule.alpha,
        control=rule.control if rule.alpha is not None else None,
        confidence=rule.confidence,
        detail=detail,
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
    min_reports: int = 0,
    threads: Threads | None = None,
) -> FrequencyRelease:
    """Estimate every dictionary entry (003 Alg. 4) and release those that pass the rule.

    Args:
        aggregate: a CMS or HCMS aggregate.
        dictionary: the entries to query (``str`` or ``bytes``).
        threshold: the smallest estimated count released (003 §3.2.2), and the null of the test.
        alpha: if given, also require the one-sided test of ``count > max(threshold, 0)`` at
            this level under ``control`` (:mod:`collector.decoding.release`).
        control: ``"bonferroni"``, ``"bh"``, ``"storey"`` or ``"pfer"``, over the whole dictionary.
        top_n: release at most this many entries (the largest).
        confidence: level of the intervals.
        min_reports: release nothing from fewer reports.
        threads: the caller's threads, the gather split between them (None: this thread alone).

    Raises:
        InputError: if an entry is neither ``str`` nor ``bytes``.
    """
    rule = _rule(
        threshold=threshold, alpha=alpha, control=control, top_n=top_n, confidence=confidence, min_reports=min_reports
    )
    size = len(dictionary)
    counts = np.empty(size)
    ses = np.empty(size)
    family = aggregate.mechanism.family
    for start in range(0, size, _BLOCK):
        block = [as_value_bytes(v) for v in dictionary[start : start + _BLOCK]]
        est = aggregate.estimate_fingerprints(family_fingerprints(family, block), threads=threads)
        counts[start : start + len(block)] = est.values
        ses[start : start + len(block)] = est.standard_errors
    detail = release(dictionary, counts, ses, n=aggregate.n, rule=rule)
    return _frequency_release(detail, top_n=top_n)


PADDING = " "
"""The character SFP pads short words with (:meth:`SequenceFragmentPuzzle.pad`)."""

NOT_PRODUCIBLE = "padding inside the word: the puzzle cannot have produced it from a padded word"
"""Why a string with padding inside it is withheld."""


def producible(word: str) -> bool:
    """Whether ``word`` (trailing padding removed) can be a padded word a device reported.

    A device pads a word on the right only (003 §4.3), so the padding character occurs only
    as a trailing run; the word itself is non-empty and free of it. An assembled string with
    padding inside it (``"  cdvlhe m"``) is fragments of different words glued together by the
    puzzle, never a word anybody typed.
    """
    return bool(word) and PADDING not in word


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
    min_reports: int = 0,
    max_words: int = 2_000_000,
    threads: Threads | None = None,
) -> FrequencyRelease:
    """Discover frequent unknown words (003 Alg. 10) and release those that pass the rule.

    Words with padding inside them (:func:`producible`) are withheld and left out of the
    correction: they are not hypotheses at all.

    Args:
        aggregate: the SFP reports.
        alphabet: the characters words are made of (include the space that pads short words).
        top_t: ``T``, (puzzle piece, fragment) pairs kept per position (003 Alg. 10 step 10).
        threshold: the smallest estimated word count released, and the null of the test.
        alpha: significance level over all assembled words (``None``: count threshold only).
        control: ``"bonferroni"``, ``"bh"``, ``"storey"`` or ``"pfer"``.
        top_n: release at most this many words.
        confidence: level of the intervals.
        min_reports: release nothing from fewer reports.
        max_words: refuse to score more assembled words than this (``TooManyWordsError``).
        threads: the caller's threads, the dictionary queries split between them (None: this thread alone).
    """
    rule = _rule(
        threshold=threshold, alpha=alpha, control=control, top_n=top_n, confidence=confidence, min_reports=min_reports
    )
    found = reconstruct(
        aggregate,
        alphabet=alphabet,
        top_t=top_t,
        threshold=-math.inf,
        max_words=max_words,
        threads=threads,
    )
    words = [w.word for w in found]
    counts = np.array([w.count for w in found], dtype=np.float64)
    ses = np.array([w.standard_error for w in found], dtype=np.float64)
    eligible = np.array([producible(w) for w in words], dtype=np.bool_)
    detail = release(words, counts, ses, n=aggregate.n, rule=rule, eligible=eligible, ineligible_reason=NOT_PRODUCIBLE)
    return _frequency_release(detail, top_n=top_n)
