"""Waiting for a cycle on the host's clock: a deadline passed during a suspend is met on waking.

The schedule itself (slots, jitter, coalescing, no misfire grace, restarts) is tested on the
simulator's clock in ``test_daemon.py``; here the real event loop runs against a wall clock
the test moves, as a suspend moves it: the wall clock jumps, the loop's monotonic timers do
not. Nothing waits for real time beyond a few millisecond timers, and nothing is timed.
"""

from __future__ import annotations

import asyncio
import math
import random
from datetime import UTC, datetime
from pathlib import Path

import pytest
from apscheduler.triggers.cron import CronTrigger

from agent.config import ScheduleConfig
from agent.core import Agent
from agent.daemon import Daemon
from agent.schedule import next_cycle_after
from agent.sealed import Sealer
from agent.transport import MemoryTransport
from protocol.randomness import SeededRandom
from protocol.registry import Registry
from runtime.clock import SystemClock
from tests.agent.conftest import KEY, START

HOUR = 3_600.0


class _Wall:
    """A wall clock that stands still for ``reads`` readings, then jumps (the machine woke up)."""

    def __init__(self, start: float, *, jump_to: float, after: int) -> None:
        self.now = start
        self.jump_to = jump_to
        self.after = after
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads > self.after:
            self.now = self.jump_to
        return self.now


def test_sleep_until_returns_on_the_first_reading_after_a_suspend() -> None:
    """The deadline is an hour away; each timer lasts at most recheck_seconds; the wall clock jumps past it."""
    wall = _Wall(START, jump_to=START + 2 * HOUR, after=3)
    clock = SystemClock(recheck_seconds=0.001, wall=wall)
    asyncio.run(asyncio.wait_for(clock.sleep_until(START + HOUR), timeout=60))
    # three readings before the deadline (each followed by one short timer), then the jump
    assert wall.reads == 4


def test_sleep_until_a_passed_deadline_returns_at_once() -> None:
    """No misfire grace: a deadline already passed returns after one reading, with no timer."""
    wall = _Wall(START, jump_to=START, after=0)
    asyncio.run(SystemClock(wall=wall).sleep_until(START - 6 * HOUR))
    assert wall.reads == 1


def test_recheck_must_be_positive() -> None:
    """A clock that would never re-read the wall clock is refused."""
    with pytest.raises(ValueError, match="recheck_seconds"):
        SystemClock(recheck_seconds=0)


def test_the_daemon_on_the_system_clock_runs_one_cycle_after_a_suspend(tmp_path: Path, registry: Registry) -> None:
    """On SystemClock, a daemon whose cycle fell due during a 20-hour suspend runs it once on waking."""
    wall = _Wall(START, jump_to=START + 20 * HOUR, after=5)
    clock = SystemClock(recheck_seconds=0.001, wall=wall)
    agent = Agent(registry=registry, state_dir=tmp_path / "state", sealer=Sealer(KEY), clock=clock, rng=SeededRandom(7))
    agent.grant_consent()
    schedule = ScheduleConfig(jitter_seconds=600.0)
    daemon = Daemon(agent, MemoryTransport(), clock=clock, rng=SeededRandom(3), schedule=schedule)

    async def main() -> None:
        task = asyncio.create_task(daemon.run_cycles())
        while daemon.cycles_run == 0:  # polled on a short timer; the wall clock is the test's
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), timeout=60))
    doc = agent.load_schedule()
    assert daemon.cycles_run == doc.cycles == 1
    assert doc.last_cycle == START + 20 * HOUR
    # the missed slots coalesced: the next cycle is the first slot after waking, jittered into it
    slot = (START + 20 * HOUR) // (6 * HOUR) * (6 * HOUR) + 6 * HOUR
    assert slot <= doc.next_cycle < slot + 600.0


@pytest.mark.parametrize("hours", [1, 2, 3, 4, 6, 8, 12, 24])
def test_the_cron_slots_are_the_utc_multiples_of_the_interval(hours: int) -> None:
    """A slot is the first UTC multiple of the interval after t, as APScheduler's cron trigger gives it."""
    rng = random.Random(hours)
    step = hours * 3600
    times = [rng.uniform(0, 4e9) for _ in range(300)]
    times += [k * step + d for k in (0, 1, 123_456 // hours) for d in (-1.0, -0.25, 0.0, 0.25, 1.0)]
    trigger = CronTrigger(hour=",".join(str(h) for h in range(0, 24, hours)), minute=0, second=0, timezone=UTC)
    for t in times:
        due = next_cycle_after(t, interval_hours=hours, jitter_seconds=0, rng=SeededRandom(0))
        assert due == (math.floor(t / step) + 1) * step, (hours, t)
        fire = trigger.get_next_fire_time(None, datetime.fromtimestamp(math.floor(t) + 1, UTC))
        assert fire is not None
        assert due == fire.timestamp(), (hours, t)


def test_the_jitter_lies_within_its_slot() -> None:
    """A jittered due time is in [boundary, boundary + jitter) for the first boundary after t."""
    source = SeededRandom(7)
    for t in (0.0, 21_599.9, 21_600.0, 1_764_000_000.5):
        due = next_cycle_after(t, interval_hours=6, jitter_seconds=900, rng=source)
        boundary = (math.floor(t / 21_600) + 1) * 21_600
        assert boundary <= due < boundary + 900


def test_an_interval_that_does_not_divide_a_day_is_refused() -> None:
    with pytest.raises(ValueError, match="divide 24"):
        next_cycle_after(0.0, interval_hours=5, jitter_seconds=0, rng=SeededRandom(0))
