"""When collection cycles run: UTC-aligned slots plus random jitter, missed runs coalesced.

The next cycle's time is computed here (pure), persisted in ``agent.sealed`` and waited for
by a :class:`Wakeups` implementation:

* :class:`ApschedulerWakeups` (the daemon on a real clock): an APScheduler 3.x
  ``AsyncIOScheduler`` job with a ``DateTrigger`` at the due time, ``coalesce=True`` and
  ``misfire_grace_time=None`` (a late job always runs, never silently skipped). Its timer is
  a monotonic ``call_later``, which stops while the machine is suspended, so the wall clock
  is re-read every minute and the scheduler is woken when the due time has passed: after a
  suspend the cycle runs within a minute of waking, once.
* :class:`ClockWakeups` (fake and accelerated clocks): sleeps on the injected clock.

Slots are aligned to UTC multiples of the interval (00, 06, 12, 18 for 6 hours, 000 §6) and
each cycle starts a uniformly random delay (from the injected random source) into its slot,
so devices do not all connect on the hour. However long the device slept, the missed slots
collapse into one cycle, and the next is scheduled from the current time. A due time
implausibly far in the future (the clock was set back) is recomputed, so a clock moved
backwards delays a cycle by at most one interval.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Protocol, Self

from protocol.randomness import RandomSource, uniform_ints
from runtime.clock import Clock

__all__ = ["ApschedulerWakeups", "ClockWakeups", "Wakeups", "next_cycle_after", "plausible_next"]


def next_cycle_after(t: float, *, interval_hours: int, jitter_seconds: float, rng: RandomSource) -> float:
    """The first slot boundary strictly after ``t``, plus a uniform jitter in ``[0, jitter)``."""
    step = interval_hours * 3600
    boundary = (math.floor(t / step) + 1) * step
    if jitter_seconds <= 0:
        return float(boundary)
    millis = max(1, int(jitter_seconds * 1000))
    return boundary + int(uniform_ints(rng, millis, 1)[0]) / 1000.0


def plausible_next(due: float, now: float, *, interval_hours: int, jitter_seconds: float) -> bool:
    """False when ``due`` lies further ahead than any freshly computed due time could."""
    return due - now <= interval_hours * 3600 + jitter_seconds + 1.0


class Wakeups(Protocol):
    """Waits until a cycle is due."""

    async def wait_until(self, when: float) -> None:
        """Return once the wall clock reads at least ``when``."""
        ...


class ClockWakeups:
    """Waits on the injected clock (tests, simulations, accelerated subprocess runs)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    async def wait_until(self, when: float) -> None:
        await self._clock.sleep_until(when)


class ApschedulerWakeups:
    """Waits through an APScheduler 3.x ``AsyncIOScheduler`` (the daemon on a real clock).

    Use as an async context manager: the scheduler starts on entry and shuts down on exit.

    Args:
        recheck_seconds: how often the wall clock is re-read to catch up after a suspend.
    """

    def __init__(self, recheck_seconds: float = 60.0) -> None:
        self._recheck = recheck_seconds
        self._scheduler: Any = None

    async def __aenter__(self) -> Self:
        from apscheduler.schedulers.asyncio import AsyncIOScheduler  # noqa: PLC0415 - only the real-clock daemon

        self._scheduler = AsyncIOScheduler(timezone=dt.UTC)
        self._scheduler.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self._scheduler = None

    async def wait_until(self, when: float) -> None:
        from apscheduler.triggers.date import DateTrigger  # noqa: PLC0415

        if self._scheduler is None:
            raise RuntimeError("ApschedulerWakeups is used outside its context manager")
        due = asyncio.Event()
        fire: Callable[[], Awaitable[None]] = _setter(due)
        self._scheduler.add_job(
            fire,
            DateTrigger(run_date=dt.datetime.fromtimestamp(when, dt.UTC)),
            id="collection-cycle",
            replace_existing=True,
            coalesce=True,  # however many runs were missed, one runs
            misfire_grace_time=None,  # a late run always runs: no silent skips
            max_instances=1,
        )
        try:
            while not due.is_set():
                try:
                    await asyncio.wait_for(due.wait(), timeout=self._recheck)
                except TimeoutError:
                    if time.time() >= when:
                        # The monotonic timer stood still during a suspend: run the job now.
                        self._scheduler.wakeup()
        finally:
            job = self._scheduler.get_job("collection-cycle")
            if job is not None:
                job.remove()


def _setter(event: asyncio.Event) -> Callable[[], Awaitable[None]]:
    # A coroutine function, so the AsyncIOExecutor runs it on the event loop (a plain function
    # would run in a worker thread, where asyncio.Event is not safe to touch).
    async def fire() -> None:
        event.set()

    return fire
