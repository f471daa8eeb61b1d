"""Backoff: capped, jittered, exponential, and reset after a session that worked."""

from __future__ import annotations

import random

import pytest

from runtime.backoff import Backoff, Retry


@pytest.mark.parametrize("attempt", range(12))
def test_each_wait_lies_between_half_the_ceiling_and_the_ceiling(attempt: int) -> None:
    """Wait n lies in [c/2, c] with c = min(cap, initial * 2**n), and the jitter spreads it."""
    b = Backoff(initial=0.5, cap=30.0)
    ceiling = min(30.0, 0.5 * 2**attempt)
    assert b.ceiling(attempt) == ceiling
    rng = random.Random(attempt)
    delays = {b.delay(attempt, rng.random()) for _ in range(20)}
    assert all(ceiling / 2 <= d <= ceiling for d in delays)
    assert len(delays) > 1
    assert b.delay(attempt, 0.0) == ceiling / 2
    assert b.delay(attempt, 1.0) == ceiling


def test_retry_grows_to_the_cap_and_reset_starts_over() -> None:
    """Failed attempts double the ceiling up to the cap; reset() after a healthy session starts from initial."""
    retry = Retry(Backoff(initial=1.0, cap=8.0), jitter=lambda: 1.0)
    assert [retry.next_delay() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert retry.attempts == 6
    retry.reset()
    assert retry.next_delay() == 1.0


@pytest.mark.parametrize(("initial", "cap"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0), (float("nan"), 1.0)])
def test_a_bad_policy_is_refused(initial: float, cap: float) -> None:
    """The first wait must be positive and the cap at least the first wait."""
    with pytest.raises(ValueError, match=r"initial|cap"):
        Backoff(initial=initial, cap=cap)
