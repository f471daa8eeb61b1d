"""The sketches' device paths as release 0.1.0 wrote them with numpy, and a source of edge coins.

The device halves of CMS, HCMS and SFP privatize in pure Python; these transcriptions of the
numpy code they replaced (``rng.words``, ``np.packbits``, the vectorised hash) are what the
pure paths are compared with, record for record, on seeded and on edge coins. HCMS and SFP
draw their coins in another order on the server half's vectorised path (column by column
over many values), so for them this is the reference; CMS is also compared with
:meth:`protocol.server.cms.CMSServer.privatize_many`, which consumes the stream as a report does.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from protocol.cms import LOW56, CMSRecord, CountMeanSketch
from protocol.hcms import HadamardCountMeanSketch, HCMSRecord
from protocol.randomness import SCALE, SeededRandom, uniform_ints
from protocol.server.hashing import evaluate, family_fingerprints
from protocol.sfp import SequenceFragmentPuzzle, SFPRecord

__all__ = ["EdgeRandom", "cms_record", "hcms_record", "sfp_record"]


class EdgeRandom:
    """A seeded source whose words are often at the coins' edges (``edges``, one in ``every``):
    a coin byte equal to a threshold's top byte (a tie for a fresh remainder to decide), or a
    word above every rejection limit. Its pure and vectorised draws are one stream, as
    :class:`SeededRandom`'s are."""

    def __init__(self, seed: int, edges: list[int], every: int = 3) -> None:
        self._source = SeededRandom(seed)
        self._edges = np.array(edges, dtype=np.uint64)
        self._every = every

    def words(self, n: int) -> npt.NDArray[np.uint64]:
        out = self._source.words(n)
        pick = self._source.words(n)
        edge = pick % np.uint64(self._every) == 0
        out[edge] = self._edges[(pick[edge] >> np.uint64(32)) % np.uint64(self._edges.size)]
        return out

    def draw(self, n: int) -> list[int]:
        words: list[int] = self.words(n).tolist()
        return words


def _hash(family_holder: CountMeanSketch | HadamardCountMeanSketch, value: bytes | str, j: int) -> int:
    family = family_holder.family
    return int(evaluate(family, family_fingerprints(family, [value]), j)[0])


def cms_record(
    mech: CountMeanSketch, data: bytes, rng: EdgeRandom | SeededRandom, words: npt.NDArray[np.uint64] | None = None
) -> CMSRecord:
    """003 Alg. 2 as the numpy device path computed it: one draw of ``draw_words`` words."""
    m, k = mech.m, mech.k
    coin_words = (m + 7) // 8
    if words is None:
        words = rng.words(mech.draw_words)
    rest: list[int] = words[coin_words:].tolist()
    w = rest[0]
    if k & (k - 1) == 0:
        j = w >> (65 - k.bit_length()) if k > 1 else 0
    elif w < SCALE - SCALE % k:
        j = w % k
    else:
        j = int(uniform_ints(rng, k, 1)[0])
    threshold = mech.flip_coin.numerator
    u = words[:coin_words].view(np.uint8)[:m]
    flips = u < np.uint8(threshold >> 56)
    spare = 1
    for tie in np.flatnonzero(u == np.uint8(threshold >> 56)).tolist():
        if spare == len(rest):
            rest += rng.words(8).tolist()
        flips[tie] = rest[spare] >> 8 < (threshold & LOW56)
        spare += 1
    flips[_hash(mech, data, j)] ^= True
    return CMSRecord(j, np.packbits(flips).tobytes())


def hcms_record(mech: HadamardCountMeanSketch, value: str | bytes, rng: EdgeRandom | SeededRandom) -> HCMSRecord:
    """003 Alg. 6 as the numpy device path computed it: three words, a fresh one per rejected ``j``."""
    w0, w1, w2 = rng.words(3).tolist()
    limit = SCALE - SCALE % mech.k
    while w0 >= limit:
        w0 = int(rng.words(1)[0])
    j = w0 % mech.k
    ell = w1 >> (64 - (mech.m.bit_length() - 1))
    parity = (ell & _hash(mech, value, j)).bit_count() & 1
    return HCMSRecord(j, ell, int(w2 < mech.keep_coin.numerator) ^ parity)


def sfp_record(mech: SequenceFragmentPuzzle, value: str, rng: EdgeRandom | SeededRandom) -> SFPRecord:
    """003 Alg. 9 as the numpy device path computed it: one draw for the position and both CMS reports."""
    s = mech.pad(value)
    fc, wc = mech.fragment_cms, mech.word_cms
    words = rng.words(5 + fc.draw_words + wc.draw_words)
    count = mech.positions
    accepted = [w for w in words[:5].tolist() if w < SCALE - SCALE % count]
    position = accepted[0] % count if accepted else int(uniform_ints(rng, count, 1)[0])
    piece = _hash_piece(mech, s)
    r = mech.fragment_value(piece, mech.fragment_of(s, position))
    split = 5 + fc.draw_words
    fragment = cms_record(fc, r, rng, words[5:split])
    word = cms_record(wc, s.encode("utf-8"), rng, words[split:])
    return SFPRecord(position, fragment, word)


def _hash_piece(mech: SequenceFragmentPuzzle, padded: str) -> int:
    family = mech.puzzle_family
    return int(evaluate(family, family_fingerprints(family, [padded]), 0)[0])
