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

Exit status (``runtime/exit_status.py``): 0 when every compared error is within the
tolerance (5 SE by default), 9 when some is not, 7 when none is beyond it but some use case
had no estimate released to compare (a fleet too small for its release rule), 2 for a usage or
input error, 8 when the broker or the collector failed or a report was not counted, 3 when
every value was refused.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

import msgspec

from agent.errors import TransportError
from collector.results import to_json
from fleet.arguments import FleetError, build_parser, build_plan, count
from fleet.document import (
    FleetResults,
    build_document,
    dropped_lines,
    labels_of,
    receipt_lines,
    simulated_refs,
    truth_of,
    undelivered,
    unused_series_rows,
)
from fleet.plan import SLOT_SECONDS, FleetPlan
from fleet.report import (
    CollectorClient,
    CollectorUnavailableError,
    PeriodComparison,
    UseCaseSummary,
    compare_with_collector,
    format_results,
    summarize,
    write_plots,
)
from fleet.runner import ProgressDisplay, simulate
from fleet.scale import SCALE_LABEL
from fleet.tally import ShardResult
from protocol.catalog import Catalog
from protocol.registry import Registry
from runtime.console import quiet_on_closed_pipe
from runtime.errors import expected_leaves
from runtime.exit_status import ExitStatus

__all__ = ["main", "run_fleet"]

# The exit statuses shared by the three tools (runtime/exit_status.py).
EXIT_OK, EXIT_BEYOND, EXIT_USAGE = ExitStatus.OK, ExitStatus.BEYOND_TOLERANCE, ExitStatus.CONFIG
EXIT_SERVICE, EXIT_NOTHING_SENT = ExitStatus.UNAVAILABLE, ExitStatus.REFUSED
EXIT_NOTHING_COMPARED = ExitStatus.NOT_RELEASED


def _verdict(summaries: list[UseCaseSummary], tolerance: float, devices: int) -> tuple[str, ExitStatus]:
    """The last line of a compared run, and its exit status.

    Only an error beyond the tolerance is a failure (9). A use case with no estimate released
    is neither a failure nor a pass: a fleet too small for the release rule (``min_reports``
    per period) has nothing to compare, and says so (7, "nothing to show yet").
    """
    compared = sum(s.compared for s in summaries)
    beyond = [s.name for s in summaries if s.beyond]
    if beyond:
        return "some errors are beyond the tolerance: " + ", ".join(beyond), EXIT_BEYOND
    if compared == 0:
        return (
            f"nothing to compare: with {count(devices, 'device')} nothing reaches the release threshold; "
            "try --devices 1000",
            EXIT_NOTHING_COMPARED,
        )
    empty = [s.name for s in summaries if s.compared == 0]
    within = f"all {compared:,} errors within {tolerance:g} SE"
    if empty:
        return f"{within}; nothing to compare for {', '.join(empty)} (no estimate released)", EXIT_NOTHING_COMPARED
    return within, EXIT_OK


def _print_verdict(
    summaries: list[UseCaseSummary], catalog: Catalog, tolerance: float, verdict: str, stdout: TextIO
) -> None:
    print(format_results(summaries, catalog.use_cases, tolerance=tolerance), file=stdout)
    print("", file=stdout)
    print(f"ldp-fleet: {verdict}", file=stdout)


def _print_truth(plan: FleetPlan, catalog: Catalog, result: ShardResult, stdout: TextIO) -> None:
    """Without a collector: each period's true values, briefly (the three largest counts)."""
    refs = simulated_refs(plan, catalog, result)
    labels = labels_of(catalog, refs)
    for ref in refs:
        for period, tally in sorted(result.truth.get(ref, {}).items()):
            truth = truth_of(catalog.use_cases[ref], tally)
            if truth.counts is not None:
                truth = msgspec.structs.replace(truth, counts=dict(list(truth.counts.items())[:3]))
            print(f"{labels[ref]} period {period}: {to_json(truth).decode()}", file=stdout)


def _scale_fits(args: argparse.Namespace, plan: FleetPlan, stderr: TextIO) -> bool:
    """Whether the scale mode, if asked for, can run this plan (it simulates no registry change,
    keeps no state files and runs in one process); says why not."""
    if args.scale and (plan.change is not None or plan.state_dir is not None or args.workers != 1):
        print("ldp-fleet: --scale runs in one process, without --registry-change or --state-dir", file=stderr)
        return False
    return True


def _document_text(document: FleetResults, *, scale: bool) -> str:
    """The results document as JSON; the scale mode's says so first: its devices were not complete agents."""
    labelled = {"mode": SCALE_LABEL} | msgspec.structs.asdict(document) if scale else document
    return to_json(labelled, indent=1).decode() + "\n"


def _announce(plan: FleetPlan, registry: Registry, display: ProgressDisplay, *, scale: bool = False) -> None:
    """The first lines: the scale mode's label (with ``scale``), what is simulated, and the registry change if any."""
    if scale:
        display.message(f"ldp-fleet: {SCALE_LABEL}")
    start_iso = dt.datetime.fromtimestamp(plan.start, dt.UTC).isoformat().replace("+00:00", "Z")
    display.message(
        f"ldp-fleet: {count(plan.devices, 'device')}, {count(plan.days, 'day')} from {start_iso}, use cases: "
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
    # (A run that sent nothing at all because every value was refused ends with its own status.)
    if undelivered is not None and (result.messages or result.outcomes):
        print(f"ldp-fleet: {undelivered}", file=stderr)
        return EXIT_SERVICE
    if result.epsilon_problems:
        for problem in result.epsilon_problems:
            print(f"ldp-fleet: ε audit: {problem}", file=stderr)
        return ExitStatus.ERROR
    if result.epsilon_checked == 0:
        # The scale mode keeps no agent ledgers: there was nothing to audit, which is not an all-clear.
        display.message("ldp-fleet: ε audit: none (no agent ledgers in this mode)")
    else:
        display.message(
            f"ldp-fleet: ε audit: {result.epsilon_checked:,} (device, use case) ledgers checked: ε spent never "
            "went down and never passed a lifetime cap"
        )
    return None


@dataclass(frozen=True)
class _Run:
    """What a simulation gave: the devices' result, and the comparisons with the collector."""

    result: ShardResult
    simulated: float
    refs: list[str]
    labels: dict[str, str]
    not_counted: str | None
    rows: dict[str, list[PeriodComparison]]
    ingest_seconds: float | None


def _simulate_and_compare(
    args: argparse.Namespace,
    plan: FleetPlan,
    catalog: Catalog,
    display: ProgressDisplay,
    client: CollectorClient | None,
) -> _Run:
    """Run the devices; then, when every report was counted, compare the collector's estimates.

    Raises:
        TransportError, CollectorUnavailableError, TimeoutError: the broker or the collector failed.
    """
    if client is not None:
        client.wait_connected(timeout=60.0)
    wall = time.monotonic()
    result = simulate(plan, workers=args.workers, display=display, timeout=args.timeout, scale=args.scale)
    simulated = time.monotonic() - wall
    display.finish()
    display.message(
        f"simulated {count(plan.devices, 'device')} x {count(plan.days, 'day')} in {simulated:.1f} s: "
        f"{result.messages:,} reports acknowledged by the broker"
        + (f", {result.retries} publish retries" if result.retries else "")
    )
    refs = simulated_refs(plan, catalog, result)
    labels = labels_of(catalog, refs)
    if plan.receipts:
        for line in receipt_lines(result, labels):
            display.message(f"ldp-fleet: {line}")
    not_counted = undelivered(result) if plan.receipts else None
    rows: dict[str, list[PeriodComparison]] = {}
    ingest_seconds = None
    if client is not None and not_counted is None:
        rows, ingest_seconds = compare_with_collector(
            client,
            catalog,
            refs,
            result,
            timeout=args.ingest_timeout,
            receipts=plan.receipts,
            progress=_ingest_progress(display),
        )
    return _Run(result, simulated, refs, labels, not_counted, rows, ingest_seconds)


def run_fleet(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run the whole simulation as the command line asks; returns the exit status."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        plan, registry = build_plan(args)
    except FleetError as e:
        print(f"ldp-fleet: {e}", file=stderr)
        return EXIT_USAGE
    if not _scale_fits(args, plan, stderr):
        return EXIT_USAGE
    unused_rows = unused_series_rows(plan, registry)
    catalog = plan.catalog()
    display = ProgressDisplay(plan, args.workers, stderr, quiet=args.quiet)
    client = CollectorClient(args.collector_url) if args.collector_url else None
    _announce(plan, registry, display, scale=args.scale)
    try:
        run = _simulate_and_compare(args, plan, catalog, display, client)
    except (TransportError, CollectorUnavailableError, TimeoutError, ExceptionGroup) as exc:
        # The devices' task group gathers one failure per device (a broker gone mid-run fails
        # them all): the same delivery failure, said once, not a traceback.
        leaves = expected_leaves(exc, (TransportError, CollectorUnavailableError, TimeoutError))
        if leaves is None:
            raise
        display.finish()
        more = f" (and {len(leaves) - 1} more like it)" if len(leaves) > 1 else ""
        print(f"ldp-fleet: {leaves[0]}{more}", file=stderr)
        return EXIT_SERVICE
    result = run.result
    failed = _failure(result, run.not_counted, display, stderr)
    if failed is not None:
        return failed
    summaries = [
        summarize(
            run.labels[r],
            catalog.use_cases[r],
            run.rows[r],
            args.tolerance,
            current=catalog.is_current(catalog.use_cases[r]),
        )
        for r in run.refs
        if r in run.rows
    ]
    ok = bool(summaries) and all(s.ok for s in summaries)
    verdict, compared_status = _verdict(summaries, args.tolerance, plan.devices)
    document = build_document(
        plan,
        registry,
        catalog,
        result,
        ok=ok if client is not None else None,
        tolerance=args.tolerance,
        workers=args.workers,
        labels=run.labels,
        refs=run.refs,
        summaries=summaries,
        timing=(run.simulated, run.ingest_seconds),
        unused_rows=unused_rows,
    )
    text = _document_text(document, scale=args.scale)
    if args.json:
        stdout.write(text)
    elif client is not None:
        _print_verdict(summaries, catalog, args.tolerance, verdict, stdout)
    else:
        _print_truth(plan, catalog, result, stdout)
    # What was not sent is said, on stderr so that --json output stays one document.
    for line in dropped_lines(result, unused_rows):
        print(f"ldp-fleet: {line}", file=stderr)
    _write_files(args, text, summaries, stdout=stdout, stderr=stderr)
    return _exit_status(result, compared=compared_status if client is not None else None, stderr=stderr)


def _ingest_progress(display: ProgressDisplay) -> Callable[[int, int], None]:
    """A line every 2 s while the collector commits what the broker acknowledged."""
    last = [0.0]

    def shown(have: int, want: int) -> None:
        if time.monotonic() - last[0] > 2.0 or have >= want:
            last[0] = time.monotonic()
            display.message(f"collector: {have:,} of {want:,} reports committed")

    return shown


def _exit_status(result: ShardResult, *, compared: ExitStatus | None, stderr: TextIO) -> int:
    """The run's exit status once its results are out (``runtime/exit_status.py``); ``compared``
    is the comparison's own (:func:`_verdict`), ``None`` when no collector was compared."""
    if result.messages == 0:
        refused = sum(result.refused.values())
        why = f"every value was refused ({refused:,})" if refused else "no period of the simulated days ended"
        print(f"ldp-fleet: nothing was sent: {why}", file=stderr)
        return EXIT_NOTHING_SENT if refused else ExitStatus.ERROR
    return EXIT_OK if compared is None else compared


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ldp-fleet`` console script."""
    parser = build_parser()
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
