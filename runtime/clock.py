"""The wall clock: the agent and the collector never read the time or sleep except through one.

:class:`SystemClock` is the only clock that ships. The fleet simulator and the tests inject
their own (``fleet/clock.py``, ``tests/support/clocks.py``) through the library entry
points; no environment variable, option or file selects a clock, so a device
daemon's sense of time, and with it the day boundaries its daily record limit counts, is
always the host's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "SystemClock", "WallClock"]


class WallClock(Protocol):
    """Reads the wall-clock time (what the collector needs: period windows, pruning)."""

    def time(self) -> float:
        """UTC seconds since the epoch."""
        ...


class Clock(WallClock, Protocol):
    """Reads the wall-clock time and sleeps (what the agent's daemon needs)."""

    async def sleep(self, seconds: float) -> None:
        """Sleep for a duration."""
        ...

    async def sleep_until(self, when: float) -> None:
        """Sleep until the wall clock reads at least ``when``."""
        ...


class SystemClock:
    """The host's clock.

    ``sleep_until`` re-reads the wall clock at least every ``recheck_seconds``: the event
    loop's timers run on ``CLOCK_MONOTONIC``, which stands still while the machine is
    suspended (clock_gettime(2)), so a single timer set before a suspend would fire late by
    the length of the suspend. Re-reading makes a deadline that passed during a suspend, or
    that a clock set forward has passed, return within ``recheck_seconds`` of waking.

    Args:
        recheck_seconds: the longest single timer ``sleep_until`` sets.
        wall: where the wall-clock time is read (``time.time``; tests pass their own to
            play a suspend against the real event loop).
    """

    def __init__(self, *, recheck_seconds: float = 60.0, wall: Callable[[], float] = time.time) -> None:
        if not recheck_seconds > 0:
            raise ValueError(f"recheck_seconds must be positive; got {recheck_seconds}")
        self.recheck_seconds = recheck_seconds
        self._wall = wall

    def time(self) -> float:
        return self._wall()

    async def sleep(self, seconds: float) -> None:
        import asyncio  # noqa: PLC0415 - only a daemon sleeps; the agent's commands never load asyncio

        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, when: float) -> None:
        import asyncio  # noqa: PLC0415

        while (remaining := when - self._wall()) > 0:
            await asyncio.sleep(min(remaining, self.recheck_seconds))
