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

APScheduler did this before and was dropped: it cannot run on an injected clock and its
timer misses a suspend; ``docs/schedule.md`` has what was observed.
"""

from __future__ import annotations

import math

from protocol.randomness import RandomSource, uniform_ints

__all__ = ["next_cycle_after", "plausible_next"]


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
