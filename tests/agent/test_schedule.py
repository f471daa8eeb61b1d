"""Waiting for a cycle on the host's clock: a deadline passed during a suspend is met on waking.

The schedule itself (slots, jitter, coalescing, no misfire grace, restarts) is tested on the
simulator's clock in ``test_daemon.py``; here the real event loop runs against a wall clock
the test moves, as a suspend moves it: the wall clock jumps, the loop's monotonic timers do
not. Nothing waits for real time beyond a few millisecond timers, and nothing is timed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.config import ScheduleConfig
from agent.core import Agent
from agent.daemon import Daemon
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
