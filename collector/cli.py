"""``ldp-collector``: run the collector, read estimates, check a config.

Verbs:

* ``ldp-collector run`` - the service (MQTT ingest, checkpoints, HTTP API and dashboard).
* ``ldp-collector estimate USE_CASE [--period P] [--json] [--all]`` - the estimate of one use case
  for one period (an index, or a date or timestamp in it; default: the latest with enough
  reports to be released, else the latest with data), read from the checkpoint database; safe
  while the service runs (SQLite WAL readers do not block the writer).
* ``ldp-collector status [--json]`` - the definitions of every use case, their periods and
  report counts, and lifetime counters; with each broker connection (address, connected or
  not since when, messages received and acknowledged) when the service answers on its HTTP
  address.
* ``ldp-collector check-config`` - decode the config and every registry file it names (the
  current one and ``earlier_registries``), list each file's use cases with their definition
  refs, and check every file they name (TLS CA, certificate and key, password file,
  dictionaries, the store's directory): each must exist, be readable and parse; a problem
  names the file and the field. A PostgreSQL store (``[store] url``) is connected to, and its
  schema version reported.
* ``ldp-collector migrate`` - open the checkpoint store for writing, migrating a store an
  earlier release wrote to this release's schema, and say what it did; the service does the
  same when it starts. Stop the service (every member of a group) first.

A use case on the command line is its name (its current definition) or a definition's ref
(``emoji@5338c1d1``, as ``status`` and ``check-config`` list them).

The config file is ``--config PATH``, else ``$LDP_COLLECTOR_CONFIG``, else
``/etc/ldp-collector/collector.toml``. Exit statuses are the table of
:mod:`runtime.exit_status`, shared with ``ldp-agent`` and ``ldp-fleet``: 0 success, 1 runtime
failure, 2 bad config or usage, 7 nothing to estimate yet (no data, or below the release
threshold).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from collector.config import CollectorConfig, check_files, load_config
from collector.definitions import catalog_of_config, load_catalog
from collector.errors import CollectorError, ConfigError, StoreDamaged, StoreError, StoreUnavailable
from collector.estimation import compute_estimate, load_dictionary, registry_dir
from collector.heap import fewer_young_collections, freeze_start_up
from collector.rendering import format_estimate, format_status
from collector.results import to_json
from collector.service import run_service
from collector.status import store_status, with_brokers
from protocol.metadata import metadata_warnings
from runtime.console import package_version, quiet_on_closed_pipe
from runtime.errors import expected_leaves
from runtime.exit_status import HELP as EXIT_HELP
from runtime.exit_status import ExitStatus

__all__ = ["check_config", "main"]

DEFAULT_CONFIG = "/etc/ldp-collector/collector.toml"
EXIT_RUNTIME, EXIT_CONFIG, EXIT_NOTHING = ExitStatus.ERROR, ExitStatus.CONFIG, ExitStatus.NOT_RELEASED
EXIT_STORE = ExitStatus.STORE_DAMAGED
# The checkpoint store is damaged or missing; restarting cannot help (the unit lists the
# status in RestartPreventExitStatus=, so a damaged store is not a restart loop).


def _config_path(arg: str | None) -> Path:
    return Path(arg or os.environ.get("LDP_COLLECTOR_CONFIG") or DEFAULT_CONFIG)


def _period_arg(text: str) -> int | dt.datetime:
    """``--period``: an index, or a moment in the period (mapped by the use case's period length)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a period index nor a date or ISO 8601 timestamp (2026-11-24, 2026-11-24T08:00Z)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


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
    est.add_argument("use_case", help="a use case's name (its current definition) or a definition's ref (name@hex)")
    est.add_argument(
        "--period",
        type=_period_arg,
        help="the period: its index (as status --json lists them), or a date (2026-11-24) or an ISO 8601 "
        "timestamp in it, UTC unless it names an offset (default: the latest that can be released)",
    )
    est.add_argument("--json", action="store_true", help="machine-readable output")
    est.add_argument(
        "--all",
        action="store_true",
        help="also list the entries of a frequency output that are withheld, each with its reason",
    )
    status = sub.add_parser("status", help="periods with data and lifetime counters")
    status.add_argument("--json", action="store_true")
    sub.add_parser("check-config", help="decode the config and the registry files and check every file they name")
    sub.add_parser("migrate", help="migrate a checkpoint store written by an earlier release (stop the service first)")
    sub.add_parser(
        "plan",
        help="choose mechanism parameters for an ε, n and target error (needs no config; see 'plan --help')",
        add_help=False,
    )
    return parser


def check_config(config: CollectorConfig, *, now: float | None = None) -> list[str]:
    """Check the registry files and every file the config and the registries name; one line per file,
    then a warning per use case of the current registry without an owner or an end date, or past
    its end date (at ``now``, default the time).

    Raises:
        ConfigError: naming the file and the field of the first problem.
    """
    catalog = load_catalog(config)
    lines = []
    for i, registry in enumerate(catalog.registries):
        field = "registry" if i == 0 else f"earlier_registries[{i - 1}]"
        refs = ", ".join(uc.ref for uc in registry.use_cases.values())
        lines.append(
            f"{field}: {registry.source}: {len(registry.use_cases)} use cases (registry {registry.hash_hex[:16]}): "
            f"{refs}"
        )
    for ref, day in catalog.retired.items():
        lines.append(f"retire: {ref}: reports for periods from {day.isoformat()} on are refused (retired)")
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
    if config.http.exposure_warning is not None:
        lines.append(f"warning: {config.http.exposure_warning}")
    if config.store.url is not None:
        from collector.store.factory import describe_store  # noqa: PLC0415 - psycopg only when configured

        lines.append(describe_store(config, catalog))
    for use_case in catalog.use_cases.values():
        field = f"use_cases.{use_case.name}.collector.dictionary"
        if use_case.collector.dictionary is None:
            continue
        base = registry_dir(catalog, use_case)
        path = base / use_case.collector.dictionary
        try:
            words = load_dictionary(use_case, base) or ()
        except StoreError as exc:
            cause = exc.__cause__
            problem = getattr(cause, "strerror", None) or str(cause or exc)
            where = catalog.sources(use_case)[0]
            raise ConfigError(where, field, f"cannot read the dictionary {path}: {problem}") from exc
        if not words:
            raise ConfigError(catalog.sources(use_case)[0], field, f"the dictionary {path} has no entries")
        line = f"{field}: {path}: {len(words)} entries"
        if line not in lines:
            lines.append(line)
    # The agent's check-config says the same of the same registry (protocol/metadata.py).
    metadata = ((name, uc.metadata) for name, uc in catalog.current.use_cases.items())
    moment = time.time() if now is None else now
    lines += [f"warning: {line}" for line in metadata_warnings(metadata, now=moment)]
    return lines


def migrate(config: CollectorConfig) -> list[str]:
    """Open the store for writing (which migrates an older schema in place) and say what it holds.

    Raises:
        StoreError: the store is damaged, newer than this release, or cannot be reached.
        ConfigError: a registry file cannot be loaded.
    """
    from collector.store import open_store  # noqa: PLC0415 - only this verb writes

    catalog = load_catalog(config)
    store = open_store(config, catalog)
    try:
        found = sorted(store.use_case_names())
        return [
            f"{store.location}: at this release's schema; {len(found)} of the {len(catalog.use_cases)} accepted "
            "definitions have a row",
            *(f"  {ref}" for ref in found),
        ]
    finally:
        store.close()


def _run(config: CollectorConfig) -> int:
    fewer_young_collections()
    try:
        asyncio.run(run_service(config, on_ready=freeze_start_up))
    except (CollectorError, BaseExceptionGroup) as exc:
        # A task of the root group failed: report collector errors plainly, re-raise the rest
        # (a bug: the traceback is the useful output, and the exit status is non-zero).
        leaves = expected_leaves(exc, CollectorError)
        if leaves is None:
            raise
        for leaf in leaves:
            print(f"ldp-collector: {leaf}", file=sys.stderr)
        if any(isinstance(e, ConfigError) for e in leaves):
            return EXIT_CONFIG
        damaged = any(isinstance(e, StoreError) and not isinstance(e, StoreUnavailable) for e in leaves)
        return EXIT_STORE if damaged else EXIT_RUNTIME
    return 0


def _estimate(
    config: CollectorConfig, use_case: str, period: int | dt.datetime | None, as_json: bool, everything: bool
) -> int:
    catalog = catalog_of_config(config)
    uc = catalog.resolve(use_case)
    if uc is None:
        # A wrong command line (2), as ldp-agent record says it, with the names it could have been.
        known = ", ".join(catalog.names())
        print(f"ldp-collector: unknown use case or definition {use_case!r}; the use cases are {known}", file=sys.stderr)
        return EXIT_CONFIG
    if isinstance(period, dt.datetime):
        # Period p of a use case is [p * seconds, (p + 1) * seconds) in Unix time (estimation.period_bounds).
        period = math.floor(period.timestamp()) // uc.period.seconds
    result = compute_estimate(config, use_case, period, withheld=everything)
    print(to_json(result, indent=2).decode() if as_json else format_estimate(result))
    return 0 if result.released else EXIT_NOTHING


def _status(config: CollectorConfig, as_json: bool) -> int:
    status = with_brokers(store_status(config), config)
    print(to_json(status, indent=2).decode() if as_json else format_status(status))
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
    if args.verb == "migrate":
        for line in migrate(config):
            print(line)
        return 0
    return _status(config, args.json)


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] == "plan":
        # The planner has its own parser (collector/planner/parser.py) and needs no config.
        from collector import planner  # noqa: PLC0415 - only this verb needs it

        return planner.main(words[1:])
    args = _parser().parse_args(words)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _dispatch(load_config(_config_path(args.config)), args)
    except ConfigError as exc:
        print(f"ldp-collector: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StoreDamaged as exc:
        # The same status as `run` on a damaged store: restarting (or re-running) cannot help.
        print(f"ldp-collector: {exc}", file=sys.stderr)
        return EXIT_STORE
    except CollectorError as exc:
        print(f"ldp-collector: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except KeyError as exc:
        known = f"; known: {', '.join(exc.args[1])}" if len(exc.args) > 1 else ""
        print(f"ldp-collector: unknown use case {exc.args[0]!r}{known}", file=sys.stderr)
        return EXIT_CONFIG
