"""Exact coins and uniform draws: probabilities are what the code claims, to the last bit."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.randomness import (
    SCALE,
    Coin,
    SeededRandom,
    SystemRandom,
    bernoulli,
    coin_at_least,
    coin_at_most,
    dexp,
    flips,
    random_bytes,
    sample_without_replacement,
    uniform_draws,
    uniform_ints,
)


class Scripted:
    """A random source that replays given words."""

    def __init__(self, words: list[int]) -> None:
        self.left = list(words)

    def words(self, n: int) -> npt.NDArray[np.uint64]:
        return np.array(self.draw(n), dtype=np.uint64)

    def draw(self, n: int) -> list[int]:
        out, self.left = self.left[:n], self.left[n:]
        return out


def test_coin_rounding_brackets_the_real_probability() -> None:
    """coin_at_most never exceeds p, coin_at_least is never below it, and they are adjacent."""
    e = dexp(1.0)
    p = e / (1 + e)
    low, high = coin_at_most(p), coin_at_least(p)
    assert Fraction(low.numerator, SCALE) <= Fraction(str(p)) + Fraction(1, 10**40)
    assert high.numerator - low.numerator == 1
    assert coin_at_most(Decimal(1)).numerator == SCALE
    assert coin_at_least(Fraction(0)).numerator == 0
    assert low.complement.numerator == SCALE - low.numerator


def test_bernoulli_compares_words_with_the_threshold() -> None:
    """Heads exactly when the word is below the numerator: Pr = numerator / 2**64."""
    coin = Coin(1000)
    got = bernoulli(Scripted([0, 999, 1000, 2**64 - 1]), coin, 4)
    assert got.tolist() == [True, True, False, False]
    assert bernoulli(Scripted([]), Coin(0), 3).tolist() == [False] * 3
    assert bernoulli(Scripted([]), Coin(SCALE), 2).tolist() == [True] * 2


def test_uniform_ints_rejects_and_redraws_out_of_range_chunks() -> None:
    """Range 3 uses 8-bit chunks with k = 85: chunk 255 is rejected and redrawn in place."""
    # little-endian bytes of the first word: 0xFF (rejected), 0x00 -> 0, then six more chunks.
    first = int.from_bytes(bytes([0xFF, 0x00, 84, 85, 169, 170, 254, 0]), "little")
    redraw = int.from_bytes(bytes([170]) + bytes(7), "little")
    got = uniform_ints(Scripted([first, redraw]), 3, 8)
    assert got.tolist() == [2, 0, 0, 1, 1, 2, 2, 0]
    assert uniform_ints(SeededRandom(1), 1, 5).tolist() == [0] * 5


@pytest.mark.parametrize("n", [2, 3, 7, 200, 256, 1000, 70_000, 2**32, 2**32 + 5])
def test_uniform_ints_are_uniform(n: int) -> None:
    """Every value of a small range, and both halves of a large one, appear as often as expected."""
    draws = uniform_ints(SeededRandom(n), n, 200_000)
    assert draws.dtype == np.int64
    assert int(draws.min()) >= 0
    assert int(draws.max()) < n
    bins = min(n, 64)
    counts = np.bincount(draws * bins // n, minlength=bins)
    # Values per bin (exact for ranges small enough to enumerate; equal to 1e-9 otherwise).
    share = np.bincount(np.arange(n) * bins // n, minlength=bins) / n if n <= 10**6 else np.full(bins, 1 / bins)
    expected = 200_000 * share
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert abs(chi2 - (bins - 1)) <= 5 * math.sqrt(2 * (bins - 1))


def test_sample_without_replacement_is_distinct() -> None:
    """d distinct values from range(n), every value reachable."""
    rng = SeededRandom(5)
    seen: set[int] = set()
    for _ in range(200):
        pick = sample_without_replacement(rng, 10, 4)
        assert len(set(pick)) == 4
        seen.update(pick)
    assert seen == set(range(10))


def test_system_random_gives_writable_independent_words() -> None:
    """The OS source returns fresh, writable words on both its small and its bulk path."""
    src = SystemRandom()
    for n in (4, 10_000):
        a, b = src.words(n), src.words(n)
        assert a.dtype == np.uint64
        assert a.shape == (n,)
        assert a.flags.writeable
        assert not np.array_equal(a, b)


@settings(max_examples=200, deadline=None)
@given(
    n=st.one_of(st.integers(1, 300), st.integers(1, 1 << 33), st.sampled_from([255, 256, 257, 65_537, 1 << 32])),
    size=st.integers(0, 40),
    seed=st.integers(0, 2**32),
)
def test_the_pure_draws_equal_the_vectorised_ones_word_for_word(n: int, size: int, seed: int) -> None:
    """Same stream, same results: uniform_draws is uniform_ints, flips is bernoulli, and they leave
    the stream at the same place."""
    a, b = SeededRandom(seed), SeededRandom(seed)
    assert uniform_draws(a, n, size) == uniform_ints(b, n, size).tolist()
    coin = Coin(int(SCALE * 0.3))
    assert flips(a, coin, size) == bernoulli(b, coin, size).tolist()
    assert a.draw(3) == b.words(3).tolist()


def test_certain_coins_draw_nothing() -> None:
    """Probability 0 or 1 takes no word from the stream, in both forms."""
    a, b = SeededRandom(4), SeededRandom(4)
    assert flips(a, Coin(0), 5) == [False] * 5
    assert flips(a, Coin(SCALE), 5) == [True] * 5
    assert a.draw(2) == b.draw(2)


def test_random_bytes_are_the_stream_little_endian() -> None:
    """random_bytes cuts whole little-endian words, as numpy's tobytes does."""
    a, b = SeededRandom(9), SeededRandom(9)
    assert random_bytes(a, 16) == b.words(2).astype("<u8").tobytes()
    assert len(random_bytes(a, 5)) == 5
