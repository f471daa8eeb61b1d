"""Capped exponential backoff with jitter, and the retry counter that resets after a session that delivered.

One rule for every retry loop of the agent and the collector (reconnecting to the broker,
re-publishing, re-committing to a store that failed): the ``n``-th wait (from 0) has the
ceiling ``min(cap, initial * 2**n)`` and lies uniformly in ``[ceiling / 2, ceiling]``
("equal jitter": the fixed half keeps a floor under the wait, so a broken peer is not
hammered; the random half keeps a fleet that lost its broker at the same moment from
coming back in lock step). After a session that worked, :meth:`Retry.reset` starts again
from ``initial``, so one drop after a day of service does not wait the cap. What "worked"
means is the caller's, and it is more than "connected": a broker that accepts a connection
and a subscription and then drops it is not serving, and resetting then would reconnect in
a tight loop. The agent resets after a connection that delivered a report, the collector
after one that received a report or lasted a keep-alive interval
(docs/deploy.md, "Reconnecting to a busy broker").

A broker that says it is busy (MQTT 5 reason codes 0x88 server unavailable, 0x89 server
busy, 0x97 quota exceeded, 0x9F connection rate exceeded, in a CONNACK or a DISCONNECT)
asked for less traffic: ``next_delay(busy=True)`` counts :data:`BUSY_STEPS` attempts more
before computing the wait, so the waits grow four times as fast (still capped).

The jitter needs no secrecy: by default it comes from the stdlib PRNG; the agent passes its
injected random source so that its tests replay exactly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BUSY_STEPS", "Backoff", "Retry"]

BUSY_STEPS = 2
"""Extra attempts a busy broker's refusal counts for: each such wait is four times the last."""


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """The policy: how long the first wait is at most, and the cap.

    Attributes:
        initial: the first wait's ceiling, in seconds (> 0).
        cap: the largest wait, in seconds (>= initial).
    """

    initial: float = 1.0
    cap: float = 300.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial) and self.initial > 0):
            raise ValueError(f"initial must be a positive number of seconds; got {self.initial!r}")
        if not (math.isfinite(self.cap) and self.cap >= self.initial):
            raise ValueError(f"cap must be at least initial ({self.initial!r}); got {self.cap!r}")

    def ceiling(self, attempt: int) -> float:
        """The longest wait before retry number ``attempt`` (0-based)."""
        return min(self.cap, self.initial * 2.0 ** min(max(attempt, 0), 62))

    def delay(self, attempt: int, fraction: float) -> float:
        """The wait before retry number ``attempt``, for a uniform ``fraction`` in [0, 1]."""
        ceiling = self.ceiling(attempt)
        return ceiling / 2 + min(max(fraction, 0.0), 1.0) * ceiling / 2


class Retry:
    """Counts the attempts of one retry loop and hands out its waits.

    Args:
        policy: the backoff policy.
        jitter: returns a uniform number in [0, 1) for each wait (default: the stdlib PRNG).
    """

    def __init__(self, policy: Backoff, jitter: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self._jitter = jitter
        self.attempts = 0

    def next_delay(self, *, busy: bool = False) -> float:
        """The wait before the next attempt; counts one more failed attempt.

        Args:
            busy: the peer said it is busy: count :data:`BUSY_STEPS` more attempts first.
        """
        if busy:
            # Bounded: the ceiling stops at the cap long before the exponent matters (Backoff.ceiling).
            self.attempts = min(self.attempts + BUSY_STEPS, 64)
        delay = self.policy.delay(self.attempts, self._jitter())
        self.attempts += 1
        return delay

    def reset(self) -> None:
        """A session worked: the next failure waits from ``initial`` again."""
        self.attempts = 0
