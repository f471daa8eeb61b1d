"""When collection cycles run: UTC-aligned slots plus random jitter, missed runs coalesced.

The next cycle's time is computed here (pure), persisted in ``agent.sealed`` and waited for
on the daemon's :class:`runtime.clock.Clock` (``Daemon.run_cycles``):

* Slots are aligned to UTC multiples of the interval (00, 06, 12, 18 for 6 hours, 000 §6)
  and each cycle starts a uniformly random delay (from the injected random source) into its
  slot, so devices do not all connect on the hour.
* A due time that has passed always runs (no misfire grace: a late cycle is never skipped),
  also after a restart, because the due time is persisted.
* However long the device slept, the missed slots collapse into one cycle (coalescing), and
  the next is scheduled from the current time.
* After a suspend, the cycle runs within a minute of waking: ``SystemClock.sleep_until``
  re-reads the wall clock at least once a minute (the event loop's timers stand still
  during a suspend).
* A due time implausibly far in the future (the clock was set back) is recomputed, so a
  clock moved backwards delays a cycle by at most one interval.

The slots are the UTC multiples of the interval, computed here (UTC has no daylight saving,
so the cron rule ``hour="0,6,12,18", minute=0, second=0`` in UTC is exactly that arithmetic).
APScheduler's ``CronTrigger`` gave them until it was found to cost a device memory and start-up
time for one division (docs/benchmarks.md, "Imports a device defers or avoids");
``tests/agent/test_schedule.py`` still checks these
slots against the trigger's for every allowed interval. No scheduler does the waiting: it
would read the system time itself, so no injected clock (simulator, crash and container
tests) could drive it, and its timer runs on the monotonic clock, which stands still during
a suspend; ``docs/schedule.md`` has what was observed.
"""

from __future__ import annotations

import math

from protocol.randomness import RandomSource, uniform_draws

__all__ = ["next_cycle_after", "plausible_next", "slot_seconds"]


def slot_seconds(interval_hours: int) -> int:
    """The length of a slot in seconds; slots start at the UTC multiples of it from 00:00 UTC.

    Raises:
        ValueError: ``interval_hours`` does not divide 24 (the agent's config checks it first).
    """
    if interval_hours <= 0 or 24 % interval_hours:
        raise ValueError(f"interval_hours must divide 24; got {interval_hours}")
    return interval_hours * 3600


def next_cycle_after(t: float, *, interval_hours: int, jitter_seconds: float, rng: RandomSource) -> float:
    """The first slot boundary strictly after ``t``, plus a uniform jitter in ``[0, jitter)``."""
    step = slot_seconds(interval_hours)
    # Boundaries fall on whole seconds: the first one after floor(t) is the first one after t.
    boundary = (math.floor(t) // step + 1) * step
    if jitter_seconds <= 0:
        return float(boundary)
    millis = max(1, int(jitter_seconds * 1000))
    return boundary + uniform_draws(rng, millis, 1)[0] / 1000.0


def plausible_next(due: float, now: float, *, interval_hours: int, jitter_seconds: float) -> bool:
    """False when ``due`` lies further ahead than any freshly computed due time could."""
    return due - now <= interval_hours * 3600 + jitter_seconds + 1.0
