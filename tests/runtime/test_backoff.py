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


def test_a_busy_peer_makes_the_waits_grow_four_times_as_fast() -> None:
    """next_delay(busy=True) counts BUSY_STEPS more attempts: the ceiling quadruples, still capped."""
    retry = Retry(Backoff(initial=1.0, cap=64.0), jitter=lambda: 1.0)
    assert [retry.next_delay(busy=True) for _ in range(5)] == [4.0, 32.0, 64.0, 64.0, 64.0]
    retry.reset()
    assert [retry.next_delay(), retry.next_delay(busy=True), retry.next_delay()] == [1.0, 8.0, 16.0]
    # However many refusals, the count stays small and the wait at the cap.
    for _ in range(1000):
        retry.next_delay(busy=True)
    assert retry.attempts <= 65
    assert retry.next_delay() == 64.0


def test_jitter_spreads_a_fleet_that_failed_together() -> None:
    """Devices with their own jitter sources, failing at the same moment, do not retry in lock step."""
    fleet = [Retry(Backoff(initial=1.0, cap=64.0), jitter=random.Random(seed).random) for seed in range(100)]
    waits = [r.next_delay(busy=True) for r in fleet]
    assert all(2.0 <= w <= 4.0 for w in waits)
    assert len({round(w, 3) for w in waits}) > 50
