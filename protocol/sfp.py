"""Sequence Fragment Puzzle (003 §4.3, Algorithms 8-10, Theorem 4.5): discovering unknown strings.

Built on two Count Mean Sketches (:mod:`protocol.cms`): one over whole words with
``(epsilon, k, m)`` and one over fragments with ``(epsilon_fragment, k_fragment, m_fragment)``.
Their hash families, and the 256-valued puzzle-piece hash ``h``, come from independent
sub-seeds ``derive_seed(seed, "sfp/word")``, ``"sfp/fragment"`` and ``"sfp/puzzle"``. The
deployed New Words parameters (003 §6.1) are ``(m, m') = (1024, 1024)``,
``(k, k') = (2048, 2048)``, ``(ε, ε') = (2, 6)``, ``length = 10``, ``fragment_length = 2``.

**Encoding.** A word is a ``str`` of Unicode characters (code points, not bytes): it is
truncated to ``length`` characters and padded on the right with spaces to exactly
``length`` (003 §4.3: "padding shorter strings with spaces and truncating longer
strings"); ``s`` below is that padded word. The word sketch hashes ``s`` as UTF-8. Fragment
positions are the 0-based offsets ``0, fragment_length, 2 fragment_length, ...`` (the
paper's 1-based ``{1, 3, 5, 7, 9}``); ``length`` must be a multiple of ``fragment_length``.
The puzzle piece is ``h(s)`` in ``[256]`` and the fragment value hashed by the fragment
sketch is the byte ``h(s)`` followed by the UTF-8 of ``s[ℓ : ℓ + fragment_length]``.

**Client (003 Alg. 9).** Draw the position index ``i`` uniform over the
``length / fragment_length`` positions (offset ``ℓ = i * fragment_length``); send
``(i, A_client-CMS(h(s) || s[ℓ : ℓ + fragment_length]; ε'), A_client-CMS(s; ε))``. On the wire
a record is ``[i, j', bits', j, bits]``: the fragment record's hash index and packed
vector, then the word record's. There is no permanent state.

**Privacy (003 Thm 4.5).** Given the word, the position and the two CMS records are drawn
independently, and the position does not depend on the word; so the likelihood ratio of
a report is the product of the two CMS ratios, at most ``e**ε' e**ε``: the report is
``(ε + ε')``-LDP. ``epsilon_report`` is the sum of the two CMS ``epsilon_report`` values
(exact for the implemented coins), and the bound is reached by two words whose fragments
and whole words hash apart in some rows.

**Server (003 Alg. 10).** Steps 1-6: one CMS aggregate of the word records, and one CMS
aggregate of the fragment records per position (each with its own ``n_ℓ``, the number of
reports that chose that position), all sharing the fragment hash family ``H'``. The word
oracle (:meth:`SFPAggregate.estimate_words`) and the fragment oracles
(:meth:`SFPAggregate.estimate_fragments`) are CMS estimates with CMS standard errors (see
:mod:`protocol.cms`); a fragment count estimates the number of reports that chose that
position and hold a word with that puzzle piece and fragment. Steps 7-15
(:func:`reconstruct`): for each position the ``top_t`` (puzzle piece, fragment) pairs with
the largest estimated counts over all ``256 x |alphabet|**fragment_length`` pairs; for each
puzzle piece ``w`` the Cartesian product of ``w``'s fragments across positions; every
assembled word is scored with the word oracle, and words at or above the threshold are
returned with their counts and standard errors.

One addition to Alg. 10: the server can recompute ``h``, so a word assembled under piece
``w`` whose own ``h`` is not ``w`` cannot have been reported by anyone through those
fragments; :func:`reconstruct` drops it before querying the word oracle (``check_puzzle``,
on by default). A true word is always assembled under its own piece, so this never loses
one; it removes about 255 of every 256 spurious combinations.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar, Final, Self

import numpy as np
import numpy.typing as npt

from protocol.checks import check_epsilon, check_int, check_seed, encoded_size
from protocol.cms import (
    K_MAX,
    M_MAX,
    CMSAggregate,
    CMSBatch,
    CMSRecord,
    CountMeanSketch,
    ScalarHash,
    check_wire_record,
)
from protocol.errors import InputError, MalformedReportError, ParameterError, StateError
from protocol.hashing import HashFamily, derive_seed
from protocol.interfaces import (
    EstimateKind,
    EventLevelStrings,
    MechanismEntry,
    Privatization,
    ValueType,
    own,
)
from protocol.randomness import SCALE, RandomSource, uniform_ints
from protocol.server.contract import Aggregate, Batch, PlanFigures
from protocol.server.estimate import VectorEstimate
from protocol.server.hashing import Fingerprints, family_fingerprints
from protocol.server.plain import require

__all__ = [
    "ENTRY",
    "PUZZLE_PIECES",
    "DiscoveredWord",
    "SFPAggregate",
    "SFPBatch",
    "SFPRecord",
    "SequenceFragmentPuzzle",
    "reconstruct",
]

PUZZLE_PIECES = 256
"""Range of the puzzle-piece hash ``h`` (003 Alg. 8: ``h : D -> [256]``)."""

LENGTH_MAX = 256
"""Longest accepted word length (the deployed length is 10)."""

_CANDIDATES_MAX = 1 << 24
_POSITION_WORDS = 5
"""Words drawn for the position; each is rejected with probability below 2**-61 (all five: draw afresh)."""


@dataclass(frozen=True, slots=True)
class SFPRecord:
    """One report: the position index, the fragment's CMS record and the word's CMS record."""

    position: int
    fragment: CMSRecord
    word: CMSRecord


@dataclass(frozen=True, eq=False)
class SFPBatch:
    """Reports in columnar form: ``positions`` (``int64``) and the two CMS batches, row-aligned."""

    positions: npt.NDArray[np.int64]
    fragment: CMSBatch
    word: CMSBatch

    def __len__(self) -> int:
        return int(self.positions.size)


@dataclass(frozen=True)
class DiscoveredWord:
    """A reconstructed word (padding removed) with its estimated count and standard error."""

    word: str
    count: float
    standard_error: float


@dataclass(frozen=True, kw_only=True)
class SequenceFragmentPuzzle(EventLevelStrings):
    """Apple's Sequence Fragment Puzzle for discovering frequent unknown words.

    Args:
        epsilon: ε of the word record, in (0, 64].
        epsilon_fragment: ε' of the fragment record, in (0, 64].
        k: hash functions of the word sketch.
        m: vector length of the word sketch.
        k_fragment: hash functions of the fragment sketch (``k'``).
        m_fragment: vector length of the fragment sketch (``m'``).
        seed: the use case's public hash seed (at least 16 bytes).
        length: characters per word after padding or truncation (default 10).
        fragment_length: characters per fragment (default 2); must divide ``length``.
    """

    name: ClassVar[str] = "sfp"
    server: ClassVar[str] = "protocol.server.contract:Unsplit"  # both halves in this class, for now
    privatization: ClassVar[Privatization] = Privatization.EVENT
    value_type: ClassVar[ValueType] = ValueType.STRING
    value_range: ClassVar[tuple[float, float] | None] = None
    kind: ClassVar[EstimateKind] = EstimateKind.DISCOVERY
    epsilon: float
    epsilon_fragment: float
    k: int
    m: int
    k_fragment: int
    m_fragment: int
    seed: bytes
    length: int = 10
    fragment_length: int = 2

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_epsilon(self.epsilon_fragment, "epsilon_fragment")
        check_int(self.k, "k", low=1, high=K_MAX)
        check_int(self.m, "m", low=2, high=M_MAX)
        check_int(self.k_fragment, "k_fragment", low=1, high=K_MAX)
        check_int(self.m_fragment, "m_fragment", low=2, high=M_MAX)
        check_seed(self.seed)
        check_int(self.length, "length", low=1, high=LENGTH_MAX)
        check_int(self.fragment_length, "fragment_length", low=1, high=self.length)
        if self.length % self.fragment_length:
            raise ParameterError("fragment_length", f"a divisor of length={self.length}", self.fragment_length)

    # ------------------------------------------------------------------ constants

    @cached_property
    def word_cms(self) -> CountMeanSketch:
        """The CMS over whole (padded) words: ``(ε, k, m)``, seed ``derive_seed(seed, "sfp/word")``."""
        return CountMeanSketch(epsilon=self.epsilon, k=self.k, m=self.m, seed=derive_seed(self.seed, "sfp/word"))

    @cached_property
    def fragment_cms(self) -> CountMeanSketch:
        """The CMS over puzzle piece + fragment: ``(ε', k', m')``, seed ``derive_seed(seed, "sfp/fragment")``."""
        return CountMeanSketch(
            epsilon=self.epsilon_fragment,
            k=self.k_fragment,
            m=self.m_fragment,
            seed=derive_seed(self.seed, "sfp/fragment"),
        )

    @cached_property
    def puzzle_family(self) -> HashFamily:
        """The one-function family of the puzzle-piece hash ``h`` into ``[256]``."""
        return HashFamily(derive_seed(self.seed, "sfp/puzzle"), count=1, range=PUZZLE_PIECES)

    @cached_property
    def _puzzle_hash(self) -> ScalarHash:
        return ScalarHash(self.puzzle_family)

    @property
    def positions(self) -> int:
        """Number of fragment positions: ``length / fragment_length`` (5 when deployed)."""
        return self.length // self.fragment_length

    @property
    def epsilon_report(self) -> float:
        """ε of one report: ``ε + ε'`` for the implemented coins (003 Thm 4.5, basic composition)."""
        return self.word_cms.epsilon_report + self.fragment_cms.epsilon_report

    def pad(self, word: str) -> str:
        """``word`` truncated or padded with spaces to exactly ``length`` characters.

        Raises:
            InputError: if ``word`` is not a ``str``.
        """
        if not isinstance(word, str):
            raise InputError(f"SFP privatizes words (str); got {type(word).__name__}")
        return word[: self.length].ljust(self.length, " ")

    def puzzle_piece(self, padded: str) -> int:
        """``h(s)`` in ``[256]`` for a padded word."""
        return self._puzzle_hash(_utf8(padded), 0)

    def fragment_value(self, piece: int, fragment: str) -> bytes:
        """The value the fragment sketch hashes: the puzzle-piece byte, then the fragment's UTF-8."""
        return bytes((piece,)) + _utf8(fragment)

    def _fragment(self, padded: str, position: int) -> str:
        start = position * self.fragment_length
        return padded[start : start + self.fragment_length]

    # ---------------------------------------------------------------- client half

    def setup(self, rng: RandomSource) -> None:
        """No permanent state: SFP privatizes each event afresh (event-level privacy)."""
        return

    def privatize(self, value: str, state: None, rng: RandomSource) -> tuple[SFPRecord, None]:
        """One report for the word ``value`` (003 Alg. 9)."""
        s = self.pad(value)
        data = _utf8(s)
        fc, wc = self.fragment_cms, self.word_cms
        # One draw for the whole report: words for the position, then each CMS report's words.
        words = rng.words(_POSITION_WORDS + fc.draw_words + wc.draw_words)
        # Step 1: the fragment position, uniform and independent of the word: the first of
        # the position words below the largest multiple of the count (exact rejection).
        count = self.positions
        limit = SCALE - SCALE % count
        accepted = [w for w in words[:_POSITION_WORDS].tolist() if w < limit]
        position = accepted[0] % count if accepted else int(uniform_ints(rng, count, 1)[0])
        # Step 2: r = h(s) || s[ℓ : ℓ + fragment_length].
        r = self.fragment_value(self._puzzle_hash(data, 0), self._fragment(s, position))
        # Step 3: two independent CMS reports (ε' for r, ε for s), from disjoint words.
        split = _POSITION_WORDS + fc.draw_words
        fragment = fc.privatize_bytes(r, rng, words=words[_POSITION_WORDS:split])
        word = wc.privatize_bytes(data, rng, words=words[split:])
        return SFPRecord(position, fragment, word), None

    def privatize_many(self, values: Sequence[str], rng: RandomSource) -> SFPBatch:
        """Privatize many words at once (the simulator's path); same distribution as :meth:`privatize`."""
        distinct: dict[str, int] = {}
        codes = np.fromiter(
            (distinct.setdefault(self.pad(v), len(distinct)) for v in values), dtype=np.int64, count=len(values)
        )
        words = list(distinct)
        pieces = [self.puzzle_piece(s) for s in words]
        # Every (distinct word, position) fragment value, so the fragment sketch fingerprints each once.
        fragment_values = [
            self.fragment_value(piece, self._fragment(word, p))
            for word, piece in zip(words, pieces, strict=True)
            for p in range(self.positions)
        ]
        positions = uniform_ints(rng, self.positions, len(values))
        frag_fp = family_fingerprints(self.fragment_cms.family, fragment_values)
        pick = codes * self.positions + positions
        word_fp = family_fingerprints(self.word_cms.family, [_utf8(s) for s in words])
        fragment = self.fragment_cms.privatize_fingerprints(Fingerprints(lo=frag_fp.lo[pick], hi=frag_fp.hi[pick]), rng)
        word = self.word_cms.privatize_fingerprints(Fingerprints(lo=word_fp.lo[codes], hi=word_fp.hi[codes]), rng)
        return SFPBatch(positions=positions, fragment=fragment, word=word)

    def output_distribution(self, value: str) -> dict[tuple[int, int, bytes, int, bytes], Fraction]:
        """Exact ``Pr[(i, j', bits', j, bits) | value]``, as the coins implement it (tiny parameters only)."""
        s = self.pad(value)
        piece = self.puzzle_piece(s)
        word = self.word_cms.output_distribution(_utf8(s))
        share = Fraction(1, self.positions)
        dist: dict[tuple[int, int, bytes, int, bytes], Fraction] = {}
        for position in range(self.positions):
            fragment = self.fragment_cms.output_distribution(self.fragment_value(piece, self._fragment(s, position)))
            for (fj, fbits), pf in fragment.items():
                for (wj, wbits), pw in word.items():
                    dist[(position, fj, fbits, wj, wbits)] = share * pf * pw
        return dist

    # ------------------------------------------------------------------- wire form

    def batch(self, records: Sequence[SFPRecord]) -> SFPBatch:
        """Records in columnar form."""
        positions = np.fromiter((r.position for r in records), dtype=np.int64, count=len(records))
        return SFPBatch(
            positions=positions,
            fragment=self.fragment_cms.batch([r.fragment for r in records]),
            word=self.word_cms.batch([r.word for r in records]),
        )

    def encode_records(self, records: Sequence[SFPRecord]) -> list[Any]:
        """The records' compact wire form: ``[i, j', bits', j, bits]`` per record."""
        return [[r.position, r.fragment.index, r.fragment.bits, r.word.index, r.word.bits] for r in records]

    @property
    def max_record_bytes(self) -> int:
        """Most bytes one record takes in a report: the last position and both CMS halves at their largest index."""
        fragment, word = self.fragment_cms, self.word_cms
        return encoded_size(
            [self.positions - 1, fragment.k - 1, bytes(fragment.record_bytes), word.k - 1, bytes(word.record_bytes)]
        )

    def decode_records(self, raw: object) -> SFPBatch:
        """Strictly decode the wire form of :meth:`encode_records`.

        Raises:
            MalformedReportError: ``bad-type``, ``bad-length``, ``out-of-range`` or
                ``bad-padding``, naming ``records[i]``, ``records[i].position``,
                ``records[i].fragment.index``, ``records[i].fragment.bits``,
                ``records[i].word.index`` or ``records[i].word.bits``.
        """
        if not isinstance(raw, list):
            raise MalformedReportError("bad-type", "records", "expected a list of [i, j', bits', j, bits]")
        n = len(raw)
        positions = np.empty(n, dtype=np.int64)
        f_idx = np.empty(n, dtype=np.int64)
        w_idx = np.empty(n, dtype=np.int64)
        f_parts: list[bytes] = []
        w_parts: list[bytes] = []
        fc, wc = self.fragment_cms, self.word_cms
        for i, rec in enumerate(raw):
            field = f"records[{i}]"
            if not isinstance(rec, list):
                raise MalformedReportError("bad-type", field, "expected a list [i, j', bits', j, bits]")
            if len(rec) != 5:
                raise MalformedReportError("bad-length", field, f"expected 5 entries, got {len(rec)}")
            position = rec[0]
            if type(position) is not int:
                raise MalformedReportError("bad-type", f"{field}.position", "expected an integer position index")
            if not 0 <= position < self.positions:
                raise MalformedReportError("out-of-range", f"{field}.position", f"must lie in [0, {self.positions})")
            fj, fbits = check_wire_record(rec[1], rec[2], k=fc.k, m=fc.m, field=f"{field}.fragment")
            wj, wbits = check_wire_record(rec[3], rec[4], k=wc.k, m=wc.m, field=f"{field}.word")
            positions[i], f_idx[i], w_idx[i] = position, fj, wj
            f_parts.append(fbits)
            w_parts.append(wbits)
        return SFPBatch(
            positions=positions,
            fragment=CMSBatch(indices=f_idx, bits=_stack(f_parts, n, fc.record_bytes)),
            word=CMSBatch(indices=w_idx, bits=_stack(w_parts, n, wc.record_bytes)),
        )

    # ------------------------------------------------------------------ server half

    # --- the contract of protocol.interfaces (plain forms for the shells)

    def encode_plain(self, records: Sequence[object]) -> list[object]:
        """Typed records in wire form."""
        return list(self.encode_records([own(r, SFPRecord, "sfp record") for r in records]))

    def empty_batch(self) -> SFPBatch:
        """No records."""
        return self.batch([])

    def restore_aggregate(self, data: object) -> SFPAggregate:
        """An aggregate saved with ``to_plain``."""
        return SFPAggregate.from_plain(self, data)

    def fold(self, aggregate: Aggregate, batch: Batch) -> None:
        """Fold a batch into an aggregate of this mechanism."""
        own(aggregate, SFPAggregate, "sfp aggregate").add(own(batch, SFPBatch, "sfp batch"))

    def check_value(self, value: object) -> str:
        """A word (a string; truncated or padded to ``length`` when privatized)."""
        if not isinstance(value, str):
            raise InputError(f"takes a word (a string); got {value!r}")
        return value

    def discover(self, aggregate: Aggregate, *, alphabet: str, top_t: int, threshold: float) -> list[DiscoveredWord]:
        """The words the puzzle reconstructs (003 Alg. 10)."""
        found = own(aggregate, SFPAggregate, "sfp aggregate")
        return found.reconstruct(alphabet=alphabet, top_t=top_t, threshold=threshold)

    def reported_as(self, value: str) -> str:
        """A word as it is discovered: truncated to ``length``, trailing padding removed."""
        return value[: self.length].rstrip(" ")

    @property
    def longest(self) -> int:
        """Words up to ``length`` characters are reported whole."""
        return self.length

    def plan(self, n: float) -> PlanFigures:
        """The word sketch is a CMS over ``n`` reports, each fragment sketch one over the
        ``n / positions`` reports that chose its position (003 §4.3, Thm 4.2 with ``Σf² <= 0.1 n²``)."""
        per_position = n / self.positions
        word = self.word_cms.variance_bound(n=n, sum_sq=0.1 * n * n)
        fragment = self.fragment_cms.variance_bound(n=per_position, sum_sq=0.1 * per_position**2)
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(float(word)),
            unit="count",
            figures={
                "epsilon_report": self.epsilon_report,
                "fragment_standard_error": math.sqrt(float(fragment)),
                "positions": float(self.positions),
            },
            formulas=(
                "003 Thm 4.5: eps + eps' per report",
                "word: 003 Thm 4.2 over n reports; fragment: 003 Thm 4.2 over n/positions reports",
            ),
        )

    def new_aggregate(self) -> SFPAggregate:
        """An empty aggregate."""
        return SFPAggregate(self)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"a word must be encodable as UTF-8: {exc}") from exc


def _stack(parts: list[bytes], n: int, width: int) -> npt.NDArray[np.uint8]:
    return np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(n, width).copy()


class SFPAggregate:
    """The word CMS aggregate and one fragment CMS aggregate per position (003 Alg. 10 steps 1-6)."""

    def __init__(
        self,
        mechanism: SequenceFragmentPuzzle,
        *,
        word: CMSAggregate | None = None,
        fragments: Sequence[CMSAggregate] | None = None,
    ) -> None:
        self.mechanism = mechanism
        self.word = mechanism.word_cms.new_aggregate() if word is None else word
        self.fragments: list[CMSAggregate] = (
            [mechanism.fragment_cms.new_aggregate() for _ in range(mechanism.positions)]
            if fragments is None
            else list(fragments)
        )

    @property
    def n(self) -> int:
        """Number of reports folded in."""
        return self.word.n

    def add(self, batch: SFPBatch) -> None:
        """Fold a batch of reports: words into the word sketch, fragments into their position's sketch.

        Raises:
            ValueError: if the batch's parts are not row-aligned or a position is out of range.
        """
        n = len(batch)
        if len(batch.fragment) != n or len(batch.word) != n:
            raise ValueError("the batch's positions, fragment records and word records must be row-aligned")
        if n == 0:
            return
        if int(batch.positions.min()) < 0 or int(batch.positions.max()) >= self.mechanism.positions:
            raise ValueError(f"batch positions must lie in [0, {self.mechanism.positions})")
        # Validate both parts before folding either, so a bad batch changes nothing.
        for part, cms in ((batch.fragment, self.mechanism.fragment_cms), (batch.word, self.mechanism.word_cms)):
            if part.bits.shape != (n, cms.record_bytes) or not (
                int(part.indices.min()) >= 0 and int(part.indices.max()) < cms.k
            ):
                raise ValueError("batch records do not fit the mechanism")
        order = np.argsort(batch.positions, kind="stable")
        bounds = np.searchsorted(batch.positions[order], np.arange(self.mechanism.positions + 1))
        for position, aggregate in enumerate(self.fragments):
            rows = order[bounds[position] : bounds[position + 1]]
            if rows.size:
                aggregate.add(batch.fragment.take(rows))
        self.word.add(batch.word)

    def merge(self, other: Self) -> Self:
        """The aggregate of both inputs' reports."""
        if other.mechanism != self.mechanism:
            raise ValueError("cannot merge aggregates of different mechanisms")
        return type(self)(
            self.mechanism,
            word=self.word.merge(other.word),
            fragments=[a.merge(b) for a, b in zip(self.fragments, other.fragments, strict=True)],
        )

    def to_plain(self) -> dict[str, Any]:
        """Plain, msgpack-ready data."""
        return {"word": self.word.to_plain(), "fragments": [a.to_plain() for a in self.fragments]}

    @classmethod
    def from_plain(cls, mechanism: SequenceFragmentPuzzle, data: object) -> SFPAggregate:
        """Restore an aggregate saved by :meth:`to_plain`.

        Raises:
            StateError: if anything is missing, malformed or inconsistent.
        """
        where = "sfp aggregate"
        word = CMSAggregate.from_plain(mechanism.word_cms, require(data, "word", dict, where=where))
        raw = require(data, "fragments", list, where=where)
        if len(raw) != mechanism.positions:
            raise StateError(f"{where}.fragments: expected {mechanism.positions} position sketches, got {len(raw)}")
        fragments = [CMSAggregate.from_plain(mechanism.fragment_cms, part) for part in raw]
        if sum(a.n for a in fragments) != word.n:
            raise StateError(f"{where}: the fragment sketches do not hold one record per word record")
        return cls(mechanism, word=word, fragments=fragments)

    def estimate_words(self, candidates: Sequence[str], *, workers: int | None = None) -> VectorEstimate:
        """Estimated counts of whole words (padded or truncated like the clients'), with standard errors."""
        mech = self.mechanism
        return self.word.estimate([_utf8(mech.pad(w)) for w in candidates], workers=workers)

    def estimate_fragments(
        self, position: int, candidates: Sequence[tuple[int, str]], *, workers: int | None = None
    ) -> VectorEstimate:
        """Estimated counts of ``(puzzle piece, fragment)`` pairs at one position index.

        A count estimates how many of the reports that chose ``position`` hold a word with
        that puzzle piece and fragment (003 Alg. 10 step 6).
        """
        mech = self.mechanism
        check_int(position, "position", low=0, high=mech.positions - 1)
        values = []
        for piece, fragment in candidates:
            if isinstance(piece, bool) or not isinstance(piece, int) or not 0 <= piece < PUZZLE_PIECES:
                raise InputError(f"a puzzle piece lies in [0, {PUZZLE_PIECES}); got {piece!r}")
            values.append(mech.fragment_value(piece, fragment))
        return self.fragments[position].estimate(values, workers=workers)

    def reconstruct(
        self,
        *,
        alphabet: str | Sequence[str],
        top_t: int,
        threshold: float,
        check_puzzle: bool = True,
        max_words: int = 2_000_000,
        workers: int | None = None,
    ) -> list[DiscoveredWord]:
        """See :func:`reconstruct`."""
        return reconstruct(
            self,
            alphabet=alphabet,
            top_t=top_t,
            threshold=threshold,
            check_puzzle=check_puzzle,
            max_words=max_words,
            workers=workers,
        )


def reconstruct(
    aggregate: SFPAggregate,
    *,
    alphabet: str | Sequence[str],
    top_t: int,
    threshold: float,
    check_puzzle: bool = True,
    max_words: int = 2_000_000,
    workers: int | None = None,
) -> list[DiscoveredWord]:
    """Discover frequent words (003 Alg. 10 steps 7-15).

    Args:
        aggregate: the reports.
        alphabet: the characters words are made of; include the space, or padded (short)
            words cannot be assembled.
        top_t: ``T``, the number of (puzzle piece, fragment) pairs kept per position.
        threshold: the smallest estimated word count reported.
        check_puzzle: drop assembled words whose own puzzle piece differs from the piece
            they were assembled under (see the module docstring).
        max_words: refuse (``ValueError``) to score more assembled words than this.
        workers: threads for the dictionary queries.

    Returns:
        The words (trailing padding removed) whose estimate is at least ``threshold``, by
        decreasing estimated count.
    """
    mech = aggregate.mechanism
    check_int(top_t, "top_t", low=1)
    symbols = list(dict.fromkeys(alphabet))
    if not symbols or any(not isinstance(c, str) or len(c) != 1 for c in symbols):
        raise ValueError("alphabet must be a non-empty collection of single characters")
    fragments = ["".join(t) for t in itertools.product(symbols, repeat=mech.fragment_length)]
    total = PUZZLE_PIECES * len(fragments)
    if total > _CANDIDATES_MAX:
        raise ValueError(f"{total} fragment candidates per position; use a smaller alphabet or fragment_length")
    if aggregate.n == 0:
        return []
    # Steps 8-10: the top T (piece, fragment) tuples per position, over all 256 x |Ω|**l pairs.
    encoded = [_utf8(f) for f in fragments]
    values = [bytes((w,)) + f for w in range(PUZZLE_PIECES) for f in encoded]
    fp = family_fingerprints(mech.fragment_cms.family, values)
    per_position: list[dict[int, list[str]]] = []
    for position_aggregate in aggregate.fragments:
        if position_aggregate.n == 0:
            return []
        counts = position_aggregate.estimate_fingerprints(fp, workers=workers).values
        keep = min(top_t, total)
        best = np.argpartition(-counts, keep - 1)[:keep]
        best = best[np.argsort(-counts[best], kind="stable")]
        by_piece: dict[int, list[str]] = {}
        for index in best.tolist():
            piece, fragment = divmod(index, len(fragments))
            by_piece.setdefault(piece, []).append(fragments[fragment])
        per_position.append(by_piece)
    # Steps 11-14: for each puzzle piece, the Cartesian product of its fragments across positions.
    # The products' sizes are known before any is built: refuse at once rather than after
    # assembling (and hashing) up to max_words strings.
    pieces = [[by_piece.get(piece, []) for by_piece in per_position] for piece in range(PUZZLE_PIECES)]
    if sum(math.prod(len(x) for x in lists) for lists in pieces) > max_words:
        raise ValueError(f"more than max_words={max_words} assembled words; lower top_t")
    words: list[str] = []
    for piece, lists in enumerate(pieces):
        if not all(lists):
            continue
        for parts in itertools.product(*lists):
            word = "".join(parts)
            if not check_puzzle or mech.puzzle_piece(word) == piece:
                words.append(word)
    if not words:
        return []
    # Step 15: the word oracle's counts for the assembled dictionary.
    est = aggregate.word.estimate([_utf8(w) for w in words], workers=workers)
    order = np.argsort(-est.values, kind="stable")
    return [
        DiscoveredWord(words[i].rstrip(" "), float(est.values[i]), float(est.standard_errors[i]))
        for i in order.tolist()
        if est.values[i] >= threshold
    ]


ENTRY: Final = MechanismEntry(name=SequenceFragmentPuzzle.name, build=SequenceFragmentPuzzle, epsilon_parameter=False)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
