"""``ldp-agent`` on an accelerated clock, for tests that need an agent process to live through days.

    python -m tests.support.agent_launcher --rate 720 [--start EPOCH] [--anchor EPOCH] -- ARGS...

runs ``agent.cli.main(ARGS, clock=AcceleratedClock(start, anchor, rate))``: the product's own
entry point, configuration, logging, exit statuses and daemon, with only the clock injected
(the agent has no switch of its own that changes its sense of time). ``--start`` is the time
the clock shows at ``--anchor`` (a real ``time.time()``; both default to now); keep the same
pair across restarts and the accelerated timeline goes on where it was.

The container test copies this file and ``clocks.py`` into the container as the package
``tests.support`` and runs it under the agent's systemd unit with a drop-in ``ExecStart``.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import sys
import time
from collections.abc import Sequence

from agent.cli import main as agent_main
from tests.support.clocks import AcceleratedClock

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the clock's arguments and run ``ldp-agent`` with the rest."""
    parser = argparse.ArgumentParser(prog="agent_launcher", description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, required=True, help="accelerated seconds per real second")
    parser.add_argument("--start", type=float, help="the time the clock shows at --anchor (default: now)")
    parser.add_argument("--anchor", type=float, help="a real time.time() value (default: now)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments of ldp-agent")
    ns = parser.parse_args(argv)
    # A test that finds the agent hung sends SIGUSR1 and reads every thread's stack in the log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    now = time.time()
    anchor = now if ns.anchor is None else ns.anchor
    start = anchor if ns.start is None else ns.start
    rest = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    return agent_main(rest, clock=AcceleratedClock(start=start, anchor=anchor, rate=ns.rate))


if __name__ == "__main__":
    sys.exit(main())
