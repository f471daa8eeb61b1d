"""The clocks of the tests: :class:`FakeClock` (the simulator's) and :class:`AcceleratedClock`.

The agent ships only :class:`runtime.clock.SystemClock` and has no switch that changes its
sense of time. A test that wants an agent process to live through many days runs it with
``tests/support/agent_launcher.py``, which builds the daemon through its library entry
point (``agent.cli.main(argv, clock=...)``) on an :class:`AcceleratedClock`.
"""

from __future__ import annotations

import asyncio
import math
import time

from fleet.clock import FakeClock

__all__ = ["AcceleratedClock", "FakeClock"]


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
        # The loop gets a turn even when ``when`` has passed: at a high rate a collection cycle
        # can outlast the slot it schedules next, and a daemon whose cycles never await anything
        # would starve its other tasks (the publisher, the API) for as long as it runs.
        await asyncio.sleep(0)
        while (remaining := when - self.time()) > 0:
            await asyncio.sleep(remaining / self.rate)
