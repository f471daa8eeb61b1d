"""What recording a value costs an application, by the three ways to record (README, "Recording from an
application"): the command, the client libraries (Python blocking and asyncio, C), the generated code.

Run: ``.venv/bin/python -m benchmarks.bench_clients`` (prints one JSON document on stdout).

A real ``ldp-agent run`` serves every figure, with ``deploy/usecases.example.toml``, consent
granted and no broker (nothing is published: these are the costs of recording). Each figure is
for one value of the flag ``dark-mode-enabled`` and one of the counter ``app-usage-seconds``
alternately (the agent writes its sealed state for each, so the agent's own work is in them):

* ``command``: wall time of ``ldp-agent record`` per value (a process each), the median;
* ``python``: ``AgentClient.record`` per value in a loop, the median latency and the rate;
  ``python_async``: ``AsyncAgentClient.record`` with 8 requests in flight, the rate;
  ``python_generated``: the generated module's ``Telemetry`` methods, the rate;
* ``c``: the C client (``clients/c/``, built with ``make check``) and the generated header in a
  loop of a small program, the rate (skipped, with the reason, without a C compiler);
* ``import``: CPU time and resident memory of ``import agent.client`` against a bare interpreter
  (what the library adds to an application).

Checks that do not depend on the machine are in ``checks``: every value recorded. ``--values 40
--runs 3`` is the small run of the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import emit, progress

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "deploy" / "usecases.example.toml"
VALUES = (("dark-mode-enabled", True, None), ("app-usage-seconds", 60, "editor"))

_C_LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include "ldp_use_cases.h"

int main(int argc, char **argv) {
    ldp_client client;
    int n = argc > 2 ? atoi(argv[2]) : 0, failures = 0;
    ldp_client_init(&client, argv[1]);
    for (int i = 0; i < n; i++) {
        ldp_status s = i % 2 ? ldp_record_app_usage_seconds(&client, 60, "editor", NULL)
                             : ldp_record_dark_mode_enabled(&client, true, NULL);
        failures += s != LDP_OK;
    }
    printf("%d\n", failures);
    return 0;
}
"""


@contextlib.contextmanager
def _agent(directory: Path) -> Iterator[tuple[Path, Path]]:
    """A daemon with the example registry in ``directory``; its config and its socket."""
    (directory / "usecases.toml").write_text(REGISTRY.read_text(encoding="utf-8"), encoding="utf-8")
    key = directory / "state.key"
    key.write_bytes(bytes(range(32)))
    key.chmod(0o600)
    config = directory / "agent.toml"
    config.write_text(
        '[broker]\nhost = "127.0.0.1"\nport = 1\ntls = false\n[registry]\npath = "usecases.toml"\n'
        '[state]\ndirectory = "state"\nkey_file = "state.key"\n[api]\nsocket = "agent.sock"\n',
        encoding="utf-8",
    )
    agent = [sys.executable, "-m", "agent", "--config", str(config)]
    subprocess.run([*agent, "consent", "grant"], check=True, capture_output=True, cwd=ROOT, timeout=120)
    log = (directory / "agent.log").open("wb")
    proc = subprocess.Popen([*agent, "run"], cwd=ROOT, stdout=log, stderr=log)
    sock = directory / "agent.sock"
    try:
        from agent.client import AgentClient, ClientError  # noqa: PLC0415

        deadline = time.monotonic() + 120
        while True:
            try:
                AgentClient(sock).record("dark-mode-enabled", True)
                break
            except ClientError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)  # polling the socket for the daemon's first answer, with a deadline
        yield config, sock
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()


def _command(config: Path, runs: int) -> dict[str, Any]:
    walls = []
    for i in range(runs):
        name, value, key = VALUES[i % 2]
        args = [sys.executable, "-m", "agent", "--config", str(config), "record", name, str(value).lower()]
        start = time.perf_counter()
        subprocess.run([*args, *(["--key", key] if key else [])], check=True, capture_output=True, cwd=ROOT)
        walls.append(time.perf_counter() - start)
    return {"runs": runs, "wall_ms_median": 1000 * statistics.median(walls)}


def _python(sock: Path, values: int) -> tuple[dict[str, Any], int]:
    from agent.client import AgentClient  # noqa: PLC0415

    client = AgentClient(sock)
    latencies = []
    recorded = 0
    for i in range(values):
        name, value, key = VALUES[i % 2]
        start = time.perf_counter()
        recorded += client.record(name, value, key=key).outcome.value == "recorded"
        latencies.append(time.perf_counter() - start)
    figures = {"latency_us_median": 1e6 * statistics.median(latencies), "per_s": values / sum(latencies)}
    return figures, recorded


def _python_async(sock: Path, values: int) -> tuple[dict[str, Any], int]:
    from agent.client import AsyncAgentClient  # noqa: PLC0415

    client = AsyncAgentClient(sock)

    async def run() -> int:
        slots = asyncio.Semaphore(8)

        async def one(i: int) -> bool:
            name, value, key = VALUES[i % 2]
            async with slots:
                return (await client.record(name, value, key=key)).outcome.value == "recorded"

        return sum(await asyncio.gather(*(one(i) for i in range(values))))

    start = time.perf_counter()
    recorded = asyncio.run(run())
    return {"in_flight": 8, "per_s": values / (time.perf_counter() - start)}, recorded


def _generated(sock: Path, directory: Path, values: int) -> tuple[dict[str, Any], int]:
    from agent.client import AgentClient  # noqa: PLC0415
    from agent.generate import generate  # noqa: PLC0415
    from protocol.registry import parse_registry  # noqa: PLC0415

    registry = parse_registry(REGISTRY.read_bytes(), source=str(REGISTRY))
    namespace: dict[str, Any] = {}
    exec(compile(generate(registry, "python"), "telemetry.py", "exec"), namespace)  # the generated module
    telemetry = namespace["Telemetry"](AgentClient(sock))
    start = time.perf_counter()
    recorded = 0
    for i in range(values):
        reply = (
            telemetry.record_app_usage_seconds(60, key="editor") if i % 2 else telemetry.record_dark_mode_enabled(True)
        )
        recorded += reply.outcome.value == "recorded"
    figures = {"per_s": values / (time.perf_counter() - start)}
    (directory / "ldp_use_cases.h").write_text(generate(registry, "c"), encoding="utf-8")
    return figures, recorded


def _c(sock: Path, directory: Path, values: int) -> tuple[dict[str, Any], int]:
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None or shutil.which("make") is None:
        return {"skipped": "no C compiler or make (deploy/test.sh installs them)"}, values
    client = ROOT / "clients" / "c"
    subprocess.run(["make", "-C", str(client), f"BUILD={directory}", "check"], check=True, capture_output=True)
    (directory / "loop.c").write_text(_C_LOOP, encoding="utf-8")
    flags = ["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{client}", f"-I{directory}"]
    program = directory / "loop"
    built = [cc, *flags, str(directory / "loop.c"), str(directory / "libldp_client.a"), "-o", str(program)]
    subprocess.run(built, check=True, capture_output=True)
    start = time.perf_counter()
    done = subprocess.run([str(program), str(sock), str(values)], check=True, capture_output=True, text=True)
    figures = {"per_s": values / (time.perf_counter() - start)}
    return figures, values - int(done.stdout)


def _import_cost(runs: int) -> dict[str, Any]:
    def child(code: str) -> tuple[float, float]:
        # The child reads its own resident memory: wait4's peak would be this (forking) process's.
        probe = f"{code}\nprint(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])"
        proc = subprocess.Popen([sys.executable, "-c", probe], cwd="/", stdout=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.stdout is not None
        with proc.stdout:
            rss_kb = int(proc.stdout.read())
        return 1000 * (usage.ru_utime + usage.ru_stime), rss_kb / 1024

    bare = [child("pass") for _ in range(runs)]
    client = [child("import agent.client") for _ in range(runs)]
    return {
        "bare_cpu_ms": statistics.median(c for c, _ in bare),
        "client_cpu_ms": statistics.median(c for c, _ in client),
        "bare_rss_mb": statistics.median(r for _, r in bare),
        "client_rss_mb": statistics.median(r for _, r in client),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Measure and print the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=2_000, help="values per library figure")
    parser.add_argument("--runs", type=int, default=15, help="runs of the command and of the import figures")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="ldp-bench-clients-"))
    try:
        with _agent(directory) as (config, sock):
            progress("command")
            command = _command(config, args.runs)
            progress("python")
            python, by_python = _python(sock, args.values)
            python_async, by_async = _python_async(sock, args.values)
            generated, by_generated = _generated(sock, directory, args.values)
            progress("c")
            c, by_c = _c(sock, directory, args.values)
        progress("import")
        imported = _import_cost(args.runs)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    emit(
        {
            "benchmark": "bench_clients",
            "values": args.values,
            "command": command,
            "python": python,
            "python_async": python_async,
            "python_generated": generated,
            "c": c,
            "import": imported,
            "checks": {
                "every_value_recorded": [by_python, by_async, by_generated, by_c] == [args.values] * 4,
            },
        }
    )


if __name__ == "__main__":
    main()
