"""The agent's footprint: the idle daemon's resident memory and the CPU time of one collection cycle.

Run: ``.venv/bin/python -m benchmarks.bench_agent`` (prints one JSON document on stdout).

* ``idle_rss_mb``: resident memory of a running ``ldp-agent run`` (real clock,
  Unix socket, probes) with 20 use cases, consent granted, read from ``/proc/<pid>/status``
  a few seconds after it reported READY to a fake ``$NOTIFY_SOCKET``. Target <= 60 MB.
* ``cycle_cpu_ms``: process CPU time of one collection cycle with 20 use cases (close the
  periods, answer counters from their memo, sample within the limits, charge, encode, seal and
  write each use case's file), then of publishing the staged reports through the in-memory
  transport (ledger and outbox writes). Median over several cycles. Target <= 50 ms.

``targets`` gives each target with its figure and pass/fail, and one check that does not
depend on the machine: every use case sent its report in the last cycle timed.
``--cycles 2 --settle 0.5`` is the small run of the tests.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import emit, progress

ROOT = Path(__file__).resolve().parent.parent
USE_CASES = 20
KEY = bytes(range(32))

_TEMPLATES = {
    "one-bit-mean": 'mechanism = "one-bit-mean"\nepsilon = 1\nperiod = "6h"\ndaily_limit = 200\n'
    "lifetime_epsilon = 50000\nparameters = { m = 21600, gamma = 0.2 }\n",
    "dbitflip": 'mechanism = "dbitflip"\nepsilon = 1\nperiod = "6h"\ndaily_limit = 4\nlifetime_epsilon = 1500\n'
    'parameters = { d = 4, buckets = { kind = "linear", low = 0, high = 21600, count = 32 } }\n',
    "cms": 'mechanism = "cms"\nepsilon = 4\nperiod = "1d"\ndaily_limit = 2\nlifetime_epsilon = 1500\n'
    "parameters = { k = 65536, m = 1024 }\n",
    "hcms": 'mechanism = "hcms"\nepsilon = 4\nperiod = "1d"\ndaily_limit = 2\nlifetime_epsilon = 3000\n'
    "parameters = { k = 1024, m = 32768 }\n",
    "sfp": 'mechanism = "sfp"\nepsilon = 8\nperiod = "1d"\ndaily_limit = 2\nlifetime_epsilon = 6000\n'
    "parameters = { epsilon = 2, epsilon_fragment = 6, m = 1024, k = 2048, m_fragment = 1024, k_fragment = 2048 }\n",
    "rappor": 'mechanism = "rappor"\nepsilon = 0.54\nperiod = "1d"\ndaily_limit = 4\nlifetime_epsilon = 200\n'
    "parameters = { k = 128, h = 2, cohorts = 32, f = 0.75, p = 0.5, q = 0.75 }\n",
    "rr": 'mechanism = "rr"\nepsilon = 1.0986\nperiod = "1d"\ndaily_limit = 1\nlifetime_epsilon = 400\n',
}
_MECHANISMS = list(_TEMPLATES)
_DEBUG_ENV = ("PYTHONTRACEMALLOC", "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONMALLOCSTATS", "PYTHONASYNCIODEBUG")


def registry_text(n: int = USE_CASES) -> str:
    """A registry of ``n`` use cases cycling through every mechanism."""
    parts = ['format = 1\nsalt = "0547eed0fe23ed365173a6e9b965e343b4927d0967009d668d6df9ead8a2030c"\n']
    for i in range(n):
        mech = _MECHANISMS[i % len(_MECHANISMS)]
        name = f"uc{i:02d}-{mech}"
        parts.append(f"[use_cases.{name}]\n{_TEMPLATES[mech]}[use_cases.{name}.collector]\nmin_reports = 1\n")
    return "\n".join(parts)


def _values(mech: str, i: int) -> list[tuple[object, str | None]]:
    """A realistic period's values for one use case."""
    if mech == "one-bit-mean":
        return [(600 + 37 * k, f"app{k}") for k in range(10)]
    if mech == "dbitflip":
        return [(1_800.0 + i, None)]
    if mech == "rr":
        return [(i % 2, None)]
    if mech == "sfp":  # words of the default alphabet: the agent refuses others (protocol/sfp.py)
        return [(f"value{chr(97 + i % 26)}{chr(97 + k)}", None) for k in range(5)]
    return [(f"value-{i}-{k}", None) for k in range(5)]


def cycle_cpu(cycles: int = 7) -> dict[str, Any]:
    """Median process CPU time of collect() and of publishing, over ``cycles`` cycles."""
    import asyncio  # noqa: PLC0415 - the benchmark's in-process half

    from agent.core import Agent  # noqa: PLC0415
    from agent.publisher import Publisher  # noqa: PLC0415
    from agent.sealed import Sealer  # noqa: PLC0415
    from agent.transport import MemoryTransport  # noqa: PLC0415
    from fleet.clock import FakeClock  # noqa: PLC0415
    from protocol.randomness import SystemRandom  # noqa: PLC0415
    from protocol.registry import parse_registry  # noqa: PLC0415

    registry = parse_registry(registry_text())
    with tempfile.TemporaryDirectory() as tmp:
        clock = FakeClock(1_700_006_400.0 + 60)
        rng = SystemRandom()
        agent = Agent(registry=registry, state_dir=Path(tmp), sealer=Sealer(KEY), clock=clock, rng=rng)
        agent.grant_consent()
        transport = MemoryTransport()
        publisher = Publisher(agent, transport, clock=clock, rng=rng)
        collect_ms, publish_ms, reports = [], [], []
        for _ in range(cycles + 1):
            items = [
                (name, v, k) for i, name in enumerate(registry.use_cases) for v, k in _values(name.split("-", 1)[1], i)
            ]
            agent.record_many(items)
            clock.set(clock.time() + 86_400.0)
            t0 = time.process_time()
            summary = agent.collect()
            t1 = time.process_time()
            asyncio.run(publisher.drain_once())
            t2 = time.process_time()
            collect_ms.append((t1 - t0) * 1e3)
            publish_ms.append((t2 - t1) * 1e3)
            reports.append(summary.reports)
        # The first cycle pays one-off costs (lazy imports, cached hash families): leave it out.
        collect_ms, publish_ms = collect_ms[1:], publish_ms[1:]
        total = [c + p for c, p in zip(collect_ms, publish_ms, strict=True)]
        return {
            "use_cases": len(registry.use_cases),
            "reports_per_cycle": reports[-1],
            "collect_cpu_ms": round(statistics.median(collect_ms), 2),
            "publish_cpu_ms": round(statistics.median(publish_ms), 2),
            "cycle_cpu_ms": round(statistics.median(total), 2),
            "cycle_cpu_ms_max": round(max(total), 2),
            "target_cycle_cpu_ms": 50,
        }


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def idle_rss(settle: float = 3.0) -> dict[str, Any]:
    """Resident memory of a running daemon with 20 use cases, after it reported READY."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "usecases.toml").write_text(registry_text())
        key = tmp / "state.key"
        key.write_bytes(KEY)
        key.chmod(0o600)
        first = "uc00-one-bit-mean"
        (tmp / "agent.toml").write_text(
            '[broker]\nhost = "127.0.0.1"\nport = 1\ntls = false\n'
            '[registry]\npath = "usecases.toml"\n'
            '[state]\ndirectory = "state"\nkey_file = "state.key"\n'
            '[api]\nsocket = "agent.sock"\n'
            f'[[probes]]\nkind = "uptime"\nuse_case = "{first}"\n'
            '[[probes]]\nkind = "process-names"\nuse_case = "uc05-rappor"\n'
            '[log]\nlevel = "warning"\n'
        )
        cmd = [sys.executable, "-m", "agent", "--config", str(tmp / "agent.toml")]
        subprocess.run([*cmd, "consent", "grant"], check=True, cwd=ROOT, capture_output=True)
        notify = tmp / "notify"
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(str(notify))
            sock.settimeout(30)
            # The daemon as deployed: without the interpreter's debugging aids that a test run may
            # set (allocation tracing alone nearly doubles the RSS measured).
            env = {k: v for k, v in os.environ.items() if k not in _DEBUG_ENV} | {"NOTIFY_SOCKET": str(notify)}
            proc = subprocess.Popen([*cmd, "run"], cwd=ROOT, env=env)
            try:
                while b"READY=1" not in sock.recv(4096):
                    pass
                ready_kb = _status_kb(proc.pid, "VmRSS")
                time.sleep(settle)  # idle: nothing to do until the next 6-hour slot
                rss_kb = _status_kb(proc.pid, "VmRSS")
                hwm_kb = _status_kb(proc.pid, "VmHWM")
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        return {
            "use_cases": USE_CASES,
            "idle_rss_mb": round(rss_kb / 1024, 1),
            "rss_at_ready_mb": round(ready_kb / 1024, 1),
            "peak_rss_mb": round(hwm_kb / 1024, 1),
            "target_idle_rss_mb": 60,
            "exit_status_after_sigterm": proc.returncode,
        }


def run(cycles: int = 7, settle: float = 3.0) -> dict[str, Any]:
    """Both measurements and the targets; one JSON-ready document."""
    progress("measuring the idle daemon's RSS ...")
    rss = idle_rss(settle)
    progress("timing collection cycles ...")
    cpu = cycle_cpu(cycles)
    targets = {
        f"idle_rss_mb<={rss['target_idle_rss_mb']}": rss["idle_rss_mb"] <= rss["target_idle_rss_mb"],
        f"cycle_cpu_ms<={cpu['target_cycle_cpu_ms']}": cpu["cycle_cpu_ms"] <= cpu["target_cycle_cpu_ms"],
        "every_use_case_reported": cpu["reports_per_cycle"] == cpu["use_cases"],
    }
    return {"benchmark": "agent", "idle": rss, "cycle": cpu, "targets": targets}


def main(argv: list[str] | None = None) -> None:
    """Measure and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=7, help="collection cycles to time (median reported)")
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds the daemon idles after READY before its RSS is read"
    )
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.settle < 0:
        parser.error("--cycles takes a positive count and --settle a non-negative time")
    emit(run(args.cycles, args.settle))


if __name__ == "__main__":
    main()
