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

The slots are an APScheduler 3.x ``CronTrigger`` in UTC (``hour="0,6,12,18"`` for 6 hours),
asked through its public ``get_next_fire_time(previous, now)`` with ``now`` from the
daemon's clock. APScheduler's *scheduler* does not do the waiting: it reads the system time
itself, so no injected clock (simulator, crash and container tests) could drive it, and
its timer runs on the monotonic clock, which stands still during a suspend;
``docs/schedule.md`` has what was observed.
"""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime

from apscheduler.triggers.cron import CronTrigger

from protocol.randomness import RandomSource, uniform_draws

__all__ = ["next_cycle_after", "plausible_next", "slots"]


@functools.cache
def slots(interval_hours: int) -> CronTrigger:
    """The cron trigger of the slot boundaries: every ``interval_hours`` from 00:00 UTC.

    ``interval_hours`` divides 24 (the agent's config checks it), so the hours are the UTC
    multiples of the interval. The trigger carries no jitter: APScheduler's would come from
    the process-wide ``random`` module, and the jitter here comes from the agent's own source.
    """
    if interval_hours <= 0 or 24 % interval_hours:
        raise ValueError(f"interval_hours must divide 24; got {interval_hours}")
    hours = ",".join(str(h) for h in range(0, 24, interval_hours))
    return CronTrigger(hour=hours, minute=0, second=0, timezone=UTC)


def next_cycle_after(t: float, *, interval_hours: int, jitter_seconds: float, rng: RandomSource) -> float:
    """The first slot boundary strictly after ``t``, plus a uniform jitter in ``[0, jitter)``."""
    # Boundaries fall on whole seconds, so the first one at or after floor(t) + 1 is the
    # first one strictly after t (the trigger's answer includes ``now`` itself).
    after = datetime.fromtimestamp(math.floor(t) + 1, UTC)
    fire: datetime | None = slots(interval_hours).get_next_fire_time(None, after)
    assert fire is not None  # a cron trigger without an end date always has a next time
    boundary = fire.timestamp()
    if jitter_seconds <= 0:
        return float(boundary)
    millis = max(1, int(jitter_seconds * 1000))
    return boundary + uniform_draws(rng, millis, 1)[0] / 1000.0


def plausible_next(due: float, now: float, *, interval_hours: int, jitter_seconds: float) -> bool:
    """False when ``due`` lies further ahead than any freshly computed due time could."""
    return due - now <= interval_hours * 3600 + jitter_seconds + 1.0
