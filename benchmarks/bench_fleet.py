"""Fleet simulator throughput: how many device-cycles per second the simulated agents sustain.

``python -m benchmarks.bench_fleet [--devices N] [--days D]`` prints one JSON document with one
row per configuration, all with the simulator's registry (``deploy/fleet.usecases.toml``, six
use cases) and its default generators:

* ``memory``: the agents publish to an in-memory broker: the agents' own work (sealing
  state, accounting, privatizing, the ledger), nothing else;
* ``mosquitto``: the same fleet publishing through a real Mosquitto on loopback (plain
  MQTT, four pooled connections), acknowledged with QoS 1;
* ``mosquitto-tls``: the same through the deploy configuration (TLS, passwords, ACL);
* ``scale-mosquitto-tls-collector`` (``main`` and ``run(..., scale=True)``): the **scale mode**
  (fleet/scale.py: devices simulated in bulk, not as complete agents; reports privatized per
  device with the vectorised privatizers) through a real Mosquitto in the deploy configuration
  (TLS, the simulator's user, the ACL) into a real collector, every report with its commit
  receipt; ``reports_per_second`` runs until the last receipt, and the CPU per report of the
  simulator, the broker and the collector says where the time goes.

A device-cycle is one device running one 6-hour collection cycle (recording its values,
closing periods, publishing). The full demo (``deploy/run-demo.sh``) adds the collector,
which shares the two cores; its timings are in the README. The fleet is seeded, so every
configuration publishes the same reports: ``checks`` says whether their counts agree.

``target`` is the figure asked of complete agents: 10,000 reports per second at 1,000 devices
x 1 day (the default size), and which configurations meet it at the size measured.
``scale_target`` is the scale mode's: 30,000 reports per second through the broker into the
collector, judged on the median of ``--repeat`` runs (:data:`SCALE_REPEAT`).
``cpu_us_per_report`` is the simulator process's CPU time per report after the set-up (the
broker's and the collector's are their own processes'): unlike the rates, it changes little
with the share of the cores the run gets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import resource
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.config import BrokerConfig
from agent.mqtt import MqttTransport
from agent.transport import MemoryTransport, Transport
from benchmarks.harness import emit, progress, rate
from fleet.plan import FleetPlan
from fleet.scale import SCALE_LABEL, run_scale
from fleet.sim import run_shard
from protocol.randomness import SeededRandom
from tests.fleet.support import every_use_case_plan, running_stack
from tests.support.broker import Broker, running_broker

TARGET_REPORTS_PER_SECOND = 10_000
"""Complete agents at 1,000 devices x 1 day should publish this many reports per second."""
SCALE_TARGET_REPORTS_PER_SECOND = 30_000
"""The scale mode should bring this many reports per second through the broker into the collector."""
SCALE_CONNECTIONS = 4
"""Connections of the scale row (fleet.scale.SCALE_WINDOW publishes in flight on each)."""
SCALE_REPEAT = 5
"""Runs of the scale row; its figures are the median run's. At 1,000 devices x 1 day a run
lasts under half a second, and on the 2-core machine its rate moves by up to a tenth from one
run to the next (29,100-31,200 reports/s over five runs of one build)."""


def _plan(devices: int, days: int, broker: BrokerConfig | None = None) -> FleetPlan:
    return dataclasses.replace(every_use_case_plan(devices=devices, days=days, seed=1), broker=broker)


def _row(name: str, plan: FleetPlan, transport: Transport) -> dict[str, Any]:
    progress(f"bench_fleet: {name}, {plan.devices} devices x {plan.days} days")
    started = time.perf_counter()
    cpu_started = time.process_time()
    result = asyncio.run(run_shard(plan, range(plan.devices), transport=transport))
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    cycles = plan.devices * (plan.slots + 1)
    return {
        "configuration": name,
        "devices": plan.devices,
        "days": plan.days,
        "use_cases": len(plan.use_cases),
        "reports": result.messages,
        "seconds": round(elapsed, 3),
        "setup_seconds": round(result.setup_seconds, 3),
        "device_cycles_per_second": rate(cycles, elapsed - result.setup_seconds),
        "reports_per_second": rate(result.messages, elapsed - result.setup_seconds),
        "ms_per_device_cycle": round(1000 * (elapsed - result.setup_seconds) / cycles, 3),
        "cpu_us_per_report": round(1e6 * (cpu - result.setup_cpu_seconds) / result.messages, 1)
        if result.messages
        else None,
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def bench(devices: int, days: int = 2, *, broker: Broker | None = None) -> list[dict[str, Any]]:
    """One result row per configuration; ``broker``: a running plain broker to use (the tests')."""
    rows = [_row("memory", _plan(devices, days), MemoryTransport())]
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        with contextlib.ExitStack() as owned:
            plain = broker or owned.enter_context(running_broker(Path(tmp) / "plain", persistence=False))
            plan = _plan(devices, days, BrokerConfig(host="127.0.0.1", port=plain.port, tls=False))
            assert plan.broker is not None
            rows.append(_row("mosquitto", plan, MqttTransport(plan.broker, SeededRandom(2))))
        with running_stack(Path(tmp) / "tls", tls=True) as stack:
            broker_cfg = BrokerConfig(
                host="127.0.0.1",
                port=stack.broker_port,
                ca_file=stack.ca_file,
                username="fleet-sim",  # the simulator's own user (deploy/mosquitto/acl.fleet-sim)
                password_file=stack.password_file,
            )
            rows.append(
                _row("mosquitto-tls", _plan(devices, days, broker_cfg), MqttTransport(broker_cfg, SeededRandom(3)))
            )
    return rows


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` (its /proc stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> dict[str, float]:
    """CPU seconds of this process's broker and collector (the stack's child processes), by role."""
    out = {"broker": 0.0, "collector": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text(encoding="utf-8")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            cpu = _cpu_seconds(int(entry.name))
        except (OSError, StopIteration, ValueError):
            continue  # gone meanwhile, or not ours to read
        if ppid != os.getpid():
            continue
        if "mosquitto" in cmdline:
            out["broker"] += cpu
        elif "collector" in cmdline:
            out["collector"] += cpu
    return out


def scale_row(devices: int, days: int, *, connections: int = SCALE_CONNECTIONS) -> dict[str, Any]:
    """The scale mode (fleet/scale.py) through a real Mosquitto into a real collector, with receipts:
    reports per second until the last report's receipt said it was counted."""
    progress(f"bench_fleet: scale mode, {devices} devices x {days} days")
    with tempfile.TemporaryDirectory(prefix="bench-fleet-scale-") as tmp, running_stack(Path(tmp), tls=True) as stack:
        # The deploy configuration, as the demo runs it: its queue per subscriber holds what the
        # collector has not taken yet (a plain test broker's default of 1,000 would drop reports).
        broker = BrokerConfig(
            host="127.0.0.1",
            port=stack.broker_port,
            ca_file=stack.ca_file,
            username="fleet-sim",
            password_file=stack.password_file,
        )
        # The collector takes only periods it still keeps: the days before today, as ldp-fleet's default.
        today = int(time.time()) // 86_400 * 86_400
        plan = dataclasses.replace(
            _plan(devices, days, broker), start=today - days * 86_400, receipts=True, connections=connections
        )
        servers0 = _children_cpu()
        started = time.perf_counter()
        cpu_started = time.process_time()
        result = asyncio.run(run_scale(plan))
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        servers = {k: v - servers0[k] for k, v in _children_cpu().items()}
    run_seconds = elapsed - result.setup_seconds
    per_report = max(result.messages, 1)
    return {
        "configuration": "scale-mosquitto-tls-collector",
        "label": SCALE_LABEL,
        "devices": devices,
        "days": days,
        "use_cases": len(plan.use_cases),
        "reports": result.messages,
        "counted": result.counted,
        "missing_receipts": result.missing,
        "seconds": round(elapsed, 3),
        "setup_seconds": round(result.setup_seconds, 3),
        "reports_per_second": rate(result.messages, run_seconds),
        "generator_cpu_us_per_report": round(1e6 * (cpu - result.setup_cpu_seconds) / per_report, 1),
        "broker_cpu_us_per_report": round(1e6 * servers["broker"] / per_report, 1),
        "collector_cpu_us_per_report": round(1e6 * servers["collector"] / per_report, 1),
        "connections": connections,
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def scale_median(devices: int, days: int, *, repeat: int = SCALE_REPEAT) -> dict[str, Any]:
    """:func:`scale_row` ``repeat`` times: the run with the median rate, with every run's rate
    (``runs_reports_per_second``, lowest first)."""
    runs = sorted((scale_row(devices, days) for _ in range(max(1, repeat))), key=lambda r: r["reports_per_second"])
    return {
        **runs[len(runs) // 2],
        "repeat": len(runs),
        "runs_reports_per_second": [r["reports_per_second"] for r in runs],
        "every_report_counted_in_every_run": all(r["counted"] == r["reports"] for r in runs),
    }


def run(
    devices: int, days: int = 2, *, broker: Broker | None = None, scale: bool = False, repeat: int = SCALE_REPEAT
) -> dict[str, Any]:
    """Every configuration and the check that they published the same reports; the JSON document."""
    rows = bench(devices, days, broker=broker)
    checks: dict[str, bool] = {"same_reports_in_every_configuration": len({row["reports"] for row in rows}) == 1}
    scale_rows = [scale_median(devices, days, repeat=repeat)] if scale else []
    if scale_rows:
        checks["scale_mode_every_report_counted"] = scale_rows[0]["every_report_counted_in_every_run"]
    met = [row["configuration"] for row in rows if row["reports_per_second"] >= TARGET_REPORTS_PER_SECOND]  # agents
    target = {
        "reports_per_second": TARGET_REPORTS_PER_SECOND,
        "at": "1,000 devices x 1 day, complete agents",
        "measured_at": f"{devices:,} devices x {days} day{'s' if days != 1 else ''}",
        "met_by": met,
        "met": bool(met),
    }
    scale_target = {
        "reports_per_second": SCALE_TARGET_REPORTS_PER_SECOND,
        "at": "1,000 devices x 1 day, scale mode through the broker into the collector, the median run",
        "measured_at": target["measured_at"],
        "met": bool(scale_rows) and scale_rows[0]["reports_per_second"] >= SCALE_TARGET_REPORTS_PER_SECOND,
    }
    return {
        "benchmark": "fleet",
        "results": rows + scale_rows,
        "checks": checks,
        "target": target,
        "scale_target": scale_target if scale_rows else None,
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print its JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--days", type=int, default=1)
    parser.add_argument("--scale-only", action="store_true", help="only the scale mode's row")
    parser.add_argument(
        "--repeat",
        type=int,
        default=SCALE_REPEAT,
        help=f"runs of the scale mode's row; its figures are the median run's (default {SCALE_REPEAT})",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat takes a positive number of runs")
    if args.scale_only:
        emit({"benchmark": "fleet", "results": [scale_median(args.devices, args.days, repeat=args.repeat)]})
    else:
        emit(run(args.devices, args.days, scale=True, repeat=args.repeat))


if __name__ == "__main__":
    main()
