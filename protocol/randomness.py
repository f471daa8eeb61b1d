"""Random sources and exact Bernoulli coins.

Every random choice a device makes goes through a :class:`RandomSource`, which yields
uniform 64-bit words. Devices use :class:`SystemRandom` (the OS CSPRNG); only tests and
the fleet simulator inject :class:`SeededRandom`. A predictable generator would let a
collector that sees many reports reconstruct the coins and undo the privacy.

Bernoulli draws compare a uniform 64-bit word ``w`` with an integer threshold ``T``:
``Pr[w < T] = T / 2**64`` exactly. Thresholds are computed from the real probability with
60-digit decimal arithmetic and rounded in the direction that keeps every likelihood
ratio at or below ``e**ε`` (see :func:`coin_at_most` and :func:`coin_at_least`), so the
privacy claims hold for the implemented coins, not just for ideal ones; the rounding
moves a probability by less than ``2**-64``.

Every draw comes in two forms over one stream of words: the **pure** form a device uses
(:meth:`RandomSource.draw`, :func:`flips`, :func:`uniform_draws`,
:func:`sample_without_replacement`: Python integers, no numpy, so a device installs none) and
the **vectorised** form the simulator and the batch privatizers use
(:meth:`RandomSource.words`, :func:`bernoulli`, :func:`uniform_ints`: numpy arrays, numpy
imported only when they run). Both consume the stream's words in the same order and give
the same results for the same words, so a seeded device replays exactly
(``tests/compat/test_device_coins.py``).
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from fractions import Fraction
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "BYTE_FLIP",
    "BYTE_KEEP",
    "BYTE_TIE",
    "SCALE",
    "BinaryKeepCoin",
    "ByteCoins",
    "Coin",
    "KaryKeepCoin",
    "PushbackSource",
    "RandomSource",
    "SeededRandom",
    "SystemRandom",
    "bernoulli",
    "bernoulli_thresholds",
    "binary_keep_coin",
    "byte_coin_overflow",
    "byte_coin_rows",
    "coin_at_least",
    "coin_at_most",
    "dexp",
    "flips",
    "log_ratio",
    "random_bytes",
    "sample_floyd",
    "sample_without_replacement",
    "uniform_draws",
    "uniform_from_words",
    "uniform_ints",
    "uniform_word",
]

SCALE = 1 << 64
"""Coins are resolved to multiples of ``2**-64``."""

_CTX = Context(prec=60)


class RandomSource(Protocol):
    """A source of independent, uniformly distributed 64-bit words, in two forms of one stream."""

    def draw(self, n: int) -> list[int]:
        """The next ``n`` independent uniform words, as Python integers (the device's pure path)."""
        ...

    def words(self, n: int) -> npt.NDArray[np.uint64]:
        """The next ``n`` independent uniform words as a ``uint64`` array (the vectorised path)."""
        ...


class SystemRandom:
    """The OS CSPRNG (``os.urandom``, i.e. ``getrandom(2)``). The default on devices.

    Every word comes straight from the kernel: no user-space expansion sits on the privacy
    path. The largest request a device makes is one sketch record's coins (a 1,024-coordinate
    CMS record needs 8 KiB), which ``os.urandom`` serves in tens of microseconds, and a device
    privatizes a handful of records a day, so a faster stream would buy nothing that matters
    (docs/benchmarks.md, "The OS CSPRNG per request").
    """

    def draw(self, n: int) -> list[int]:
        return list(struct.unpack(f"<{n}Q", os.urandom(8 * n)))

    def words(self, n: int) -> npt.NDArray[np.uint64]:
        import numpy as np  # noqa: PLC0415 - the vectorised path only; a device never takes it

        raw = os.urandom(8 * n)
        # A writable copy: callers may redraw entries in place.
        return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


class SeededRandom:
    """A seeded, reproducible source (PCG64). For tests and the simulator only."""

    def __init__(self, seed: int) -> None:
        import numpy as np  # noqa: PLC0415 - tests and the simulator only

        self._gen = np.random.Generator(np.random.PCG64(seed))

    def draw(self, n: int) -> list[int]:
        words: list[int] = self.words(n).tolist()
        return words

    def words(self, n: int) -> npt.NDArray[np.uint64]:
        import numpy as np  # noqa: PLC0415

        out: npt.NDArray[np.uint64] = self._gen.integers(0, SCALE, size=n, dtype=np.uint64, endpoint=False)
        return out


def random_bytes(rng: RandomSource, n: int) -> bytes:
    """``n`` uniform bytes: whole words, little-endian, cut to length (ids, keys, salts, a
    sketch record's coins).

    Each built-in source gives them the cheapest way it has rather than one Python integer
    per word: the OS source straight from the kernel (its stream has no replay to keep), the
    seeded one from the array it draws anyway (the simulator has loaded numpy; a device never
    uses it). Any other source goes word by word; all three read the same stream.
    """
    words = -(-n // 8)
    if type(rng) is SystemRandom:
        return os.urandom(8 * words)[:n]
    if type(rng) is SeededRandom:
        return rng.words(words).astype("<u8", copy=False).tobytes()[:n]
    drawn = rng.draw(words)
    return struct.pack(f"<{len(drawn)}Q", *drawn)[:n]


@dataclass(frozen=True, slots=True)
class Coin:
    """A biased coin whose probability of heads is exactly ``numerator / 2**64``."""

    numerator: int

    def __post_init__(self) -> None:
        if not 0 <= self.numerator <= SCALE:
            raise ValueError(f"coin numerator must lie in [0, 2**64]; got {self.numerator}")

    @property
    def probability(self) -> Fraction:
        """The exact probability of heads."""
        return Fraction(self.numerator, SCALE)

    @property
    def complement(self) -> Coin:
        """The coin that shows heads exactly when this one shows tails."""
        return Coin(SCALE - self.numerator)


def log_ratio(ratio: Fraction) -> float:
    """``ln(ratio)`` of an exact likelihood ratio, accurate near 1 (``log1p`` of the exact excess), so a
    mechanism's ε computed from its coins is not pushed above the declared ε by float rounding."""
    return math.log1p(float(ratio - 1))


def dexp(x: float | Decimal) -> Decimal:
    """``e**x`` to 60 significant digits (``x`` taken at its exact binary value)."""
    return _CTX.exp(Decimal(x))


def _scaled(p: Decimal | Fraction) -> Decimal:
    if isinstance(p, Fraction):
        p = _CTX.divide(Decimal(p.numerator), Decimal(p.denominator))
    if not Decimal(0) <= p <= Decimal(1):
        raise ValueError(f"a probability must lie in [0, 1]; got {p}")
    return _CTX.multiply(p, Decimal(SCALE))


def coin_at_most(p: Decimal | Fraction) -> Coin:
    """The coin with the largest representable probability that does not exceed ``p``."""
    return Coin(int(_scaled(p).to_integral_value(rounding=ROUND_FLOOR)))


def coin_at_least(p: Decimal | Fraction) -> Coin:
    """The coin with the smallest representable probability that is not below ``p``."""
    return Coin(int(_scaled(p).to_integral_value(rounding=ROUND_CEILING)))


def binary_keep_coin(epsilon: float) -> Coin:
    """Binary randomized response's coin at ``epsilon``: keep the true bit with ``e**ε / (1 + e**ε)``,
    rounded down, so ``p / (1 - p) <= e**ε`` for the implemented coin."""
    e = dexp(epsilon)
    return coin_at_most(e / (1 + e))


class BinaryKeepCoin:
    """The keep coin of a mechanism whose report is bits kept or flipped with one coin, and the
    ε it gives (a mixin for the device halves of ``rr``, ``cms`` and ``hcms``).

    Two values' reports differ in at most :attr:`keep_shares` such bits (one for randomized
    response and HCMS's single bit, two for CMS's vector, 003 Thm 4.1), so each bit is kept at
    ``ε / keep_shares`` (:func:`binary_keep_coin`) and ε of one report is exactly
    ``keep_shares * ln(p / (1 - p))`` for the implemented coin, at most ``epsilon``
    (003 Thm 4.1 and 4.3).
    """

    __slots__ = ()
    keep_shares: ClassVar[int] = 1
    epsilon: float

    @cached_property
    def keep_coin(self) -> Coin:
        """The coin that keeps a bit (heads = unchanged): ``e**(ε/s) / (1 + e**(ε/s))``, rounded down."""
        return binary_keep_coin(self.epsilon / self.keep_shares)

    @property
    def keep_probability(self) -> float:
        """``p``: the probability that a bit is sent unchanged, for the implemented coin."""
        return float(self.keep_coin.probability)

    @property
    def epsilon_report(self) -> float:
        """ε of one report: exactly ``s ln(p / (1 - p))`` for the implemented coin; at most ε."""
        p = self.keep_coin.probability
        return self.keep_shares * math.log(p / (1 - p))


class KaryKeepCoin:
    """The keep coin of k-ary randomized response over :attr:`outcomes` values, and the ε it gives
    (a mixin for the device halves of ``grr``, over its categories, and ``olh``, over its hash
    range).

    A report is the own value with ``p = e**ε / (e**ε + n - 1)``, rounded down, and each other
    value with ``q = (1 - p) / (n - 1)``; every likelihood ratio is at most ``p / q``, so ε of one
    report is ``ln(p / q)`` for the implemented coin, at most ``epsilon``.
    """

    __slots__ = ()
    epsilon: float

    @property
    def outcomes(self) -> int:
        """``n``, the values a report can take (each mechanism's own)."""
        raise NotImplementedError

    @cached_property
    def keep_coin(self) -> Coin:
        """Report the own value: ``e**ε / (e**ε + n - 1)``, rounded down."""
        e = dexp(self.epsilon)
        return coin_at_most(e / (e + self.outcomes - 1))

    @property
    def p_exact(self) -> Fraction:
        """``Pr[report = the own value]`` for the implemented coin, exactly."""
        return self.keep_coin.probability

    @property
    def q_exact(self) -> Fraction:
        """``Pr[report = a given other value]``, exactly."""
        return (1 - self.keep_coin.probability) / (self.outcomes - 1)

    @cached_property
    def epsilon_report(self) -> float:
        """``ln(p / q)`` for the implemented coin (at most ε)."""
        return log_ratio(self.p_exact / self.q_exact)


# --- the pure path (a device's) --------------------------------------------------------------


def flips(rng: RandomSource, coin: Coin, size: int) -> list[bool]:
    """``size`` independent flips of ``coin`` (True = heads); :func:`bernoulli`'s pure twin.

    A certain coin (probability 0 or 1) draws nothing, as :func:`bernoulli` does.
    """
    if coin.numerator == 0:
        return [False] * size
    if coin.numerator == SCALE:
        return [True] * size
    threshold = coin.numerator
    return [w < threshold for w in rng.draw(size)]


def _chunks(words: list[int], bits: int, count: int) -> list[int]:
    """The first ``count`` ``bits``-wide little-endian chunks of ``words`` (as numpy's view gives them)."""
    per_word = 64 // bits
    mask = (1 << bits) - 1
    out = [(w >> (bits * i)) & mask for w in words for i in range(per_word)]
    return out[:count]


def uniform_draws(rng: RandomSource, n: int, size: int) -> list[int]:
    """``size`` independent integers uniform on ``{0, ..., n - 1}``; :func:`uniform_ints`' pure twin
    (the same words, the same chunks, the same rejections, the same results)."""
    if n <= 0:
        raise ValueError(f"range must be positive; got {n}")
    if n == 1:
        return [0] * size
    if n > 1 << 32:
        return _uniform_draws_wide(rng, n, size)
    bits = 8 if n <= 1 << 8 else 16 if n <= 1 << 16 else 32
    per_word = 64 // bits
    k = (1 << bits) // n

    def draw(count: int) -> list[int]:
        return _chunks(rng.draw(-(-count // per_word)), bits, count)

    c = draw(size)
    if k * n != 1 << bits:
        limit = k * n
        redo = [i for i, x in enumerate(c) if x >= limit]
        while redo:
            fresh = draw(len(redo))
            for i, x in zip(redo, fresh, strict=True):
                c[i] = x
            redo = [i for i, x in zip(redo, fresh, strict=True) if x >= limit]
    return [x // k for x in c]


def _uniform_draws_wide(rng: RandomSource, n: int, size: int) -> list[int]:
    limit = SCALE - SCALE % n
    out: list[int] = []
    while len(out) < size:
        need = size - len(out)
        w = rng.draw(need + need // 4 + 4)
        if limit < SCALE:
            w = [x for x in w if x < limit]
        out += [x % n for x in w[:need]]
    return out


def sample_without_replacement(rng: RandomSource, n: int, d: int) -> list[int]:
    """``d`` distinct integers from ``{0, ..., n - 1}``, every subset equally likely (in draw order)."""
    if not 0 <= d <= n:
        raise ValueError(f"cannot draw {d} distinct items from {n}")
    pool = list(range(n))
    # Partial Fisher-Yates: position i swaps with a uniform position in [i, n).
    for i in range(d):
        j = i + uniform_draws(rng, n - i, 1)[0]
        pool[i], pool[j] = pool[j], pool[i]
    return pool[:d]


def uniform_word(rng: RandomSource, word: int, n: int) -> int:
    """An integer uniform on ``{0, ..., n - 1}`` from one uniform 64-bit ``word`` already drawn.

    ``word % n`` when ``word`` lies below the largest multiple of ``n`` under ``2**64``
    (every value then has the same number of preimages); otherwise (probability below
    ``n / 2**64``) fresh words are drawn from ``rng`` until one does. A mechanism that lays
    out a report's words in advance (one per choice) uses this, and
    :func:`uniform_from_words` is its vectorised twin over the same layout.
    """
    if n <= 0:
        raise ValueError(f"range must be positive; got {n}")
    limit = SCALE - SCALE % n
    while word >= limit:
        word = rng.draw(1)[0]
    return word % n


def sample_floyd(rng: RandomSource, words: Sequence[int], n: int, d: int) -> list[int]:
    """``d`` distinct integers from ``{0, ..., n - 1}``, every subset equally likely, in increasing order.

    Floyd's algorithm: for ``j = n - d, ..., n - 1`` draw ``t`` uniform on ``{0, ..., j}``
    (:func:`uniform_word` on the next of ``words``) and take ``t``, or ``j`` if ``t`` is
    taken already. Step ``j`` adds each of its ``j + 1`` candidates with the probability
    that keeps every ``d``-subset equally likely, with one word per element and no pool of
    ``n`` entries, so a subset of a large range costs ``d`` draws.

    Raises:
        ValueError: ``d`` outside ``[0, n]`` or fewer than ``d`` words.
    """
    if not 0 <= d <= n:
        raise ValueError(f"cannot draw {d} distinct items from {n}")
    if len(words) < d:
        raise ValueError(f"{d} draws need {d} words; got {len(words)}")
    chosen: set[int] = set()
    for i, j in enumerate(range(n - d, n)):
        t = uniform_word(rng, words[i], j + 1)
        chosen.add(j if t in chosen else t)
    return sorted(chosen)


BYTE_FLIP, BYTE_KEEP, BYTE_TIE = 0x31, 0x30, 0x32
"""A byte coin's outcome as an ASCII digit (:class:`ByteCoins`): heads ``"1"``, tails ``"0"``, and
``"2"`` for a byte equal to the threshold's top byte, which a fresh 56-bit remainder decides."""

_LOW56 = (1 << 56) - 1


@dataclass(frozen=True)
class ByteCoins:
    """Many flips of one coin, each resolved from one random byte where that suffices.

    A flip compares a uniform 64-bit ``U`` with the coin's threshold ``T``: ``U``'s top byte
    decides unless it equals ``T``'s top byte, and only then (probability ``1/256``) is a
    fresh 56-bit remainder compared with ``T``'s low 56 bits, so every flip shows heads with
    probability exactly ``T / 2**64`` while a vector of ``m`` flips costs ``m`` bytes of
    randomness instead of ``8 m``. The outcomes are ASCII digits (:data:`BYTE_FLIP`,
    :data:`BYTE_KEEP`), so ``int(digits, 2)`` packs them. Count Mean Sketch (003 Alg. 2) and
    optimized unary encoding flip a coin per coordinate this way.
    """

    coin: Coin

    @cached_property
    def table(self) -> bytes:
        """Random byte -> its digit (heads, tails, or a tie with the threshold's top byte)."""
        high = self.coin.numerator >> 56
        if self.coin.numerator == SCALE:
            return bytes([BYTE_FLIP]) * 256
        return bytes(BYTE_FLIP if b < high else BYTE_TIE if b == high else BYTE_KEEP for b in range(256))

    def digits(self, coin_bytes: bytes, spares: list[int], rng: RandomSource) -> bytearray:
        """One digit per byte of ``coin_bytes``; ties take the words of ``spares`` in order (more
        are drawn from ``rng``, eight at a time, when they run out). ``spares`` is consumed."""
        out = bytearray(coin_bytes.translate(self.table))
        low = self.coin.numerator & _LOW56
        tie = out.find(BYTE_TIE)
        while tie != -1:
            if not spares:
                spares += rng.draw(8)
            out[tie] = BYTE_FLIP if spares.pop(0) >> 8 < low else BYTE_KEEP
            tie = out.find(BYTE_TIE, tie + 1)
        return out


class PushbackSource:
    """A random source that hands back words it was given back before drawing new ones.

    A vectorised privatizer draws many reports' words at once; when one report needs more than
    its share (a rare tie in :class:`ByteCoins` past its spare words), the device draws the extra
    words right after that report's, so the words drawn for the reports after it belong after
    them. :meth:`unread` returns them to the stream, in order, and the report is privatized by the
    device's own code reading this source, so the stream stays the device's word for word.
    """

    def __init__(self, rng: RandomSource) -> None:
        self._rng = rng
        self._back: list[npt.NDArray[np.uint64]] = []

    def unread(self, words: npt.NDArray[np.uint64]) -> None:
        """Put ``words`` back in front of the stream (they are read again next, in order)."""
        if words.size:
            self._back.insert(0, words)

    def words(self, n: int) -> npt.NDArray[np.uint64]:
        """The next ``n`` words: those given back first, then fresh ones."""
        import numpy as np  # noqa: PLC0415 - the vectorised path only

        parts: list[npt.NDArray[np.uint64]] = []
        need = n
        while need and self._back:
            head = self._back.pop(0)
            parts.append(head[:need])
            if head.size > need:
                self._back.insert(0, head[need:])
            need -= min(need, int(head.size))
        if need:
            parts.append(self._rng.words(need))
        return np.concatenate(parts) if len(parts) != 1 else parts[0].copy()

    def draw(self, n: int) -> list[int]:
        """The next ``n`` words as Python integers."""
        drawn: list[int] = self.words(n).tolist()
        return drawn


def byte_coin_overflow(coin: Coin, coin_bytes: npt.NDArray[np.uint8], spares: int) -> int | None:
    """The first row of ``coin_bytes`` with more ties than ``spares`` (``None``: none has)."""
    import numpy as np  # noqa: PLC0415 - the vectorised path only

    if coin.numerator == SCALE:
        return None
    ties = np.count_nonzero(coin_bytes == np.uint8(coin.numerator >> 56), axis=1)
    over = np.flatnonzero(ties > spares)
    return int(over[0]) if over.size else None


def byte_coin_rows(
    coin: Coin, coin_bytes: npt.NDArray[np.uint8], spares: npt.NDArray[np.uint64]
) -> npt.NDArray[np.bool_]:
    """:meth:`ByteCoins.digits` for many rows at once: row ``i``'s flips from ``coin_bytes[i]``, its
    ties from ``spares[i]`` in order.

    Raises:
        ValueError: a row has more ties than spare words (:func:`byte_coin_overflow` finds it
            first; the device would draw more words there, which the caller must follow).
    """
    import numpy as np  # noqa: PLC0415 - the vectorised path only

    if coin.numerator == SCALE:
        return np.ones(coin_bytes.shape, dtype=np.bool_)
    high, low = np.uint8(coin.numerator >> 56), np.uint64(coin.numerator & _LOW56)
    heads = coin_bytes < high
    rows, cols = np.nonzero(coin_bytes == high)
    if rows.size:
        rank = np.arange(rows.size) - np.searchsorted(rows, rows, side="left")
        if int(rank.max()) >= spares.shape[1]:
            raise ValueError("a row has more ties than spare words; privatize it the device's way")
        heads[rows, cols] = (spares[rows, rank] >> np.uint64(8)) < low
    return heads


# --- the vectorised path (the simulator's and the batch privatizers') -----------------------


def bernoulli(rng: RandomSource, coin: Coin, size: int) -> npt.NDArray[np.bool_]:
    """``size`` independent flips of ``coin`` (True = heads)."""
    import numpy as np  # noqa: PLC0415 - the vectorised path only

    if coin.numerator == 0:
        return np.zeros(size, dtype=np.bool_)
    if coin.numerator == SCALE:
        return np.ones(size, dtype=np.bool_)
    return rng.words(size) < np.uint64(coin.numerator)


def bernoulli_thresholds(rng: RandomSource, numerators: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
    """One flip per entry, entry ``i`` showing heads with probability ``numerators[i] / 2**64``.

    Numerators equal to ``2**64`` cannot be stored in ``uint64``; callers represent a
    certain event by handling it before the call.
    """
    return rng.words(int(numerators.size)).reshape(numerators.shape) < numerators


def uniform_ints(rng: RandomSource, n: int, size: int) -> npt.NDArray[np.int64]:
    """``size`` independent integers drawn uniformly from ``{0, ..., n - 1}``, exactly.

    For ``n <= 2**32`` each 64-bit word is cut into 8-, 16- or 32-bit chunks (the smallest
    width that holds ``n - 1``), so small ranges cost a fraction of a word per draw. A chunk
    at or above ``k·n`` (``k = 2**bits // n``) is rejected and redrawn at its own position;
    an accepted chunk is uniform on ``[0, k·n)``, and ``chunk // k`` is uniform on
    ``[0, n)`` because every value has exactly ``k`` preimages. Positions use disjoint
    chunks, so the results are independent. Larger ranges reject whole words at or above
    the largest multiple of ``n`` below ``2**64``.
    """
    import numpy as np  # noqa: PLC0415 - the vectorised path only

    if n <= 0:
        raise ValueError(f"range must be positive; got {n}")
    if n == 1:
        return np.zeros(size, dtype=np.int64)
    if n > 1 << 32:
        return _uniform_ints_wide(rng, n, size)
    bits = 8 if n <= 1 << 8 else 16 if n <= 1 << 16 else 32
    chunk = np.dtype(f"<u{bits // 8}")
    per_word = 64 // bits
    k = (1 << bits) // n

    def draw(count: int) -> npt.NDArray[np.integer[Any]]:
        words = rng.words(-(-count // per_word))
        return words.astype("<u8", copy=False).view(chunk)[:count]

    c = draw(size).copy()
    if k * n != 1 << bits:
        limit = chunk.type(k * n)
        redo = np.flatnonzero(c >= limit)
        while redo.size:
            fresh = draw(int(redo.size))
            c[redo] = fresh
            redo = redo[fresh >= limit]
    result: npt.NDArray[np.int64] = (c // chunk.type(k)).astype(np.int64)
    return result


def uniform_from_words(rng: RandomSource, words: npt.NDArray[np.uint64], n: int) -> npt.NDArray[np.int64]:
    """:func:`uniform_word` over an array of words: ``words % n``, a word at or above the
    largest multiple of ``n`` under ``2**64`` replaced, in order, by fresh words from ``rng``
    until one is below it (as the pure twin does for a single report)."""
    import numpy as np  # noqa: PLC0415 - the vectorised path only

    if n <= 0:
        raise ValueError(f"range must be positive; got {n}")
    limit = SCALE - SCALE % n
    out: npt.NDArray[np.int64] = (words % np.uint64(n)).astype(np.int64)
    if limit < SCALE:
        for i in np.flatnonzero(words >= np.uint64(limit)).tolist():
            out[i] = uniform_word(rng, int(words[i]), n)
    return out


def _uniform_ints_wide(rng: RandomSource, n: int, size: int) -> npt.NDArray[np.int64]:
    import numpy as np  # noqa: PLC0415 - the vectorised path only

    limit = SCALE - SCALE % n
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        need = size - filled
        w = rng.words(need + need // 4 + 4)
        if limit < SCALE:
            w = w[w < np.uint64(limit)]
        w = w[:need]
        out[filled : filled + w.size] = (w % np.uint64(n)).astype(np.int64)
        filled += int(w.size)
    return out
