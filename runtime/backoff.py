"""Capped exponential backoff with jitter, and the retry counter that resets after a healthy session.

One rule for every retry loop of the agent and the collector (reconnecting to the broker,
re-publishing, re-committing to a store that failed): the ``n``-th wait (from 0) has the
ceiling ``min(cap, initial * 2**n)`` and lies uniformly in ``[ceiling / 2, ceiling]``
("equal jitter": the fixed half keeps a floor under the wait, so a broken peer is not
hammered; the random half keeps a fleet that lost its broker at the same moment from
coming back in lock step). After a session that worked, :meth:`Retry.reset` starts again
from ``initial``, so one drop after a day of service does not wait the cap.

The jitter needs no secrecy: by default it comes from the stdlib PRNG; the agent passes its
injected random source so that its tests replay exactly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Backoff", "Retry"]


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

    def next_delay(self) -> float:
        """The wait before the next attempt; counts one more failed attempt."""
        delay = self.policy.delay(self.attempts, self._jitter())
        self.attempts += 1
        return delay

    def reset(self) -> None:
        """A session worked: the next failure waits from ``initial`` again."""
        self.attempts = 0
