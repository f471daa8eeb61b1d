"""Sequence Fragment Puzzle (003 §4.3, Algorithms 8-9, Theorem 4.5): the device half.

Built on two Count Mean Sketches (:mod:`protocol.cms`): one over whole words with
``(epsilon, k, m)`` and one over fragments with ``(epsilon_fragment, k_fragment, m_fragment)``.
Their hash families, and the 256-valued puzzle-piece hash ``h``, come from independent
sub-seeds ``derive_seed(seed, "sfp/word")``, ``"sfp/fragment"`` and ``"sfp/puzzle"``. The
deployed New Words parameters (003 §6.1) are ``(m, m') = (1024, 1024)``,
``(k, k') = (2048, 2048)``, ``(ε, ε') = (2, 6)``, ``length = 10``, ``fragment_length = 2``.

**Encoding.** A word is a ``str`` of Unicode characters: it is first put in Normalization
Form C (NFC, :func:`normalize`), so that a letter typed precomposed (``"é"``, U+00E9) or as a
base letter and a combining mark (``"e"`` U+0065, U+0301) is one and the same word; then it is
truncated to ``length`` characters and padded on the right with spaces to exactly
``length`` (003 §4.3: "padding shorter strings with spaces and truncating longer
strings"); ``s`` below is that padded word. The word sketch hashes ``s`` as UTF-8. Fragment
positions are the 0-based offsets ``0, fragment_length, 2 fragment_length, ...`` (the
paper's 1-based ``{1, 3, 5, 7, 9}``); ``length`` must be a multiple of ``fragment_length``.
The puzzle piece is ``h(s)`` in ``[256]`` and the fragment value hashed by the fragment
sketch is the byte ``h(s)`` followed by the UTF-8 of ``s[ℓ : ℓ + fragment_length]``.

**A character is a code point of the NFC form**, never a byte: ``length``, the fragments and
the alphabet all count code points, so ``"ß"`` or ``"ã"`` (two bytes of UTF-8 each) is one
character of a fragment like ``"a"``, and a fragment is never cut inside a letter's UTF-8.
A letter that Unicode has no precomposed form for stays a base letter and a combining mark
after NFC: two characters, both of which must be in the alphabet, and they may fall in two
fragments (assembly joins the fragments back in order, so the word is found whole).

**Alphabet.** ``alphabet`` holds the characters words are made of, the padding space
included (default :data:`DEFAULT_ALPHABET`: a-z, the apostrophe of "don't", the space). The
server assembles words only from it (003 Alg. 10 step 8 enumerates ``256 x
|alphabet|**fragment_length`` fragment candidates), so a word with any other character can
never be discovered. Privatizing takes any string, as 003 Alg. 9 does; the agent asks
:meth:`SequenceFragmentPuzzle.check_discoverable` before it records and refuses, before any
ε is spent, such a word, and any other word the collector can never release as such: an
empty one, or one with a space inside its first ``length`` characters (a device pads on the
right only, so the collector releases no string with padding inside it). Characters past
``length`` are cut off (the word is released truncated) and are not checked. The alphabet is
a parameter of the mechanism, so the use case's definition hash covers it; left at its
default it is left out of every hash (:data:`~protocol.interfaces.HASHED_UNLESS_DEFAULT`),
which keeps the hashes of use cases defined before it existed.

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

The server half (:mod:`protocol.server.sfp`) runs 003 Alg. 10 on the two sketches. This
module is pure Python: a device privatizes without numpy.
"""

from __future__ import annotations

import struct
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any, ClassVar, Final

from protocol.checks import check_epsilon, check_int, check_seed, encoded_size
from protocol.cms import K_MAX, M_MAX, CMSRecord, CountMeanSketch, ScalarHash
from protocol.errors import InputError, ParameterError
from protocol.hashing import HashFamily, derive_seed
from protocol.interfaces import (
    HASHED_UNLESS_DEFAULT,
    EstimateKind,
    EventLevelStrings,
    MechanismEntry,
)
from protocol.randomness import SCALE, RandomSource, random_bytes, uniform_draws

__all__ = [
    "DEFAULT_ALPHABET",
    "ENTRY",
    "FRAGMENT_CANDIDATES_MAX",
    "LENGTH_MAX",
    "PADDING",
    "PUZZLE_PIECES",
    "SFPRecord",
    "SequenceFragmentPuzzle",
    "describe_characters",
    "normalize",
    "word_bytes",
]

PUZZLE_PIECES = 256
"""Range of the puzzle-piece hash ``h`` (003 Alg. 8: ``h : D -> [256]``)."""

LENGTH_MAX = 256
"""Longest accepted word length (the deployed length is 10)."""

PADDING = " "
"""The character short words are padded with (003 §4.3); every alphabet holds it."""

DEFAULT_ALPHABET = "abcdefghijklmnopqrstuvwxyz' "
"""The alphabet of a use case that sets none: a-z, the apostrophe, the padding space."""

FRAGMENT_CANDIDATES_MAX = 1 << 24
"""Most (puzzle piece, fragment) candidates per position, ``256 x |alphabet|**fragment_length``:
what the server enumerates and scores at every position (003 Alg. 10 step 8)."""

_POSITION_WORDS = 5
"""Words drawn for the position; each is rejected with probability below 2**-61 (all five: draw afresh)."""
_POSITION = struct.Struct(f"<{_POSITION_WORDS}Q")


@dataclass(frozen=True, slots=True)
class SFPRecord:
    """One report: the position index, the fragment's CMS record and the word's CMS record."""

    position: int
    fragment: CMSRecord
    word: CMSRecord


def normalize(text: str) -> str:
    """``text`` in Normalization Form C: one code point per letter wherever Unicode has one."""
    return unicodedata.normalize("NFC", text)


def describe_characters(characters: Sequence[str]) -> str:
    """Characters as a person can read them, invisible ones included: ``'ß' (U+00DF LATIN SMALL LETTER SHARP S)``."""
    return ", ".join(f"{c!r} (U+{ord(c):04X} {unicodedata.name(c, 'unnamed')})" for c in characters)


def word_bytes(text: str) -> bytes:
    """A padded word or fragment as the sketches hash it: its UTF-8.

    Raises:
        InputError: if the text is not encodable (lone surrogates).
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"a word must be encodable as UTF-8: {exc}") from exc


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
        alphabet: the characters words are made of, the padding space included (default
            :data:`DEFAULT_ALPHABET`); each must be its own NFC form, and ``256 x
            |alphabet|**fragment_length`` at most :data:`FRAGMENT_CANDIDATES_MAX`.
    """

    name: ClassVar[str] = "sfp"
    server: ClassVar[str] = "protocol.server.sfp:SFPServer"
    record_type: ClassVar[type[SFPRecord]] = SFPRecord
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
    alphabet: str = field(default=DEFAULT_ALPHABET, metadata={HASHED_UNLESS_DEFAULT: True})

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
        self._check_alphabet()

    def _check_alphabet(self) -> None:
        """The alphabet: a string holding the padding space, of NFC characters, small enough to enumerate."""
        alphabet = self.alphabet
        if not isinstance(alphabet, str) or not alphabet.strip(PADDING):
            raise ParameterError("alphabet", "a string of the characters words are made of", alphabet)
        if PADDING not in alphabet:
            raise ParameterError("alphabet", "a string that holds the space, which pads short words", alphabet)
        # A device sends NFC words, so a character that NFC rewrites (U+212B ANGSTROM SIGN
        # becomes U+00C5) could never occur in one.
        odd = [c for c in dict.fromkeys(alphabet) if normalize(c) != c or not _encodable(c)]
        if odd:
            allowed = f"characters that are their own NFC form; not {describe_characters(odd)}"
            raise ParameterError("alphabet", allowed, alphabet)
        pairs = PUZZLE_PIECES * len(self.symbols) ** self.fragment_length
        if pairs > FRAGMENT_CANDIDATES_MAX:
            allowed = (
                f"small enough that 256 x characters^fragment_length <= {FRAGMENT_CANDIDATES_MAX}; "
                f"{len(self.symbols)} characters give {pairs} fragment candidates per position"
            )
            raise ParameterError("alphabet", allowed, alphabet)

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
    def symbols(self) -> tuple[str, ...]:
        """The alphabet's distinct characters, in the order it gives them."""
        return tuple(dict.fromkeys(self.alphabet))

    @property
    def positions(self) -> int:
        """Number of fragment positions: ``length / fragment_length`` (5 when deployed)."""
        return self.length // self.fragment_length

    @property
    def epsilon_report(self) -> float:
        """ε of one report: ``ε + ε'`` for the implemented coins (003 Thm 4.5, basic composition)."""
        return self.word_cms.epsilon_report + self.fragment_cms.epsilon_report

    def pad(self, word: str) -> str:
        """``word`` in NFC, truncated or padded with spaces to exactly ``length`` characters.

        Raises:
            InputError: if ``word`` is not a ``str``.
        """
        if not isinstance(word, str):
            raise InputError(f"SFP privatizes words (str); got {type(word).__name__}")
        return normalize(word)[: self.length].ljust(self.length, PADDING)

    def puzzle_piece(self, padded: str) -> int:
        """``h(s)`` in ``[256]`` for a padded word."""
        return self._puzzle_hash(word_bytes(padded), 0)

    def fragment_value(self, piece: int, fragment: str) -> bytes:
        """The value the fragment sketch hashes: the puzzle-piece byte, then the fragment's UTF-8."""
        return bytes((piece,)) + word_bytes(fragment)

    def fragment_of(self, padded: str, position: int) -> str:
        """The fragment of a padded word at a position index (``fragment_length`` characters)."""
        start = position * self.fragment_length
        return padded[start : start + self.fragment_length]

    # ---------------------------------------------------------------- client half

    def setup(self, rng: RandomSource) -> None:
        """No permanent state: SFP privatizes each event afresh (event-level privacy)."""
        return

    def privatize(self, value: str, state: None, rng: RandomSource) -> tuple[SFPRecord, None]:
        """One report for the word ``value`` (003 Alg. 9)."""
        s = self.pad(value)
        data = word_bytes(s)
        fc, wc = self.fragment_cms, self.word_cms
        # One draw for the whole report: words for the position, then each CMS report's words.
        drawn = random_bytes(rng, 8 * (_POSITION_WORDS + fc.draw_words + wc.draw_words))
        # Step 1: the fragment position, uniform and independent of the word: the first of
        # the position words below the largest multiple of the count (exact rejection).
        count = self.positions
        limit = SCALE - SCALE % count
        accepted = [w for w in _POSITION.unpack_from(drawn) if w < limit]
        position = accepted[0] % count if accepted else uniform_draws(rng, count, 1)[0]
        # Step 2: r = h(s) || s[ℓ : ℓ + fragment_length].
        r = self.fragment_value(self._puzzle_hash(data, 0), self.fragment_of(s, position))
        # Step 3: two independent CMS reports (ε' for r, ε for s), from disjoint words.
        split = 8 * (_POSITION_WORDS + fc.draw_words)
        fragment = fc.privatize_bytes(r, rng, drawn=drawn[8 * _POSITION_WORDS : split])
        word = wc.privatize_bytes(data, rng, drawn=drawn[split:])
        return SFPRecord(position, fragment, word), None

    def output_distribution(self, value: str) -> dict[tuple[int, int, bytes, int, bytes], Fraction]:
        """Exact ``Pr[(i, j', bits', j, bits) | value]``, as the coins implement it (tiny parameters only)."""
        s = self.pad(value)
        piece = self.puzzle_piece(s)
        word = self.word_cms.output_distribution(word_bytes(s))
        share = Fraction(1, self.positions)
        dist: dict[tuple[int, int, bytes, int, bytes], Fraction] = {}
        for position in range(self.positions):
            fragment = self.fragment_cms.output_distribution(self.fragment_value(piece, self.fragment_of(s, position)))
            for (fj, fbits), pf in fragment.items():
                for (wj, wbits), pw in word.items():
                    dist[(position, fj, fbits, wj, wbits)] = share * pf * pw
        return dist

    # ------------------------------------------------------------------- wire form

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

    def check_value(self, value: object) -> str:
        """A word (a string; truncated or padded to ``length`` when privatized)."""
        if not isinstance(value, str):
            raise InputError(f"takes a word (a string); got {value!r}")
        return value

    def check_discoverable(self, value: str) -> str:
        """``value`` in NFC if the collector can ever discover it (the agent asks before it records).

        Privatizing takes any string (003 Alg. 9); this is the agent's test that a word is worth
        its ε (the module docstring, "Alphabet").

        Raises:
            InputError: a word that can never be assembled, naming its characters outside the
                alphabet and the alphabet, or why else.
        """
        word = normalize(value)
        sent = word[: self.length]
        outside = [c for c in dict.fromkeys(sent) if c not in self.symbols]
        if outside:
            raise InputError(
                f"refuses {word!r}: it has characters outside the use case's alphabet: "
                f"{describe_characters(outside)}; the alphabet (parameters.alphabet) is {self.alphabet!r}, "
                "and a word with any other character can never be discovered"
            )
        kept = sent.rstrip(PADDING)
        if not kept:
            raise InputError(f"refuses {value!r}: it is no word, a word needs a character other than the space")
        if PADDING in kept:
            raise InputError(
                f"refuses {word!r}: it has a space inside its first {self.length} characters; the space pads "
                "words on the right, so a word with a space inside can never be discovered"
            )
        return word

    def reported_as(self, value: str) -> str:
        """A word as it is discovered: in NFC, truncated to ``length``, trailing padding removed."""
        return normalize(value)[: self.length].rstrip(PADDING)

    @property
    def longest(self) -> int:
        """Words up to ``length`` characters are reported whole."""
        return self.length


def _encodable(character: str) -> bool:
    try:
        character.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


ENTRY: Final = MechanismEntry(name=SequenceFragmentPuzzle.name, build=SequenceFragmentPuzzle, epsilon_parameter=False)
"""This module's entry in the mechanism table (:mod:`protocol.interfaces`)."""
