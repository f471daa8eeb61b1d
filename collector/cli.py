"""``ldp-collector``: run the collector, read estimates, check a config.

Verbs:

* ``ldp-collector run`` - the service (MQTT ingest, checkpoints, HTTP API and dashboard).
* ``ldp-collector estimate USE_CASE [--period P] [--json] [--all]`` - the estimate of one use case
  for one period (default: the latest with enough reports to be released, else the latest
  with data), read from the checkpoint database; safe
  while the service runs (SQLite WAL readers do not block the writer).
* ``ldp-collector status [--json]`` - periods, report counts and lifetime counters.
* ``ldp-collector check-config`` - decode the config and the registry, and check every file
  they name (TLS CA, certificate and key, password file, dictionaries, the store's directory):
  each must exist, be readable and parse; a problem names the file and the field. A
  PostgreSQL store (``[store] url``) is connected to, and its schema version reported.

The config file is ``--config PATH``, else ``$LDP_COLLECTOR_CONFIG``, else
``/etc/ldp-collector/collector.toml``. Exit statuses are the table of
:mod:`protocol.exit_status`, shared with ``ldp-agent`` and ``ldp-fleet``: 0 success, 1 runtime
failure, 2 bad config or usage, 7 nothing to estimate yet (no data, or below the release
threshold).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collector.config import CollectorConfig, check_files, load_config
from collector.errors import CollectorError, ConfigError, StoreError, StoreUnavailable
from collector.estimation import compute_estimate, format_estimate, load_dictionary, store_status
from collector.service import load_registry, run_service
from protocol.exit_status import HELP as EXIT_HELP
from protocol.exit_status import ExitStatus
from runtime.console import package_version, quiet_on_closed_pipe

__all__ = ["check_config", "main"]

DEFAULT_CONFIG = "/etc/ldp-collector/collector.toml"
EXIT_RUNTIME, EXIT_CONFIG, EXIT_NOTHING = ExitStatus.ERROR, ExitStatus.CONFIG, ExitStatus.NOT_RELEASED
EXIT_STORE = ExitStatus.STORE_DAMAGED
# The checkpoint store is damaged or missing; restarting cannot help (the unit lists the
# status in RestartPreventExitStatus=, so a damaged store is not a restart loop).


def _config_path(arg: str | None) -> Path:
    return Path(arg or os.environ.get("LDP_COLLECTOR_CONFIG") or DEFAULT_CONFIG)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ldp-collector",
        description=__doc__.split("\n\n")[0],
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument("--config", help=f"collector config file (default: $LDP_COLLECTOR_CONFIG or {DEFAULT_CONFIG})")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("run", help="run the collector service")
    est = sub.add_parser("estimate", help="print the estimate of one use case")
    est.add_argument("use_case")
    est.add_argument("--period", type=int, help="period index (default: the latest that can be released)")
    est.add_argument("--json", action="store_true", help="machine-readable output")
    est.add_argument(
        "--all",
        action="store_true",
        help="also list the entries of a frequency output that are withheld, each with its reason",
    )
    status = sub.add_parser("status", help="periods with data and lifetime counters")
    status.add_argument("--json", action="store_true")
    sub.add_parser("check-config", help="decode the config and the registry and check every file they name")
    sub.add_parser(
        "plan",
        help="choose mechanism parameters for an ε, n and target error (needs no config; see 'plan --help')",
        add_help=False,
    )
    return parser


def check_config(config: CollectorConfig) -> list[str]:
    """Check the registry and every file the config and the registry name; one line per file.

    Raises:
        ConfigError: naming the file and the field of the first problem.
    """
    registry = load_registry(config.registry, source=config.source)
    lines = [f"registry: {config.registry}: {len(registry.use_cases)} use cases ({registry.hash_hex})"]
    tls = config.mqtt.tls
    if tls is not None:
        from collector.mqtt import tls_context  # noqa: PLC0415 - the MQTT adapter, only for its TLS files

        tls_context(tls)
        lines.append(f"mqtt.tls.ca_file: {tls.ca_file or 'the system trust store'}: CA certificates load")
        if tls.cert_file is not None:
            lines.append(f"mqtt.tls.cert_file: {tls.cert_file}: the client certificate loads")
        if tls.key_file is not None:
            lines.append(f"mqtt.tls.key_file: {tls.key_file}: the certificate's private key loads")
    lines += check_files(config)
    if config.store.url is not None:
        from collector.store.factory import describe_store  # noqa: PLC0415 - psycopg only when configured

        lines.append(describe_store(config, registry))
    for name, use_case in registry.use_cases.items():
        field = f"use_cases.{name}.collector.dictionary"
        if use_case.collector.dictionary is None:
            continue
        path = config.registry.parent / use_case.collector.dictionary
        try:
            words = load_dictionary(use_case, config.registry.parent) or ()
        except StoreError as exc:
            cause = exc.__cause__
            problem = getattr(cause, "strerror", None) or str(cause or exc)
            raise ConfigError(str(config.registry), field, f"cannot read the dictionary {path}: {problem}") from exc
        if not words:
            raise ConfigError(str(config.registry), field, f"the dictionary {path} has no entries")
        lines.append(f"{field}: {path}: {len(words)} entries")
    return lines


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _run(config: CollectorConfig) -> int:
    try:
        asyncio.run(run_service(config))
    except (CollectorError, BaseExceptionGroup) as exc:
        # A task of the root group failed: report collector errors plainly, re-raise the rest
        # (a bug: the traceback is the useful output, and the exit status is non-zero).
        leaves = _leaves(exc)
        if not all(isinstance(e, CollectorError) for e in leaves):
            raise
        for leaf in leaves:
            print(f"ldp-collector: {leaf}", file=sys.stderr)
        if any(isinstance(e, ConfigError) for e in leaves):
            return EXIT_CONFIG
        damaged = any(isinstance(e, StoreError) and not isinstance(e, StoreUnavailable) for e in leaves)
        return EXIT_STORE if damaged else EXIT_RUNTIME
    return 0


def _estimate(config: CollectorConfig, use_case: str, period: int | None, as_json: bool, everything: bool) -> int:
    result = compute_estimate(config, use_case, period, withheld=everything)
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True, allow_nan=False))
    else:
        print(format_estimate(result))
    return 0 if result.get("released") else EXIT_NOTHING


def _status(config: CollectorConfig, as_json: bool) -> int:
    status: dict[str, Any] = store_status(config)
    if as_json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    print(f"registry {status['registry_hash']}  store {status['store']}")
    for name, info in status["use_cases"].items():
        periods = info["periods"]
        latest = periods[-1] if periods else None
        tail = (
            f"latest from {latest['period_start']}: {latest['reports']:,} reports, {latest['records']:,} records"
            if latest
            else "no data"
        )
        count = f"{len(periods):,} period{'' if len(periods) == 1 else 's'}"
        print(f"  {name:32s} {info['mechanism']:13s} {count:<11s} {tail}")
    instances = status["instances"]
    whose = f" (all of {', '.join(sorted(instances))})" if len(instances) > 1 else ""
    print(f"counters{whose}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(status["counters"].items())))
    if len(instances) > 1:
        # A group shares one store: each member's own share, so an idle or stuck member shows.
        for instance, counters in sorted(instances.items()):
            print(f"  {instance}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(counters.items())))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ldp-collector`` console script."""
    return quiet_on_closed_pipe(lambda: _main(argv))


def _dispatch(config: CollectorConfig, args: argparse.Namespace) -> int:
    if args.verb == "check-config":
        for line in check_config(config):
            print(f"  {line}")
        print(f"{config.source}: ok; every file it names exists, is readable and parses")
        return 0
    if args.verb == "run":
        check_config(config)  # fail fast, naming the file, rather than at the first estimate
        return _run(config)
    if args.verb == "estimate":
        return _estimate(config, args.use_case, args.period, args.json, args.all)
    return _status(config, args.json)


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] == "plan":
        # The planner has its own parser (collector/decoding/plan.py) and needs no config.
        from collector.decoding import plan  # noqa: PLC0415 - only this verb needs it

        return plan.main(words[1:])
    args = _parser().parse_args(words)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _dispatch(load_config(_config_path(args.config)), args)
    except ConfigError as exc:
        print(f"ldp-collector: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except CollectorError as exc:
        print(f"ldp-collector: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except KeyError as exc:
        print(f"ldp-collector: unknown use case {exc.args[0]!r}", file=sys.stderr)
        return EXIT_CONFIG
