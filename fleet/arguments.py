"""``ldp-fleet``'s command line, and the simulation plan it describes (:class:`fleet.sim.FleetPlan`).

Every option is checked here, before any device runs: a bad generator, population file,
registry or broker setting is a usage error (exit status 2) with a message naming the option.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import time
from collections.abc import Sequence
from pathlib import Path

from agent.brokers import parse_address
from agent.config import BrokerConfig, PolicyConfig, read_password, tls_context
from agent.errors import ConfigError, PolicyError
from agent.policy import check_registry
from fleet.plan import SLOT_SECONDS, FleetPlan, RegistryChange, build_generators
from fleet.scale import SCALE_LABEL
from fleet.values import KINDS, GeneratorError, GeneratorSpec, default_spec, load_population, parse_spec
from protocol.registry import Registry, RegistryError, parse_registry
from runtime.console import package_version
from runtime.errors import SettingFileError
from runtime.exit_status import HELP as EXIT_HELP
from runtime.registry_file import read_registry_bytes

__all__ = ["DEFAULT_BROKER", "DEFAULT_REGISTRY", "FleetError", "build_parser", "build_plan", "count"]

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
      --username fleet-sim --password-file fleet-sim.password --collector-url http://127.0.0.1:8650
  ldp-fleet --use-case app-usage-seconds --population app-usage-seconds=usage.csv --output out.json ...
  ldp-fleet --no-tls --broker 127.0.0.1:1883 ...   (a plain test broker)

The collector must accept the simulated periods: its ingest.retention_periods must reach back
to the start (the default start is --days days before today, 00:00 UTC).

{EXIT_HELP}
"""


def count(n: int, noun: str) -> str:
    """``1 day``, ``2 days``, ``1,000 devices``."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def build_parser() -> argparse.ArgumentParser:
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
    _simulation_options(p.add_argument_group("simulation"))
    _broker_options(p.add_argument_group("broker (as an agent connects)"))
    _result_options(p.add_argument_group("collector and results"))
    return p


def _simulation_options(sim: argparse._ArgumentGroup) -> None:
    sim.add_argument(
        "--devices",
        type=int,
        help="simulated devices (default 1000, or the time series' devices); with fewer than about 100 "
        "nothing reaches the release thresholds, so nothing is compared and the run ends with status 7",
    )
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
    sim.add_argument(
        "--scale",
        action="store_true",
        help=f"{SCALE_LABEL} (one process; no registry change, no state files; see fleet/scale.py)",
    )


def _broker_options(net: argparse._ArgumentGroup) -> None:
    net.add_argument(
        "--broker",
        default=DEFAULT_BROKER,
        help=f"HOST:PORT (default {DEFAULT_BROKER}, the TLS listener of the shipped broker config); several, "
        "comma-separated, spread the devices over the brokers as agents with [broker] addresses do",
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


def _result_options(out: argparse._ArgumentGroup) -> None:
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
    out.add_argument(
        "--tolerance",
        type=_tolerance,
        default=5.0,
        help="pass when every |error| <= this many SE (a positive number; default 5)",
    )
    out.add_argument(
        "--json", action="store_true", help="print the results document as JSON on stdout instead of the table"
    )
    out.add_argument("--output", type=Path, metavar="FILE", help="write the results document (JSON) to FILE")
    out.add_argument("--plots", type=Path, metavar="DIR", help="write one SVG per use case here")
    out.add_argument("--quiet", action="store_true", help="no progress display")


def _tolerance(text: str) -> float:
    """A positive, finite number of standard errors: no error is within a negative one."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of standard errors") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of standard errors (5 is the default)")
    return value


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
    try:
        # The agent's parser of [broker] addresses: HOST:PORT, an IPv6 address in brackets.
        places = [parse_address(text.strip()) for text in str(args.broker).split(",")]
    except ValueError as e:
        raise FleetError(f"--broker must be HOST:PORT[,HOST:PORT...]: {e}") from None
    # One broker as host and port (as before); several as the agent's addresses list.
    one = places[0] if len(places) == 1 else None
    try:
        broker = BrokerConfig(
            host=None if one is None else one.host,
            port=8883 if one is None else one.port,
            addresses=None if one is not None else tuple(str(a) for a in places),
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
