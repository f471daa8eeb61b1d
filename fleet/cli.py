"""``ldp-fleet``: simulate a fleet of devices against a real broker and a real collector.

Every simulated device is a complete agent (:mod:`fleet.sim`): its own sealed state,
daily limits, ε accounting, permanent randomness and memo tables, privatizing on the
"device" and publishing msgpack reports with QoS 1 through the agent's MQTT transport
(TLS and authentication as configured). Simulated time runs in 6-hour collection slots, so
days pass in seconds; the values the devices record come from generators or from a
population file the user supplies (:mod:`fleet.values`). Each report asks for the
collector's commit receipt; when every report has its receipt (counted, or refused with a
reason), the simulator reads the collector's estimates over its HTTP API and prints them next
to the truth, per use-case definition and period, with the error in standard errors
(:mod:`fleet.report`). ``--registry-change FILE`` moves half the fleet to a second registry
mid-run, as a rollout does; every definition is then compared on its own.

Exit status (``protocol/exit_status.py``): 0 when every compared error is within the
tolerance (5 SE by default), 9 when some is not, 2 for a usage or input error, 8 when the
broker or the collector failed or a report was not counted, 3 when every value was refused.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import importlib.util
import json
import logging
import math
import multiprocessing
import queue
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from agent.config import BrokerConfig, PolicyConfig, read_password, tls_context
from agent.errors import AgentError, ConfigError, PolicyError, TransportError
from agent.policy import check_registry
from fleet.report import (
    CollectorClient,
    CollectorUnavailableError,
    UseCaseSummary,
    compare_period,
    format_results,
    summarize,
    write_plots,
)
from fleet.sim import (
    SLOT_SECONDS,
    FleetPlan,
    Progress,
    RegistryChange,
    ShardResult,
    Tally,
    build_generators,
    run_shard,
    tally_kind,
)
from fleet.values import KINDS, GeneratorError, GeneratorSpec, default_spec, load_population, parse_spec
from protocol.catalog import Catalog
from protocol.exit_status import HELP as EXIT_HELP
from protocol.exit_status import ExitStatus
from protocol.registry import Registry, RegistryError, UseCase, parse_registry
from runtime.console import package_version, quiet_on_closed_pipe
from runtime.errors import SettingFileError
from runtime.registry_file import read_registry_bytes

__all__ = ["FleetError", "ProgressDisplay", "build_plan", "main", "run_fleet", "shard_ranges", "simulate"]

log = logging.getLogger("ldp_fleet")

# The exit statuses shared by the three tools (protocol/exit_status.py).
EXIT_OK, EXIT_BEYOND, EXIT_USAGE = ExitStatus.OK, ExitStatus.BEYOND_TOLERANCE, ExitStatus.CONFIG
EXIT_SERVICE, EXIT_NOTHING_SENT = ExitStatus.UNAVAILABLE, ExitStatus.REFUSED
DEFAULT_BROKER = "127.0.0.1:8883"  # the TLS listener of deploy/mosquitto/mosquitto.conf
DEFAULT_REGISTRY = Path("deploy/fleet.usecases.toml")


class FleetError(Exception):
    """A problem with the simulation's inputs (exit status 2)."""


# --------------------------------------------------------------------------- command line

_EPILOG = f"""
generators (--generator USE_CASE=KIND[:key=value,...]):
  {", ".join(KINDS)}
  e.g.  --generator app-usage-seconds=normal:mean=4000,sd=1500
        --generator emoji=exp-strings:scale=20   --generator dark-mode-enabled=bernoulli:p=0.6
  Any random kind takes per=device (drawn once per device) or per=period (redrawn every period).
  Defaults: counters drift slowly (1BitMean) or are exponential (dBitFlip), flags are
  Bernoulli(0.3) per device, strings are Zipf over the use case's dictionary or categories.

populations (--population [USE_CASE=]FILE, CSV with a header):
  value,weight            each device draws its value from the rows, weighted
  device,period,value     per-device time series; period = offset from the start, in the
                          use case's periods (0, 1, ...); --devices defaults to the number
                          of devices in the file

examples:
  ldp-fleet --devices 1000 --days 7 --broker 127.0.0.1:8883 --ca-file ca.pem \\
      --username devices --password-file devices.password --collector-url http://127.0.0.1:8650
  ldp-fleet --use-case app-usage-seconds --population app-usage-seconds=usage.csv --output out.json ...
  ldp-fleet --no-tls --broker 127.0.0.1:1883 ...   (a plain test broker)

The collector must accept the simulated periods: its ingest.retention_periods must reach back
to the start (the default start is --days days before today, 00:00 UTC).

{EXIT_HELP}
"""


def _count(n: int, noun: str) -> str:
    """``1 day``, ``2 days``, ``1,000 devices``."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ldp-fleet",
        description=(
            "Simulate N devices, each a real ldp-agent (own sealed state, limits, privatization, memo), "
            "publishing through a real MQTT broker to a real collector on an accelerated clock; then "
            "print the collector's estimates next to the truth, per use case and period."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sim = p.add_argument_group("simulation")
    sim.add_argument("--devices", type=int, help="simulated devices (default 1000, or the time series' devices)")
    sim.add_argument("--days", type=int, default=7, help="simulated days (default 7)")
    sim.add_argument(
        "--start", help="first simulated day, YYYY-MM-DD (UTC; default: --days days before today, so all periods ended)"
    )
    sim.add_argument("--seed", type=int, default=1, help="seed of the devices' coins and of the values (default 1)")
    sim.add_argument(
        "--registry",
        type=Path,
        default=DEFAULT_REGISTRY,
        help=f"use-case registry, the collector's (default {DEFAULT_REGISTRY})",
    )
    sim.add_argument(
        "--registry-change",
        type=Path,
        metavar="FILE",
        help="a second registry: every second device moves to it at --change-at-day (a rollout); the collector "
        "must be given both files (earlier_registries)",
    )
    sim.add_argument(
        "--change-at-day",
        type=int,
        help="the simulated day (1 = the first) at whose start half the fleet moves (default: the middle day)",
    )
    sim.add_argument(
        "--use-case",
        action="append",
        default=[],
        metavar="NAME",
        help="simulate this use case (repeatable; default: all of the registry)",
    )
    sim.add_argument(
        "--generator",
        action="append",
        default=[],
        metavar="USE_CASE=SPEC",
        help="value generator of a use case (repeatable; see below)",
    )
    sim.add_argument(
        "--population",
        action="append",
        default=[],
        metavar="[USE_CASE=]FILE",
        help="replay a population CSV into a use case (repeatable; see below)",
    )
    sim.add_argument("--workers", type=int, default=1, help="worker processes sharing the devices (default 1)")
    sim.add_argument(
        "--jitter", type=float, default=1800.0, help="collection-cycle jitter in seconds, as on devices (default 1800)"
    )
    sim.add_argument(
        "--timeout", type=float, default=7200.0, help="stop the simulation after this many seconds (default 7200)"
    )
    sim.add_argument(
        "--state-dir", type=Path, help="keep the devices' sealed state in files here (default: sealed, in memory)"
    )
    net = p.add_argument_group("broker (as an agent connects)")
    net.add_argument(
        "--broker",
        default=DEFAULT_BROKER,
        help=f"HOST:PORT (default {DEFAULT_BROKER}, the TLS listener of the shipped broker config)",
    )
    net.add_argument(
        "--tls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="connect with TLS (default: on, as deploy/mosquitto requires; --no-tls for a plain test broker)",
    )
    net.add_argument("--ca-file", type=Path, help="CA certificate to verify the broker with")
    net.add_argument("--cert-file", type=Path, help="client certificate (mutual TLS)")
    net.add_argument("--key-file", type=Path, help="its private key")
    net.add_argument("--username", help="broker user name (the ACL's devices role)")
    net.add_argument("--password-file", type=Path, help="file holding the password (mode 0600)")
    net.add_argument("--connections", type=int, default=4, help="pooled broker connections per worker (default 4)")
    out = p.add_argument_group("collector and results")
    out.add_argument(
        "--collector-url", help="the collector's HTTP API, e.g. http://127.0.0.1:8650 (without it: truth only)"
    )
    out.add_argument(
        "--ingest-timeout",
        type=float,
        default=600.0,
        help="seconds to wait, after the last report, for the collector to count them all (default 600)",
    )
    out.add_argument(
        "--receipts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask for the collector's commit receipt for every report and end only when each has one "
        "(default: on; --no-receipts: a report is done at the broker's acknowledgement)",
    )
    out.add_argument("--tolerance", type=float, default=5.0, help="pass when every |error| <= this many SE (default 5)")
    out.add_argument(
        "--json", action="store_true", help="print the results document as JSON on stdout instead of the table"
    )
    out.add_argument("--output", type=Path, metavar="FILE", help="write the results document (JSON) to FILE")
    out.add_argument("--plots", type=Path, metavar="DIR", help="write one SVG per use case here")
    out.add_argument("--quiet", action="store_true", help="no progress display")
    return p


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise FleetError(f"--broker must be HOST:PORT; got {text!r}")
    return host.strip("[]"), int(port)


def _start_of(args: argparse.Namespace) -> int:
    if args.start:
        try:
            day = dt.date.fromisoformat(args.start)
        except ValueError:
            raise FleetError(f"--start must be a date YYYY-MM-DD; got {args.start!r}") from None
        return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp())
    today = int(time.time()) // 86_400 * 86_400
    return today - int(args.days) * 86_400


def _assignments(items: Sequence[str], flag: str, names: Sequence[str]) -> dict[str, str]:
    """``USE_CASE=VALUE`` items as a mapping (a bare ``FILE`` population when one use case is simulated)."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not (eq and name in names):
            if flag == "--population" and len(names) == 1:
                name, value = names[0], item
            elif eq:
                raise FleetError(f"{flag} {item!r}: {name!r} is not a simulated use case ({', '.join(names)})")
            else:
                raise FleetError(f"{flag} {item!r}: write USE_CASE=..., several use cases are simulated")
        if name in out:
            raise FleetError(f"{flag}: {name} is given twice")
        out[name] = value
    return out


def build_plan(args: argparse.Namespace) -> tuple[FleetPlan, Registry]:
    """Turn the command line into a checked simulation plan.

    Raises:
        FleetError: for anything wrong in the inputs (the message says what and where).
    """
    text, registry = _read_registry(args.registry, "--registry")
    change = _change(args, registry)
    names = _use_case_names(args, registry, None if change is None else change.registry())
    simulated = registry if change is None else _merged(registry, change.registry())
    specs, populations, devices = _generators(args, simulated, names)
    if devices < 1 or args.days < 1:
        raise FleetError("--devices and --days must be at least 1")
    if args.workers < 1 or args.connections < 1:
        raise FleetError("--workers and --connections must be at least 1")
    plan = FleetPlan(
        registry_text=text,
        registry_path=str(args.registry),
        use_cases=names,
        generators=specs,
        populations=populations,
        devices=devices,
        days=args.days,
        start=_start_of(args),
        seed=args.seed,
        broker=_broker(args),
        connections=args.connections,
        jitter_seconds=args.jitter,
        state_dir=str(args.state_dir) if args.state_dir else None,
        change=change,
        receipts=bool(args.receipts),
        receipt_wait=float(args.ingest_timeout),
    )
    try:
        build_generators(plan)  # fail here, before any worker starts
    except GeneratorError as e:
        raise FleetError(str(e)) from None
    return plan, registry


def _read_registry(path: Path, flag: str) -> tuple[bytes, Registry]:
    try:
        text = read_registry_bytes(path)  # the simulated devices parse the same bytes
    except SettingFileError as e:
        hint = " (run from the repository root, or pass --registry)" if path == DEFAULT_REGISTRY else ""
        raise FleetError(f"{flag}: {e.problem}{hint}") from None
    try:
        registry = parse_registry(text, source=str(path))
        check_registry(registry, PolicyConfig())
    except (RegistryError, PolicyError) as e:
        raise FleetError(str(e)) from None
    return text, registry


def _change(args: argparse.Namespace, registry: Registry) -> RegistryChange | None:
    """The registry change the command line asks for, checked against the first registry."""
    if args.registry_change is None:
        if args.change_at_day is not None:
            raise FleetError("--change-at-day needs --registry-change")
        return None
    text, second = _read_registry(args.registry_change, "--registry-change")
    day = args.change_at_day if args.change_at_day is not None else (args.days + 1) // 2 + 1
    if not 2 <= day <= args.days:
        raise FleetError(
            f"--change-at-day must be a day after the first and within --days (2 to {args.days}); got {day}"
            + ("; simulate at least 2 days" if args.days < 2 else "")
        )
    for name, uc in second.use_cases.items():
        first = registry.use_cases.get(name)
        if first is not None and first.period is not uc.period:
            # A simulated value is drawn per period of one length; a device's value cannot be
            # told apart from a report's period of another.
            raise FleetError(
                f"--registry-change: {name} has period {first.period.value} in {args.registry} and "
                f"{uc.period.value} in {args.registry_change}; the simulator cannot change a period"
            )
    if second.hash == registry.hash:
        raise FleetError(f"--registry-change: {args.registry_change} is the same registry as {args.registry}")
    return RegistryChange(
        registry_text=text, registry_path=str(args.registry_change), at_slot=(day - 1) * 86_400 // SLOT_SECONDS
    )


def _merged(first: Registry, second: Registry) -> Registry:
    """The use cases a simulation with a change draws values for: the first registry's, and the
    second's that the first does not have (a use case added)."""
    use_cases = dict(first.use_cases) | {n: uc for n, uc in second.use_cases.items() if n not in first.use_cases}
    return dataclasses.replace(first, use_cases=use_cases)


def _use_case_names(args: argparse.Namespace, registry: Registry, second: Registry | None) -> tuple[str, ...]:
    known = list(registry.use_cases) + [n for n in (second.use_cases if second else {}) if n not in registry.use_cases]
    names = tuple(args.use_case) or tuple(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise FleetError(f"--use-case {unknown[0]!r} is not in {args.registry} ({', '.join(known)})")
    if len(set(names)) != len(names):
        raise FleetError("--use-case: a use case is named twice")
    return names


def _generators(
    args: argparse.Namespace, registry: Registry, names: tuple[str, ...]
) -> tuple[dict[str, GeneratorSpec], dict[str, str], int]:
    """Each use case's generator, the population files, and the number of devices."""
    populations = {n: str(Path(v)) for n, v in _assignments(args.population, "--population", names).items()}
    specs: dict[str, GeneratorSpec] = {}
    try:
        for name, spec in _assignments(args.generator, "--generator", names).items():
            specs[name] = parse_spec(spec)
        for name in names:
            if name in populations:
                # --population FILE, optionally with --generator NAME=population:per=... for the options.
                if name in specs and specs[name].kind != "population":
                    raise FleetError(f"{name}: both --generator {specs[name]} and --population are given")
                params = dict(specs[name].params) if name in specs else {}
                params.pop("path", None)
                specs[name] = GeneratorSpec("population", params)
            elif name in specs and specs[name].kind == "population":
                if "path" not in specs[name].params:
                    raise FleetError(f"{name}: generator population needs path=FILE (or --population)")
                populations[name] = specs[name].params["path"]
            specs.setdefault(name, default_spec(registry.use_cases[name]))
        devices: int = args.devices
        if devices is None:
            series = [load_population(Path(p)) for p in populations.values()]
            sizes = [len(s.series) for s in series if s.series is not None]
            devices = min(sizes) if sizes else 1000
    except GeneratorError as e:
        raise FleetError(str(e)) from None
    return specs, populations, devices


def _broker(args: argparse.Namespace) -> BrokerConfig:
    host, port = _host_port(args.broker)
    try:
        broker = BrokerConfig(
            host=host,
            port=port,
            tls=bool(args.tls),
            ca_file=args.ca_file,
            cert_file=args.cert_file,
            key_file=args.key_file,
            username=args.username,
            password_file=args.password_file,
            keepalive=30,
            publish_timeout=30.0,
        )
        # Every file the options name is read now, so a missing CA says so before anything runs.
        tls_context(broker)
        read_password(broker)
    except ConfigError as e:
        raise FleetError(f"--{e.field.rpartition('.')[2].replace('_', '-')}: {e.problem}") from None
    except ValueError as e:
        raise FleetError(f"broker settings: {e}") from None
    return broker


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


def simulate(plan: FleetPlan, *, workers: int, display: ProgressDisplay, timeout: float) -> ShardResult:
    """Run the devices (in this process, or split across worker processes).

    Raises:
        TransportError: if the broker failed.
        TimeoutError: if the workers did not finish within ``timeout`` seconds.
    """
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


def _truth_json(use_case: UseCase, tally: Tally) -> dict[str, Any]:
    kind = tally_kind(use_case)
    if kind == "mean":
        return {"reports": tally.n, "mean": tally.total / tally.n if tally.n else None}
    if kind == "histogram":
        return {"reports": tally.n, "shares": [b / tally.n for b in tally.buckets] if tally.n else []}
    return {"reports": tally.n, "counts": dict(sorted(tally.counts.items(), key=lambda kv: -kv[1]))}


def _labels(catalog: Catalog, refs: Sequence[str]) -> dict[str, str]:
    """How the results name each definition: its use case's name, or its ref where the
    simulation reported under several definitions of that use case."""
    names = [catalog.use_cases[r].name for r in refs]
    return {r: r if names.count(catalog.use_cases[r].name) > 1 else catalog.use_cases[r].name for r in refs}


def _simulated_refs(plan: FleetPlan, catalog: Catalog, result: ShardResult) -> list[str]:
    """The definitions with a truth, in the catalog's order (the current registry's first)."""
    return [
        ref
        for ref, uc in catalog.use_cases.items()
        if uc.name in plan.use_cases and (ref in result.truth or ref in result.outcomes)
    ]


def _compare_with_collector(
    client: CollectorClient,
    plan: FleetPlan,
    catalog: Catalog,
    result: ShardResult,
    display: ProgressDisplay,
    *,
    timeout: float,
) -> tuple[dict[str, list[dict[str, Any]]], float]:
    """Compare the collector's estimates with the truth, per definition and period.

    With receipts every report's fate is known already (the run ends when each has its receipt);
    without, this first waits until the collector holds as many reports as the broker acknowledged.
    Returns the comparison rows per definition ref and the seconds spent waiting for ingest.
    """
    t0 = time.monotonic()
    counts: dict[str, dict[int, int]] | None = None
    if plan.receipts:
        _check_counted_under_own_definition(client, result)
    else:
        expected = {ref: {p: v[0] for p, v in periods.items()} for ref, periods in result.published.items()}
        last = [0.0]

        def shown(have: int, want: int) -> None:
            if time.monotonic() - last[0] > 2.0 or have >= want:
                last[0] = time.monotonic()
                display.message(f"collector: {have:,} of {want:,} reports committed")

        counts = client.wait_ingested(expected, timeout=timeout, progress=shown)
    ingest_seconds = time.monotonic() - t0
    rows: dict[str, list[dict[str, Any]]] = {}
    for ref in _simulated_refs(plan, catalog, result):
        uc = catalog.use_cases[ref]
        rows[ref] = []
        for period in sorted(result.truth.get(ref, {})):
            tally = result.truth[ref][period]
            estimate = client.estimate(ref, period)
            row = compare_period(uc, tally, estimate)
            held = int(estimate.get("reports", 0)) if counts is None else counts.get(ref, {}).get(period, 0)
            if held != tally.n:
                row["note"] = (
                    f"the collector holds {held} reports for this period, the fleet's counted reports carry "
                    f"{tally.n} values: the store has data from elsewhere"
                )
            rows[ref].append(row)
    return rows, ingest_seconds


def _check_counted_under_own_definition(client: CollectorClient, result: ShardResult) -> None:
    """Every report a receipt said was counted is held under the definition it was made with.

    The collector may hold more (data from elsewhere in its store), never fewer.

    Raises:
        CollectorUnavailableError: naming the first definition and period that hold fewer.
    """
    held, _ = client.report_counts()
    for ref, periods in sorted(result.counted_periods.items()):
        for period, n in sorted(periods.items()):
            have = held.get(ref, {}).get(period, 0)
            if have < n:
                raise CollectorUnavailableError(
                    f"the collector holds {have:,} reports of {ref} for period {period}, where {n:,} of the fleet's "
                    "were counted under that definition"
                )


def _print_verdict(
    summaries: list[UseCaseSummary], catalog: Catalog, tolerance: float, ok: bool, stdout: TextIO
) -> None:
    print(format_results(summaries, catalog.use_cases, tolerance=tolerance), file=stdout)
    print("", file=stdout)
    verdict = (
        f"all {sum(s.compared for s in summaries):,} errors within {tolerance:g} SE"
        if ok
        else "some errors are beyond the tolerance: " + ", ".join(s.name for s in summaries if not s.ok)
    )
    print(f"ldp-fleet: {verdict}", file=stdout)


def _print_truth(plan: FleetPlan, catalog: Catalog, result: ShardResult, stdout: TextIO) -> None:
    """Without a collector: each period's true values, briefly."""
    refs = _simulated_refs(plan, catalog, result)
    labels = _labels(catalog, refs)
    for ref in refs:
        for period, tally in sorted(result.truth.get(ref, {}).items()):
            truth = _truth_json(catalog.use_cases[ref], tally)
            brief = {k: v for k, v in truth.items() if k != "counts"} | (
                {"top": list(truth["counts"].items())[:3]} if "counts" in truth else {}
            )
            print(f"{labels[ref]} period {period}: {json.dumps(brief, ensure_ascii=False)}", file=stdout)


def _receipt_lines(result: ShardResult, labels: dict[str, str]) -> list[str]:
    """What the collector's receipts said of the fleet's own reports, per definition."""
    total = sum(sum(said.values()) for said in result.outcomes.values())
    lines = [
        f"receipts: {result.counted:,} of the fleet's {total + result.missing:,} reports counted"
        + (f", {result.missing:,} without a receipt" if result.missing else "")
    ]
    for ref, said in result.outcomes.items():
        refused = {k: v for k, v in said.items() if k != "counted"}
        if refused:
            parts = ", ".join(f"{v:,} {k}" for k, v in sorted(refused.items()))
            lines.append(f"  {labels.get(ref, ref)}: {said.get('counted', 0):,} counted, {parts}")
    return lines


def _undelivered(result: ShardResult) -> str | None:
    """Why the fleet's reports were not all counted (None when they were, or were refused only as retired)."""
    if result.missing:
        return f"{result.missing:,} reports have no commit receipt: the collector did not count them in time"
    unexpected = {
        status: n
        for said in result.outcomes.values()
        for status, n in said.items()
        if status not in ("counted", "refused: retired")
    }
    if unexpected:
        return "the collector refused reports: " + ", ".join(f"{n:,} {status}" for status, n in unexpected.items())
    return None


def _document(
    args: argparse.Namespace,
    plan: FleetPlan,
    registry: Registry,
    catalog: Catalog,
    result: ShardResult,
    *,
    ok: bool | None,
    labels: dict[str, str],
    refs: list[str],
    summaries: list[UseCaseSummary],
    timing: dict[str, float | None],
    unused_rows: dict[str, dict[str, int]],
) -> dict[str, Any]:
    """The results document (``--json``, ``--output``)."""
    start_iso = dt.datetime.fromtimestamp(plan.start, dt.UTC).isoformat().replace("+00:00", "Z")
    simulated, ingest_seconds = timing["simulate_seconds"], timing["ingest_wait_seconds"]
    return {
        "ok": ok,
        "tolerance_se": args.tolerance,
        "config": {
            "devices": plan.devices,
            "days": plan.days,
            "start": start_iso,
            "seed": plan.seed,
            "registry": plan.registry_path,
            "registry_hash": registry.hash_hex,
            "registry_change": None
            if plan.change is None
            else {
                "registry": plan.change.registry_path,
                "registry_hash": plan.change.registry().hash_hex,
                "at_day": plan.change.at_slot * SLOT_SECONDS // 86_400 + 1,
            },
            "workers": args.workers,
            "generators": {n: str(s) for n, s in plan.generators.items()},
            "populations": plan.populations,
        },
        "timing": {
            "simulate_seconds": simulated,
            "setup_seconds": result.setup_seconds,
            "ingest_wait_seconds": ingest_seconds,
            "reports": result.messages,
            "retries": result.retries,
        },
        "receipts": None
        if not plan.receipts
        else {"counted": result.counted, "missing": result.missing, "by_definition": result.outcomes},
        "epsilon_audit": {"checked": result.epsilon_checked, "problems": result.epsilon_problems},
        "unsent": result.unsent,
        "refused": result.refused,
        "unused_population_rows": unused_rows,
        "use_cases": {
            labels[ref]: {
                "definition": ref,
                "current": catalog.is_current(catalog.use_cases[ref]),
                "mechanism": catalog.use_cases[ref].mechanism.name,
                "epsilon_per_report": catalog.use_cases[ref].cost,
                "period": catalog.use_cases[ref].period.value,
                "truth": {
                    str(p): _truth_json(catalog.use_cases[ref], t) for p, t in sorted(result.truth.get(ref, {}).items())
                },
            }
            | (
                dataclasses.asdict(next(s for s in summaries if s.definition == ref))
                if any(s.definition == ref for s in summaries)
                else {}
            )
            for ref in refs
        },
    }


def _announce(plan: FleetPlan, registry: Registry, display: ProgressDisplay) -> None:
    """The first lines: what is simulated, and the registry change if any."""
    start_iso = dt.datetime.fromtimestamp(plan.start, dt.UTC).isoformat().replace("+00:00", "Z")
    display.message(
        f"ldp-fleet: {_count(plan.devices, 'device')}, {_count(plan.days, 'day')} from {start_iso}, use cases: "
        f"{', '.join(f'{n} ({plan.generators[n]})' for n in plan.use_cases)}; registry {registry.hash_hex[:16]}"
    )
    if plan.change is not None:
        day = plan.change.at_slot * SLOT_SECONDS // 86_400 + 1
        display.message(
            f"ldp-fleet: half the devices move to {plan.change.registry_path} at the start of day {day} "
            f"({plan.change.registry().hash_hex[:16]})"
        )


def _write_files(
    args: argparse.Namespace, text: str, summaries: list[UseCaseSummary], *, stdout: TextIO, stderr: TextIO
) -> None:
    """``--output`` and ``--plots``."""
    if args.output:
        # Written before the plots, so the numbers are kept whatever happens to the pictures.
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
        print(f"ldp-fleet: results in {args.output}", file=stderr if args.json else stdout)
    if args.plots and summaries:
        files = write_plots(summaries, args.plots)
        print(f"ldp-fleet: {len(files)} plots in {args.plots}", file=stderr if args.json else stdout)


def _failure(result: ShardResult, undelivered: str | None, display: ProgressDisplay, stderr: TextIO) -> int | None:
    """The exit status of a run whose reports were not all counted, or whose ε audit found a
    problem (None when neither happened; the audit's all-clear is said)."""
    if undelivered is not None and result.messages:
        print(f"ldp-fleet: {undelivered}", file=stderr)
        return EXIT_SERVICE
    if result.epsilon_problems:
        for problem in result.epsilon_problems:
            print(f"ldp-fleet: ε audit: {problem}", file=stderr)
        return ExitStatus.ERROR
    display.message(
        f"ldp-fleet: ε audit: {result.epsilon_checked:,} (device, use case) ledgers checked: ε spent never went "
        "down and never passed a lifetime cap"
    )
    return None


def run_fleet(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run the whole simulation as the command line asks; returns the exit status."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        plan, registry = build_plan(args)
    except FleetError as e:
        print(f"ldp-fleet: {e}", file=stderr)
        return EXIT_USAGE
    unused_rows = _unused_series_rows(plan, registry)
    catalog = plan.catalog()
    display = ProgressDisplay(plan, args.workers, stderr, quiet=args.quiet)
    client = CollectorClient(args.collector_url) if args.collector_url else None
    _announce(plan, registry, display)
    try:
        if client is not None:
            client.wait_connected(timeout=60.0)
        wall = time.monotonic()
        result = simulate(plan, workers=args.workers, display=display, timeout=args.timeout)
        simulated = time.monotonic() - wall
        display.finish()
        display.message(
            f"simulated {_count(plan.devices, 'device')} x {_count(plan.days, 'day')} in {simulated:.1f} s: "
            f"{result.messages:,} reports acknowledged by the broker"
            + (f", {result.retries} publish retries" if result.retries else "")
        )
        refs = _simulated_refs(plan, catalog, result)
        labels = _labels(catalog, refs)
        if plan.receipts:
            for line in _receipt_lines(result, labels):
                display.message(f"ldp-fleet: {line}")
        undelivered = _undelivered(result) if plan.receipts else None
        rows: dict[str, list[dict[str, Any]]] = {}
        ingest_seconds = None
        if client is not None and undelivered is None:
            rows, ingest_seconds = _compare_with_collector(
                client, plan, catalog, result, display, timeout=args.ingest_timeout
            )
    except (TransportError, CollectorUnavailableError, TimeoutError) as e:
        display.finish()
        print(f"ldp-fleet: {e}", file=stderr)
        return EXIT_SERVICE
    failed = _failure(result, undelivered, display, stderr)
    if failed is not None:
        return failed
    summaries = [summarize(labels[r], catalog.use_cases[r], rows[r], args.tolerance) for r in refs if r in rows]
    for summary in summaries:
        summary.current = catalog.is_current(catalog.use_cases[summary.definition])
    ok = bool(summaries) and all(s.ok for s in summaries)
    document = _document(
        args,
        plan,
        registry,
        catalog,
        result,
        ok=ok if client is not None else None,
        labels=labels,
        refs=refs,
        summaries=summaries,
        timing={"simulate_seconds": simulated, "ingest_wait_seconds": ingest_seconds},
        unused_rows=unused_rows,
    )
    text = json.dumps(_finite(document), indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    if args.json:
        stdout.write(text)
    elif client is not None:
        _print_verdict(summaries, catalog, args.tolerance, ok, stdout)
    else:
        _print_truth(plan, catalog, result, stdout)
    # What was not sent is said, on stderr so that --json output stays one document.
    for line in _dropped_lines(result, unused_rows):
        print(f"ldp-fleet: {line}", file=stderr)
    _write_files(args, text, summaries, stdout=stdout, stderr=stderr)
    return _exit_status(result, compared=client is not None, ok=ok, stderr=stderr)


def _exit_status(result: ShardResult, *, compared: bool, ok: bool, stderr: TextIO) -> int:
    """The run's exit status once its results are out (``protocol/exit_status.py``)."""
    if result.messages == 0:
        refused = sum(result.refused.values())
        why = f"every value was refused ({refused:,})" if refused else "no period of the simulated days ended"
        print(f"ldp-fleet: nothing was sent: {why}", file=stderr)
        return EXIT_NOTHING_SENT if refused else ExitStatus.ERROR
    if not compared:
        return EXIT_OK
    return EXIT_OK if ok else EXIT_BEYOND


def _dropped_lines(result: ShardResult, unused_rows: dict[str, dict[str, int]]) -> list[str]:
    """One sentence per kind of value that was not sent: refused, held back, or never used."""
    lines = []
    refused = {k: v for k, v in result.refused.items() if v}
    if refused:
        lines.append(
            f"{sum(refused.values()):,} values refused by the agents (a value its use case does not take, or a "
            f"stopped use case), not sent: {_per_use_case(refused)}"
        )
    unsent = {k: v for k, v in result.unsent.items() if v}
    if unsent:
        lines.append(
            f"{sum(unsent.values()):,} values recorded but not sent (the daily record limit, the lifetime ε cap, "
            f"outbox drops, or a use case a registry change removed): {_per_use_case(unsent)}"
        )
    for name, counts in unused_rows.items():
        parts = []
        if counts.get("past_days"):
            parts.append(f"{counts['past_days']:,} rows past the simulated days (--days)")
        if counts.get("past_devices"):
            parts.append(f"{counts['past_devices']:,} rows of devices beyond --devices")
        if parts:
            lines.append(f"{name}: its time series has {' and '.join(parts)}; those rows were not used")
    return lines


def _per_use_case(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n:,}" for name, n in sorted(counts.items()))


def _unused_series_rows(plan: FleetPlan, registry: Registry) -> dict[str, dict[str, int]]:
    """Per use case replaying a time series: its rows the plan does not reach (past --days, past --devices)."""
    out: dict[str, dict[str, int]] = {}
    for name, path in plan.populations.items():
        try:
            pop = load_population(Path(path))
        except GeneratorError:
            continue  # build_plan has read it already; nothing more to say here
        if pop.series is None:
            continue
        periods = plan.days * 86_400 // registry.use_cases[name].period.seconds
        past_days = sum(1 for row in pop.series[: plan.devices] for offset in row if offset >= periods)
        past_devices = sum(len(row) for row in pop.series[plan.devices :])
        if past_days or past_devices:
            out[name] = {"past_days": past_days, "past_devices": past_devices}
    return out


def _finite(value: object) -> object:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ldp-fleet`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.plots and importlib.util.find_spec("matplotlib") is None:
        # Said before the run, not after minutes of simulation: the plots need the [fleet] extra.
        parser.error("--plots needs matplotlib: pip install 'ldp-telemetry[fleet]'")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return quiet_on_closed_pipe(lambda: run_fleet(args))
    except KeyboardInterrupt:
        print("\nldp-fleet: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
