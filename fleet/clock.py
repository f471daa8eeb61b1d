"""The simulator's clock: simulated time that moves only when the simulation advances it.

Every simulated device is a complete agent whose daemon reads the time and sleeps through
the :class:`runtime.clock.Clock` it is given; the devices of one worker share one
:class:`FakeClock`, so hundreds of 6-hour cycles pass in seconds and in a reproducible
order. The tests use it too (``tests.support.clocks``). It ships with the simulator, never
with the device daemon, whose only clock is :class:`runtime.clock.SystemClock`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math

__all__ = ["FakeClock"]


class FakeClock:
    """A clock that moves only when told to (the simulator and the tests).

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
