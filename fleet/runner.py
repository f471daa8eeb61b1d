"""Running the simulated devices: in this process, or split across worker processes, with a
progress line on the terminal (or a line per simulated day when the output is a file)."""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import queue
import time
from collections.abc import Sequence
from typing import Any, TextIO

from agent.errors import AgentError, TransportError
from fleet.plan import FleetPlan
from fleet.scale import run_scale
from fleet.sim import run_shard
from fleet.tally import Progress, ShardResult
from fleet.values import GeneratorError

__all__ = ["ProgressDisplay", "shard_ranges", "simulate"]

# --------------------------------------------------------------------------- progress


class ProgressDisplay:
    """One status line on a terminal (redrawn), or a line per simulated day otherwise."""

    def __init__(self, plan: FleetPlan, workers: int, stream: TextIO, *, quiet: bool) -> None:
        self.plan = plan
        self.stream = stream
        self.quiet = quiet
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self._state: dict[int, Progress] = {}
        self._workers = workers
        self._last_day = -1
        self._shards = [len(r) for r in shard_ranges(plan.devices, workers)]

    def update(self, p: Progress) -> None:
        """Take a worker's snapshot and redraw."""
        self._state[p.worker] = p
        if self.quiet:
            return
        total = (self.plan.slots + 1) * self.plan.devices
        done = sum(s.slot * self._shards[w] + s.devices_done for w, s in self._state.items())
        messages = sum(s.messages for s in self._state.values())
        elapsed = time.monotonic() - self.started
        frac = min(done / total, 1.0) if total else 1.0
        slot = min(s.slot for s in self._state.values()) if len(self._state) == self._workers else 0
        day = min(slot // 4 + 1, self.plan.days)
        eta = elapsed / frac - elapsed if frac > 0.01 else math.nan
        rate = messages / elapsed if elapsed > 0 else 0.0
        bar = "#" * int(frac * 24) + "." * (24 - int(frac * 24))
        line = (
            f"[{bar}] {100 * frac:5.1f}%  day {day}/{self.plan.days}  {self.plan.devices:,} devices  "
            f"{messages:,} reports acknowledged ({rate:,.0f}/s)  "
            f"{_clock(elapsed)} elapsed" + (f", ~{_clock(eta)} left" if math.isfinite(eta) else "")
        )
        if self.tty:
            self.stream.write("\r" + line[:150].ljust(150))
            self.stream.flush()
        elif day != self._last_day or frac >= 1.0:
            self._last_day = day
            self.stream.write(line + "\n")
            self.stream.flush()

    def message(self, text: str) -> None:
        """A line of its own (ends the status line on a terminal)."""
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r" + " " * 150 + "\r")
        self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        """End the status line."""
        if not self.quiet and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


# --------------------------------------------------------------------------- running


def shard_ranges(devices: int, workers: int) -> list[range]:
    """Device numbers per worker: contiguous, as equal as possible."""
    workers = max(1, min(workers, devices))
    bounds = [devices * i // workers for i in range(workers + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(workers)]


def _worker_main(plan: FleetPlan, lo: int, hi: int, worker: int, out: Any) -> None:
    """Entry point of a worker process: simulate devices ``lo..hi-1`` and send the result."""
    logging.basicConfig(level=logging.WARNING, format=f"worker {worker}: %(levelname)s %(name)s: %(message)s")
    logging.getLogger("ldp_agent").setLevel(logging.ERROR)
    try:
        result = asyncio.run(run_shard(plan, range(lo, hi), worker=worker, progress=out.put))
    except (TransportError, AgentError, GeneratorError, OSError) as e:
        out.put(("error", worker, f"{type(e).__name__}: {e}"))
    except BaseException as e:
        out.put(("error", worker, f"{type(e).__name__}: {e}"))
        raise
    else:
        out.put(("done", worker, result))


def simulate(
    plan: FleetPlan, *, workers: int, display: ProgressDisplay, timeout: float, scale: bool = False
) -> ShardResult:
    """Run the devices (in this process, or split across worker processes; ``scale``: in bulk,
    in this process, :mod:`fleet.scale`).

    Raises:
        TransportError: if the broker failed.
        TimeoutError: if the workers did not finish within ``timeout`` seconds.
    """
    if scale:
        return asyncio.run(asyncio.wait_for(run_scale(plan, progress=display.update), timeout=timeout))
    ranges = shard_ranges(plan.devices, workers)
    if len(ranges) == 1:
        # The agents log a line per cycle at INFO: far too much for thousands of devices.
        logging.getLogger("ldp_agent").setLevel(logging.ERROR)
        return asyncio.run(
            asyncio.wait_for(run_shard(plan, ranges[0], worker=0, progress=display.update), timeout=timeout)
        )
    ctx = multiprocessing.get_context("spawn")
    channel = ctx.Queue()
    procs = [
        ctx.Process(target=_worker_main, args=(plan, r.start, r.stop, i, channel), name=f"ldp-fleet-{i}", daemon=True)
        for i, r in enumerate(ranges)
    ]
    for proc in procs:
        proc.start()
    results: dict[int, ShardResult] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < len(procs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers did not finish within {timeout:g} s")
            try:
                msg = channel.get(timeout=0.5)
            except queue.Empty:
                dead = [p for i, p in enumerate(procs) if i not in results and p.exitcode not in (None, 0)]
                if dead:
                    raise TransportError(f"worker {dead[0].name} died with exit code {dead[0].exitcode}") from None
                continue
            if isinstance(msg, Progress):
                display.update(msg)
            elif msg[0] == "done":
                results[msg[1]] = msg[2]
            else:
                raise TransportError(f"worker {msg[1]}: {msg[2]}")
    finally:
        _reap(procs, finished=len(results) == len(procs))
        channel.close()
    merged = ShardResult()
    for i in sorted(results):
        merged = merged.merge(results[i])
    return merged


def _reap(procs: Sequence[multiprocessing.process.BaseProcess], *, finished: bool) -> None:
    """Wait for the workers to exit (briefly unless they all reported); end those that do not."""
    for proc in procs:
        proc.join(timeout=5 if finished else 0.1)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
