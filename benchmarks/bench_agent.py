"""The agent's footprint on a device: its memory, the CPU of a collection cycle and of its commands.

Run: ``.venv/bin/python -m benchmarks.bench_agent`` (prints one JSON document on stdout).

Every figure is for the example registry (``deploy/usecases.example.toml``, one use case per
mechanism) with a value recorded for every use case:

* ``daemon``: a running ``ldp-agent run`` (real clock moved by :mod:`benchmarks.shifted_daemon`,
  Unix socket, consent granted, TLS off, a local Mosquitto when one is installed), read from
  ``/proc/<pid>/status``: ``rss_at_ready_mb`` once it reported READY to a fake
  ``$NOTIFY_SOCKET``; ``idle_rss_mb`` once ``ldp-agent record`` gave it a value for every use
  case (goal <= 32 MiB); ``peak_cycle_rss_mb`` (VmHWM, the most it ever held) after one
  collection cycle closed every period and published its reports (goal <= 40 MiB);
  ``idle_after_cycle_rss_mb`` after that. ``numpy_loaded`` says whether numpy's extension
  was ever mapped into the daemon (``/proc/<pid>/maps``).
* ``cycle``: process CPU time of one collection cycle (close the periods, privatize, charge,
  encode, seal and write each use case's file, then publish the staged reports through the
  in-memory transport), median over several cycles in this process (goal <= 10 ms).
* ``commands``: CPU time (user + system, from ``wait4``) of ``ldp-agent --help``
  (goal <= 100 ms) and of ``ldp-agent status`` with no daemon running, which opens the state
  itself (goal <= 150 ms), each the median of several runs, next to a bare interpreter
  (``python -c pass``) measured in the same run.

``targets`` gives each goal with its figure and pass/fail, and checks that do not depend on the
machine: every use case sent its report in the cycles timed, the daemon published every report
and never loaded numpy. ``--cycles 2 --runs 1 --settle 0.5`` is the small run of the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import emit, progress

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "deploy" / "usecases.example.toml"
KEY = bytes(range(32))
MIB = 1024.0

GOALS = {
    "idle_rss_mb": 32.0,
    "peak_cycle_rss_mb": 40.0,
    "cycle_cpu_ms": 10.0,
    "help_cpu_ms": 100.0,
    "status_cpu_ms": 150.0,
}
"""The footprint a device may expect (docs/deploy.md, "The device's footprint")."""

_DEBUG_ENV = ("PYTHONTRACEMALLOC", "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONMALLOCSTATS", "PYTHONASYNCIODEBUG")
_COUNTER_VALUES = {"one-bit-mean": ("600", "app"), "dbitflip": ("1800", None)}


def _value(mechanism: str, categories: tuple[str, ...] | None = None) -> tuple[str, str | None]:
    """The value (as ``ldp-agent record`` takes it) and counter key recorded for a mechanism
    (its first category, for a mechanism over fixed categories)."""
    if mechanism == "rr":
        return "1", None
    if categories:
        return categories[0], None
    return _COUNTER_VALUES.get(mechanism, ("hello", None))


def _use_cases() -> dict[str, tuple[str, tuple[str, ...] | None]]:
    """The example registry's use cases -> their mechanisms and fixed categories."""
    from protocol.registry import parse_registry  # noqa: PLC0415

    registry = parse_registry(REGISTRY.read_text(encoding="utf-8"))
    return {
        name: (uc.mechanism.name, getattr(uc.mechanism, "fixed_categories", None))
        for name, uc in registry.use_cases.items()
    }


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a command as deployed: without the debugging aids a test run may set
    (allocation tracing alone nearly doubles the RSS measured)."""
    return {k: v for k, v in os.environ.items() if k not in _DEBUG_ENV} | extra


# --- commands: CPU time and peak RSS of a child process ---------------------------------------


def _child_cpu_ms(cmd: Sequence[str]) -> float:
    """CPU milliseconds (user + system) of one run of ``cmd``.

    The peak RSS ``wait4`` also reports is not used: Linux carries the forking process's peak
    over the ``exec`` (this process's, numpy and all), so it says nothing about the command.
    """
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.stderr is not None
    with proc.stderr:
        stderr = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {stderr.strip()}")
    return (usage.ru_utime + usage.ru_stime) * 1e3


def _median_cpu_ms(cmd: Sequence[str], runs: int) -> float:
    return round(statistics.median(_child_cpu_ms(cmd) for _ in range(runs)), 1)


def _bare_rss_mb(python: str) -> float:
    """Peak RSS of a bare interpreter (``python -c pass`` that reads its own ``/proc`` entry)."""
    code = "print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1])"
    done = subprocess.run([python, "-c", code], env=_clean_env(), capture_output=True, check=True, timeout=60)
    return round(int(done.stdout) / MIB, 1)


def installed_interpreter(tmp: Path) -> str:
    """A virtualenv laid out as ``deploy/install.sh`` leaves a device's, for the processes timed.

    A checkout's environment installs the project in editable mode, and setuptools' editable
    install puts an import hook in every interpreter it starts (a ``.pth`` file that imports
    ``pathlib``, ``importlib.util`` and ``re`` and looks up every project module through its own
    finder): 20-40 ms of CPU at each start and about 1 MiB that no device pays, since a device
    installs the wheel (docs/deploy.md, "The device's footprint"). This virtualenv's
    site-packages holds one ``.pth`` that names this checkout and the environment's
    site-packages directories: paths a ``.pth`` file adds are not site directories, so their
    own ``.pth`` files, the hook among them, are not run, and the agent's modules and libraries
    are the same files either way.
    """
    import site  # noqa: PLC0415
    import venv  # noqa: PLC0415

    home = tmp / "device-venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(home)
    python = home / "bin" / "python"
    found = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        check=True,
        text=True,
        timeout=60,
    )
    paths = [str(ROOT), *site.getsitepackages()]
    (Path(found.stdout.strip()) / "ldp-checkout.pth").write_text("\n".join(paths) + "\n", encoding="utf-8")
    return str(python)


def _agent_command(python: str) -> list[str]:
    """``ldp-agent`` as ``python -m agent`` (the same entry point, agent/__main__.py), so the
    checkout this benchmark lies in is measured whatever the environment has installed."""
    return [python, "-m", "agent"]


def commands(config: Path, runs: int, python: str) -> dict[str, Any]:
    """``ldp-agent --help``, ``ldp-agent status`` (no daemon) and a bare interpreter, each under
    ``python``."""
    agent = _agent_command(python)
    return {
        "command": "python -m agent",
        "interpreter": "a virtualenv laid out as a device's (installed_interpreter)",
        "runs": runs,
        "bare_interpreter_rss_mb": _bare_rss_mb(python),
        "bare_interpreter_cpu_ms": _median_cpu_ms([python, "-c", "pass"], runs),
        "help_cpu_ms": _median_cpu_ms([*agent, "--help"], runs),
        "status_cpu_ms": _median_cpu_ms([*agent, "--config", str(config), "status"], runs),
    }


# --- the running daemon ------------------------------------------------------------------------


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _numpy_mapped(pid: int) -> bool:
    """Whether numpy's compiled core is mapped into the process (it stays once imported)."""
    return any("numpy" in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())


@contextlib.contextmanager
def _broker(tmp: Path) -> Iterator[int | None]:
    """A plain-TCP Mosquitto on a free loopback port, or None when none is installed."""
    binary = shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).exists()), None
    )
    if binary is None:
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    conf = tmp / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("mosquitto did not start listening")
            time.sleep(0.02)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _write_config(tmp: Path, port: int | None) -> Path:
    key = tmp / "state.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    config = tmp / "agent.toml"
    config.write_text(
        f'[broker]\nhost = "127.0.0.1"\nport = {port or 1}\ntls = false\nreceipts = false\n'
        f'[registry]\npath = "{REGISTRY}"\n'
        '[state]\ndirectory = "state"\nkey_file = "state.key"\n'
        '[api]\nsocket = "agent.sock"\n'
        "[schedule]\njitter_seconds = 0\n"
        '[log]\nlevel = "warning"\n'
    )
    return config


def _wait_for(sock: socket.socket, wanted: bytes) -> None:
    """Read the daemon's sd_notify messages until one holds ``wanted`` (the socket's timeout bounds it)."""
    while wanted not in sock.recv(4096):
        pass


def _outbox(agent: list[str], config: Path) -> int:
    done = subprocess.run(
        [*agent, "--config", str(config), "status", "--json"], cwd=ROOT, capture_output=True, check=True, timeout=120
    )
    outbox: int = json.loads(done.stdout)["outbox"]
    return outbox


def _record_all(agent: list[str], config: Path) -> None:
    for name, (mechanism, categories) in _use_cases().items():
        value, key = _value(mechanism, categories)
        extra = ["--key", key] if key else []
        subprocess.run(
            [*agent, "--config", str(config), "record", name, value, *extra],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=120,
        )


def _drive(
    proc: subprocess.Popen[bytes], sock: socket.socket, config: Path, settle: float, *, broker: bool, python: str
) -> dict[str, Any]:
    """READY, a value for every use case, idle, one cycle, published, idle again: the figures."""
    agent = _agent_command(python)
    _wait_for(sock, b"READY=1")
    ready_kb = _status_kb(proc.pid, "VmRSS")
    _record_all(agent, config)
    time.sleep(settle)  # idle: nothing to do until the next slot
    idle_kb = _status_kb(proc.pid, "VmRSS")
    proc.send_signal(signal.SIGUSR1)  # the clock jumps past midnight: one cycle closes every period
    _wait_for(sock, b"STATUS=cycle 1:")
    deadline = time.monotonic() + 60
    while broker and _outbox(agent, config) and time.monotonic() < deadline:
        time.sleep(0.1)
    published = not broker or _outbox(agent, config) == 0
    time.sleep(settle)
    return {
        "use_cases": len(_use_cases()),
        "broker": "mosquitto" if broker else "none (port 1: publishing fails and backs off)",
        "rss_at_ready_mb": round(ready_kb / MIB, 1),
        "idle_rss_mb": round(idle_kb / MIB, 1),
        "peak_cycle_rss_mb": round(_status_kb(proc.pid, "VmHWM") / MIB, 1),
        "idle_after_cycle_rss_mb": round(_status_kb(proc.pid, "VmRSS") / MIB, 1),
        "every_report_published": published,
        "numpy_loaded": _numpy_mapped(proc.pid),
    }


def daemon(tmp: Path, settle: float, python: str) -> dict[str, Any]:
    """The running daemon's memory under ``python``: at READY, idle with values recorded, at its
    peak through a cycle."""
    with _broker(tmp) as port:
        config = _write_config(tmp, port)
        agent = _agent_command(python)
        subprocess.run([*agent, "--config", str(config), "consent", "grant"], check=True, cwd=ROOT, capture_output=True)
        notify = tmp / "notify"
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(str(notify))
            sock.settimeout(60)
            cmd = [python, "-m", "benchmarks.shifted_daemon", "--config", str(config)]
            proc = subprocess.Popen(cmd, cwd=ROOT, env=_clean_env(NOTIFY_SOCKET=str(notify)))
            try:
                figures = _drive(proc, sock, config, settle, broker=port is not None, python=python)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        return figures | {"exit_status_after_sigterm": proc.returncode}


# --- CPU of a collection cycle, in this process -----------------------------------------------


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

    registry = parse_registry(REGISTRY.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        clock = FakeClock(1_700_006_400.0 + 60)
        rng = SystemRandom()
        agent = Agent(registry=registry, state_dir=Path(tmp), sealer=Sealer(KEY), clock=clock, rng=rng)
        agent.grant_consent()
        publisher = Publisher(agent, MemoryTransport(), clock=clock, rng=rng)
        items: list[tuple[str, object, str | None]] = []
        for name, uc in registry.use_cases.items():
            text, key = _value(uc.mechanism.name, getattr(uc.mechanism, "fixed_categories", None))
            items.append((name, int(text) if text.isdigit() else text, key))
        collect_ms, publish_ms, reports = [], [], []
        for _ in range(cycles + 1):
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
        # The first cycle pays one-off costs (lazy imports, first use of each hash): leave it out.
        collect_ms, publish_ms = collect_ms[1:], publish_ms[1:]
        total = [c + p for c, p in zip(collect_ms, publish_ms, strict=True)]
        return {
            "use_cases": len(registry.use_cases),
            "reports_per_cycle": min(reports[1:]),
            "collect_cpu_ms": round(statistics.median(collect_ms), 2),
            "publish_cpu_ms": round(statistics.median(publish_ms), 2),
            "cycle_cpu_ms": round(statistics.median(total), 2),
            "cycle_cpu_ms_max": round(max(total), 2),
        }


def _compile_bytecode() -> None:
    """Write the device packages' bytecode, as installing the wheel does, so that a command
    timed here does not compile a module edited since its last run (or every module, under
    ``PYTHONDONTWRITEBYTECODE``): that is a checkout's cost, not a device's."""
    import compileall  # noqa: PLC0415

    for package in ("agent", "protocol", "runtime"):
        compileall.compile_dir(ROOT / package, quiet=1, force=False)


def run(cycles: int = 7, settle: float = 3.0, runs: int = 5) -> dict[str, Any]:
    """Every measurement, the goals and the checks; one JSON-ready document."""
    _compile_bytecode()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        python = installed_interpreter(tmp)
        progress("measuring the running daemon ...")
        rss = daemon(tmp, settle, python)
        progress("timing ldp-agent --help and status ...")
        cmds = commands(tmp / "agent.toml", runs, python)
    progress("timing collection cycles ...")
    cpu = cycle_cpu(cycles)
    figures = rss | cpu | cmds
    targets: dict[str, bool] = {f"{name}<={goal:g}": figures[name] <= goal for name, goal in GOALS.items()}
    targets |= {
        "every_use_case_reported": cpu["reports_per_cycle"] == cpu["use_cases"],
        "daemon_published_every_report": rss["every_report_published"],
        "daemon_never_loaded_numpy": not rss["numpy_loaded"],
    }
    return {"benchmark": "agent", "daemon": rss, "cycle": cpu, "commands": cmds, "goals": GOALS, "targets": targets}


def main(argv: list[str] | None = None) -> None:
    """Measure and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=7, help="collection cycles to time (median reported)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each command timed (median reported)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds the daemon idles before its RSS is read")
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.runs < 1 or args.settle < 0:
        parser.error("--cycles and --runs take a positive count and --settle a non-negative time")
    emit(run(args.cycles, args.settle, args.runs))


if __name__ == "__main__":
    main()
