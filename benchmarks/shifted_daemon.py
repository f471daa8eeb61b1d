"""``ldp-agent run`` on a wall clock that SIGUSR1 moves forward, for :mod:`benchmarks.bench_agent`.

Run: ``python -m benchmarks.shifted_daemon --config agent.toml`` (as ``ldp-agent --config
agent.toml run``). The daemon is the shipped one, started through :func:`agent.cli.main` with
the host's :class:`runtime.clock.SystemClock` reading ``time.time()`` plus an offset. SIGUSR1
sets the offset so that the clock reads one second past the next midnight UTC: the
collection slot then due has passed and every period (6 hours or a day) recorded into
before the signal has ended, so the daemon runs one collection cycle at once and it closes
every use case's period. The benchmark measures that cycle from outside (``/proc``); the
clock is chosen here, through the library entry point, because no option of the daemon can
choose one (runtime/clock.py).
"""

from __future__ import annotations

import argparse
import signal
import time
from types import FrameType

from agent.cli import main as agent_main
from runtime.clock import SystemClock

__all__ = ["main"]

DAY = 86_400.0


class _Offset:
    """The seconds the daemon's clock runs ahead of the host's."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wall(self) -> float:
        return time.time() + self.seconds

    def to_after_midnight(self, signum: int, frame: FrameType | None) -> None:
        """SIGUSR1: jump to one second past the next midnight UTC."""
        now = self.wall()
        self.seconds += (now // DAY + 1) * DAY + 1.0 - now


def main(argv: list[str] | None = None) -> int:
    """Run the daemon until SIGTERM; SIGUSR1 moves its clock past the next midnight UTC."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the agent's TOML config file")
    args = parser.parse_args(argv)
    offset = _Offset()
    signal.signal(signal.SIGUSR1, offset.to_after_midnight)
    # A short recheck, so the jump is seen within a fraction of a second rather than a minute.
    clock = SystemClock(recheck_seconds=0.2, wall=offset.wall)
    return agent_main(["--config", args.config, "run"], clock=clock)


if __name__ == "__main__":
    raise SystemExit(main())
