"""Clocks: the agent never reads the time or sleeps except through a :class:`Clock`.

* :class:`SystemClock` - the real UTC wall clock. ``sleep_until`` re-reads the wall clock at
  least once a minute, so a machine that was suspended, or whose clock was set forward,
  catches up within a minute instead of sleeping out a stale monotonic timer.
* :class:`FakeClock` - time moves only when a test (or the fleet simulator) advances it;
  many agents can share one in a process.
* :class:`AcceleratedClock` - real time sped up by a factor from a fixed anchor, so an agent
  in a subprocess lives through hundreds of 6-hour cycles in seconds and keeps its timeline
  across restarts. Selected with ``LDP_AGENT_TEST_CLOCK`` (tests only).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import os
import time
from typing import Protocol

__all__ = ["TEST_CLOCK_ENV", "AcceleratedClock", "Clock", "FakeClock", "SystemClock", "clock_from_env"]

TEST_CLOCK_ENV = "LDP_AGENT_TEST_CLOCK"
"""``start=<epoch>,anchor=<real epoch>,rate=<factor>``: run on an :class:`AcceleratedClock`."""


class Clock(Protocol):
    """Wall-clock time (UTC seconds since the epoch) and sleeping."""

    def time(self) -> float:
        """The current wall-clock time."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep for a duration."""
        ...

    async def sleep_until(self, when: float) -> None:
        """Sleep until the wall clock reads at least ``when``."""
        ...


class SystemClock:
    """The real clock."""

    recheck_seconds = 60.0
    """``sleep_until`` re-reads the wall clock at least this often (suspend, clock changes)."""

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, when: float) -> None:
        while (remaining := when - time.time()) > 0:
            await asyncio.sleep(min(remaining, self.recheck_seconds))


class FakeClock:
    """A clock that moves only when told to. For tests and the fleet simulator.

    Args:
        start: the initial wall-clock time.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._now + max(0.0, seconds))

    async def sleep_until(self, when: float) -> None:
        if when <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (when, next(self._seq), fut))
        await fut

    def set(self, when: float) -> None:
        """Set the wall clock (it may move backwards, like a real clock being corrected).

        Sleepers whose deadline has passed are woken; call :meth:`settle` to let them run.
        """
        self._now = float(when)
        self._wake()

    def _wake(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    @property
    def next_deadline(self) -> float:
        """The earliest pending sleeper's deadline (inf when nobody sleeps)."""
        live = [d for d, _, f in self._sleepers if not f.done()]
        return min(live, default=math.inf)

    async def settle(self, rounds: int = 20) -> None:
        """Yield to the event loop so that woken tasks run until they block again."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking every sleeper on the way, in order."""
        target = self._now + seconds
        await self.settle()
        while (nxt := self.next_deadline) <= target:
            self._now = max(self._now, nxt)
            self._wake()
            await self.settle()
        self._now = max(self._now, target)
        await self.settle()


class AcceleratedClock:
    """Real time sped up: ``start + rate * (time.time() - anchor)``.

    Args:
        start: the wall-clock time the accelerated clock shows at ``anchor``.
        anchor: a real ``time.time()`` value (fixed across restarts, so time keeps going).
        rate: how many accelerated seconds pass per real second.
    """

    def __init__(self, *, start: float, anchor: float, rate: float) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be positive; got {rate}")
        self.start = start
        self.anchor = anchor
        self.rate = rate

    def time(self) -> float:
        return self.start + (time.time() - self.anchor) * self.rate

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.rate)

    async def sleep_until(self, when: float) -> None:
        while (remaining := when - self.time()) > 0:
            await asyncio.sleep(remaining / self.rate)


def clock_from_env(environ: dict[str, str] | None = None) -> Clock:
    """The clock the daemon runs on: :class:`SystemClock` unless ``LDP_AGENT_TEST_CLOCK`` is set.

    Raises:
        ValueError: if the variable is set but malformed.
    """
    env = os.environ if environ is None else environ
    spec = env.get(TEST_CLOCK_ENV)
    if not spec:
        return SystemClock()
    try:
        parts = dict(item.split("=", 1) for item in spec.split(","))
        return AcceleratedClock(start=float(parts["start"]), anchor=float(parts["anchor"]), rate=float(parts["rate"]))
    except (KeyError, ValueError) as e:
        raise ValueError(f"{TEST_CLOCK_ENV} must look like start=<epoch>,anchor=<epoch>,rate=<factor>: {e}") from None
