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

import os
import struct
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "SCALE",
    "Coin",
    "RandomSource",
    "SeededRandom",
    "SystemRandom",
    "bernoulli",
    "bernoulli_thresholds",
    "coin_at_least",
    "coin_at_most",
    "dexp",
    "flips",
    "random_bytes",
    "sample_without_replacement",
    "uniform_draws",
    "uniform_ints",
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
    CMS record needs 8 KiB), which ``os.urandom`` serves in about 40 µs on the reference
    machine; a device privatizes a handful of records a day, so a faster stream would buy
    nothing that matters (measured 2026-11-24: 41 µs for 8 KiB, 6.6 ms for 1 MiB).
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
