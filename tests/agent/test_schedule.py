"""APScheduler 3.x drives cycles on the real clock: due jobs run, late ones run at once, suspends catch up."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest

from agent.schedule import ApschedulerWakeups


def test_wakes_at_the_due_time() -> None:
    """A due time a moment ahead wakes the waiter once the wall clock has reached it."""

    async def main() -> float:
        async with ApschedulerWakeups() as w:
            when = time.time() + 0.3
            await asyncio.wait_for(w.wait_until(when), timeout=60)
            return time.time() - when

    assert asyncio.run(main()) >= -0.01


def test_a_missed_due_time_runs_at_once() -> None:
    """misfire_grace_time=None: a due time in the past runs immediately instead of being skipped."""

    async def main() -> None:
        async with ApschedulerWakeups() as w:
            await asyncio.wait_for(w.wait_until(time.time() - 6 * 3600), timeout=60)

    asyncio.run(main())


def test_catches_up_after_a_suspend(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the wall clock jumps past the due time (a suspend), the cycle runs at the next re-check."""
    jump = 7_200.0

    class Later(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Later:
            real = dt.datetime.now(tz)
            return cls.fromtimestamp(real.timestamp() + jump, tz)

    async def main() -> None:
        async with ApschedulerWakeups(recheck_seconds=0.05) as w:
            when = time.time() + 3_600  # an hour away on the monotonic timer
            waiter = asyncio.create_task(w.wait_until(when))
            done, _ = await asyncio.wait({waiter}, timeout=0.1)
            assert not done  # not yet due on either clock
            # The machine "wakes up" two hours later: wall clocks jumped, the monotonic timer did not.
            monkeypatch.setattr("agent.schedule.time.time", lambda: when + 1)
            monkeypatch.setattr("apscheduler.schedulers.base.datetime", Later)
            await asyncio.wait_for(waiter, timeout=60)

    asyncio.run(main())
