"""Sequence Fragment Puzzle, the server half (003 §4.3, Algorithm 10): discovering unknown strings.

See :mod:`protocol.sfp` for the encoding, the client (003 Alg. 9) and the privacy; here: the
records' columnar form and strict decoding, the two sketches, the oracles, the puzzle's
reconstruction, the planner's figures and the vectorised privatizer the simulator uses.

**Server (003 Alg. 10).** Steps 1-6: one CMS aggregate of the word records, and one CMS
aggregate of the fragment records per position (each with its own ``n_ℓ``, the number of
reports that chose that position), all sharing the fragment hash family ``H'``. The word
oracle (:meth:`SFPAggregate.estimate_words`) and the fragment oracles
(:meth:`SFPAggregate.estimate_fragments`) are CMS estimates with CMS standard errors (see
:mod:`protocol.server.cms`); a fragment count estimates the number of reports that chose that
position and hold a word with that puzzle piece and fragment. Steps 7-15
(:func:`reconstruct`): for each position the ``top_t`` (puzzle piece, fragment) pairs with
the largest estimated counts over all ``256 x |alphabet|**fragment_length`` pairs (the
alphabet's characters are code points, :mod:`protocol.sfp` "Encoding"); for each
puzzle piece ``w`` the Cartesian product of ``w``'s fragments across positions; every
assembled word is scored with the word oracle, and words at or above the threshold are
returned with their counts and standard errors.

One addition to Alg. 10: the server can recompute ``h``, so a word assembled under piece
``w`` whose own ``h`` is not ``w`` cannot have been reported by anyone through those
fragments; :func:`reconstruct` drops it before querying the word oracle (``check_puzzle``,
on by default). A true word is always assembled under its own piece, so this never loses
one; it removes about 255 of every 256 spurious combinations. Likewise a device sends its word
in NFC (:func:`protocol.sfp.normalize`), so an assembled word that is not in NFC (a base
letter followed by a combining mark that composes with it, where both are in the alphabet)
was sent by nobody and is dropped too: each word is found under one spelling only.
"""

from __future__ import annotations

import itertools
import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

import numpy as np
import numpy.typing as npt

from protocol.checks import check_int
from protocol.errors import InputError, MalformedReportError, StateError, TooManyWordsError
from protocol.plain import PlainDoc
from protocol.randomness import RandomSource, uniform_ints
from protocol.server.cms import CMSAggregate, CMSBatch, CMSServer, check_wire_record
from protocol.server.contract import PlainServer, PlanFigures
from protocol.server.estimate import VectorEstimate
from protocol.server.hashing import family_fingerprints
from protocol.server.parallel import Threads
from protocol.server.plain import require
from protocol.server.records import record_entries, record_list
from protocol.sfp import PUZZLE_PIECES, SequenceFragmentPuzzle, SFPRecord, word_bytes

__all__ = ["DiscoveredWord", "SFPAggregate", "SFPBatch", "SFPServer", "reconstruct"]

_CANDIDATES_MAX = 1 << 24


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


def _stack(parts: list[bytes], n: int, width: int) -> npt.NDArray[np.uint8]:
    return np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(n, width).copy()


def reconstruct(
    aggregate: SFPAggregate,
    *,
    alphabet: str | Sequence[str] | None = None,
    top_t: int,
    threshold: float,
    check_puzzle: bool = True,
    max_words: int = 2_000_000,
    threads: Threads | None = None,
) -> list[DiscoveredWord]:
    """Discover frequent words (003 Alg. 10 steps 7-15).

    Args:
        aggregate: the reports.
        alphabet: the characters words are made of (code points); include the space, or
            padded (short) words cannot be assembled. ``None``: the mechanism's own alphabet.
        top_t: ``T``, the number of (puzzle piece, fragment) pairs kept per position.
        threshold: the smallest estimated word count reported.
        check_puzzle: drop assembled words whose own puzzle piece differs from the piece
            they were assembled under, and words not in NFC (see the module docstring).
        max_words: refuse (:class:`~protocol.errors.TooManyWordsError`) to score more assembled words than this.
        threads: the caller's threads, the dictionary queries split between them (None: this thread alone).

    Returns:
        The words (trailing padding removed) whose estimate is at least ``threshold``, by
        decreasing estimated count.
    """
    mech = aggregate.mechanism
    check_int(top_t, "top_t", low=1)
    symbols = list(dict.fromkeys(mech.alphabet if alphabet is None else alphabet))
    if not symbols or any(not isinstance(c, str) or len(c) != 1 for c in symbols):
        raise ValueError("alphabet must be a non-empty collection of single characters")
    fragments = ["".join(t) for t in itertools.product(symbols, repeat=mech.fragment_length)]
    total = PUZZLE_PIECES * len(fragments)
    if total > _CANDIDATES_MAX:
        raise ValueError(f"{total} fragment candidates per position; use a smaller alphabet or fragment_length")
    if aggregate.n == 0:
        return []
    # Steps 8-10: the top T (piece, fragment) tuples per position, over all 256 x |Ω|**l pairs.
    encoded = [word_bytes(f) for f in fragments]
    values = [bytes((w,)) + f for w in range(PUZZLE_PIECES) for f in encoded]
    fp = family_fingerprints(mech.fragment_cms.family, values)
    per_position: list[dict[int, list[str]]] = []
    for position_aggregate in aggregate.fragments:
        if position_aggregate.n == 0:
            return []
        counts = position_aggregate.estimate_fingerprints(fp, threads=threads).values
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
    assembled = sum(math.prod(len(x) for x in lists) for lists in pieces)
    if assembled > max_words:
        raise TooManyWordsError(assembled, max_words)
    words: list[str] = []
    for piece, lists in enumerate(pieces):
        if not all(lists):
            continue
        for parts in itertools.product(*lists):
            word = "".join(parts)
            if not check_puzzle or (mech.puzzle_piece(word) == piece and unicodedata.is_normalized("NFC", word)):
                words.append(word)
    if not words:
        return []
    # Step 15: the word oracle's counts for the assembled dictionary.
    est = aggregate.word.estimate([word_bytes(w) for w in words], threads=threads)
    order = np.argsort(-est.values, kind="stable")
    return [
        DiscoveredWord(words[i].rstrip(" "), float(est.values[i]), float(est.standard_errors[i]))
        for i in order.tolist()
        if est.values[i] >= threshold
    ]


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
        self.word = CMSAggregate(mechanism.word_cms) if word is None else word
        self.fragments: list[CMSAggregate] = (
            [CMSAggregate(mechanism.fragment_cms) for _ in range(mechanism.positions)]
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

    def to_plain(self) -> PlainDoc:
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

    def estimate_words(self, candidates: Sequence[str], *, threads: Threads | None = None) -> VectorEstimate:
        """Estimated counts of whole words (padded or truncated like the clients'), with standard errors."""
        mech = self.mechanism
        return self.word.estimate([word_bytes(mech.pad(w)) for w in candidates], threads=threads)

    def estimate_fragments(
        self, position: int, candidates: Sequence[tuple[int, str]], *, threads: Threads | None = None
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
        return self.fragments[position].estimate(values, threads=threads)

    # The module function is the method too (the aggregate its first argument), so the two
    # cannot drift apart.
    reconstruct = reconstruct


class SFPServer(PlainServer[SequenceFragmentPuzzle, SFPBatch, SFPAggregate]):
    """Sequence Fragment Puzzle's server half: strings discovered without a dictionary."""

    batch_type: ClassVar[type[SFPBatch]] = SFPBatch
    aggregate_type: ClassVar[type[SFPAggregate]] = SFPAggregate

    # ------------------------------------------------------------------- wire form

    def batch(self, records: Sequence[SFPRecord]) -> SFPBatch:
        """Typed records in columnar form."""
        fragment, word = CMSServer(self.mechanism.fragment_cms), CMSServer(self.mechanism.word_cms)
        positions = np.fromiter((r.position for r in records), dtype=np.int64, count=len(records))
        return SFPBatch(
            positions=positions,
            fragment=fragment.batch([r.fragment for r in records]),
            word=word.batch([r.word for r in records]),
        )

    def decode_records(self, raw: object) -> SFPBatch:
        """Strictly decode the wire form of :meth:`SequenceFragmentPuzzle.encode_records`.

        Raises:
            MalformedReportError: ``bad-type``, ``bad-length``, ``out-of-range`` or
                ``bad-padding``, naming ``records[i]``, ``records[i].position``,
                ``records[i].fragment.index``, ``records[i].fragment.bits``,
                ``records[i].word.index`` or ``records[i].word.bits``.
        """
        records = record_list(raw, "[i, j', bits', j, bits]")
        n = len(records)
        positions = np.empty(n, dtype=np.int64)
        f_idx = np.empty(n, dtype=np.int64)
        w_idx = np.empty(n, dtype=np.int64)
        f_parts: list[bytes] = []
        w_parts: list[bytes] = []
        mech = self.mechanism
        fc, wc = mech.fragment_cms, mech.word_cms
        for i, item in enumerate(records):
            field = f"records[{i}]"
            rec = record_entries(item, field, "[i, j', bits', j, bits]", 5)
            position = rec[0]
            if type(position) is not int:
                raise MalformedReportError("bad-type", f"{field}.position", "expected an integer position index")
            if not 0 <= position < mech.positions:
                raise MalformedReportError("out-of-range", f"{field}.position", f"must lie in [0, {mech.positions})")
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

    # ---------------------------------------------------------------- simulation

    def privatize_many(self, values: Sequence[str], rng: RandomSource) -> SFPBatch:
        """Privatize many words at once (the simulator's path); same distribution as ``privatize``."""
        mech = self.mechanism
        distinct: dict[str, int] = {}
        codes = np.fromiter(
            (distinct.setdefault(mech.pad(v), len(distinct)) for v in values), dtype=np.int64, count=len(values)
        )
        words = list(distinct)
        pieces = [mech.puzzle_piece(s) for s in words]
        # Every (distinct word, position) fragment value, so the fragment sketch fingerprints each once.
        fragment_values = [
            mech.fragment_value(piece, mech.fragment_of(word, p))
            for word, piece in zip(words, pieces, strict=True)
            for p in range(mech.positions)
        ]
        positions = uniform_ints(rng, mech.positions, len(values))
        frag_fp = family_fingerprints(mech.fragment_cms.family, fragment_values)
        pick = codes * mech.positions + positions
        word_fp = family_fingerprints(mech.word_cms.family, [word_bytes(s) for s in words])
        fragment = CMSServer(mech.fragment_cms).privatize_fingerprints(frag_fp.take(pick), rng)
        word = CMSServer(mech.word_cms).privatize_fingerprints(word_fp.take(codes), rng)
        return SFPBatch(positions=positions, fragment=fragment, word=word)

    # ------------------------------------------------------------------ estimation

    def discover(
        self,
        aggregate: object,
        *,
        alphabet: str | None = None,
        top_t: int,
        threshold: float,
        threads: Threads | None = None,
    ) -> list[DiscoveredWord]:
        """The words the puzzle reconstructs (003 Alg. 10)."""
        return reconstruct(
            self.own_aggregate(aggregate), alphabet=alphabet, top_t=top_t, threshold=threshold, threads=threads
        )

    def plan(self, n: float) -> PlanFigures:
        """The word sketch is a CMS over ``n`` reports, each fragment sketch one over the
        ``n / positions`` reports that chose its position (003 §4.3, Thm 4.2 with ``Σf² <= 0.1 n²``)."""
        mech = self.mechanism
        per_position = n / mech.positions
        word = CMSServer(mech.word_cms).variance_bound(n=n, sum_sq=0.1 * n * n)
        fragment = CMSServer(mech.fragment_cms).variance_bound(n=per_position, sum_sq=0.1 * per_position**2)
        return PlanFigures(
            n=n,
            standard_error=math.sqrt(float(word)),
            unit="count",
            figures={
                "epsilon_report": mech.epsilon_report,
                "fragment_standard_error": math.sqrt(float(fragment)),
                "positions": float(mech.positions),
            },
            formulas=(
                "003 Thm 4.5: eps + eps' per report",
                "word: 003 Thm 4.2 over n reports; fragment: 003 Thm 4.2 over n/positions reports",
            ),
        )
