"""One collector on one broker against the same collector on two (``bench_collector --brokers``).

The same stream, the same collector (one process on SQLite, the deployed commit batching),
once subscribed to one Mosquitto and once to two (``mqtt.addresses``, one session each), with
the stream split evenly over the brokers as a fleet pinned by a hash of its identities would
split it. Each setup drains it in the modes of ``benchmarks.bench_collector``:

* ``backlog``: published while the collector is stopped (SIGSTOP), then drained;
* ``live``: published while it runs, one load-generator thread per broker (the load
  generator is one process: with two brokers its two threads share one interpreter).

The figures: messages per second end to end (committed, read from the store), the
collector's CPU per message, the brokers' CPU per message (summed) and the cores each part
kept busy. On a machine with fewer cores than brokers + collector + load generator the two
brokers cannot run side by side: what two brokers buy here is the ceiling of one broker
removed, not a faster collector (docs/deploy.md, "Several brokers", reads the figures).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import statistics
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import progress, rate
from benchmarks.load import publish
from collector.config import IngestConfig
from protocol.registry import Registry
from tests.collector.processes import CollectorProcess, committed, write_config
from tests.support.broker import Broker, free_port, running_broker

__all__ = ["BROKER_COUNTS", "compare_brokers"]

BROKER_COUNTS = (1, 2)
MODES = ("backlog", "live")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _brokers_cpu(brokers: Sequence[Broker]) -> float:
    total = 0.0
    for b in brokers:
        assert b.process is not None
        total += _cpu_seconds(b.process.pid)
    return total


def _publish_split(brokers: Sequence[Broker], items: Sequence[tuple[str, bytes]]) -> float:
    """The stream split evenly over the brokers, one publishing thread each; seconds until all acknowledged."""
    parts = [items[i :: len(brokers)] for i in range(len(brokers))]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(brokers)) as pool:
        list(pool.map(lambda bp: publish(bp[0].host, bp[0].port, bp[1], window=5000), zip(brokers, parts, strict=True)))
    return time.perf_counter() - start


def _config(directory: Path, registry: Path, brokers: Sequence[Broker], http_port: int) -> Path:
    """A collector config on every broker, with the deployed commit batching."""
    path = write_config(
        directory,
        registry=registry,
        host=brokers[0].host,
        port=brokers[0].port,
        client_id="col-brokers",
        instance="member-0",
        http_port=http_port,
    )
    text = path.read_text(encoding="utf-8")
    if len(brokers) > 1:
        addresses = ", ".join(f'"{b.host}:{b.port}"' for b in brokers)
        text = text.replace(f'host = "{brokers[0].host}"\nport = {brokers[0].port}\n', f"addresses = [{addresses}]\n")
    defaults = IngestConfig()
    text = text.replace("commit_max_reports = 2000", f"commit_max_reports = {defaults.commit_max_reports}")
    text = text.replace("commit_interval_s = 0.05", f"commit_interval_s = {defaults.commit_interval_s}")
    path.write_text(text, encoding="utf-8")
    return path


def _wait_all_subscribed(http_port: int, brokers: int, timeout: float = 120) -> None:
    """Until ``/healthz`` lists every broker connected (READY=1 comes once any one serves)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=5) as r:
                listed = json.loads(r.read()).get("brokers", [])
            if len(listed) == brokers and all(b["connected"] for b in listed):
                return
        if time.monotonic() > deadline:
            raise TimeoutError("the collector did not subscribe on every broker")
        time.sleep(0.05)


def _wait_committed(store: Path, registry: Registry, n: int, timeout: float = 900) -> float:
    deadline = time.monotonic() + timeout
    while committed(store, registry).get("reports", 0) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"collector committed {committed(store, registry)} of {n}")
        time.sleep(0.02)
    return time.perf_counter()


def _run(
    items: Sequence[tuple[str, bytes]],
    warmup: Sequence[tuple[str, bytes]],
    registry: Registry,
    registry_path: Path,
    directory: Path,
    *,
    count: int,
    mode: str,
) -> dict[str, Any]:
    """One drain of ``items`` by one collector on ``count`` fresh brokers, after ``warmup``."""
    n, w = len(items), len(warmup)
    with contextlib.ExitStack() as stack:
        brokers = [stack.enter_context(running_broker(directory / f"broker-{j}")) for j in range(count)]
        http_port = free_port()
        proc = CollectorProcess(_config(directory, registry_path, brokers, http_port), log=directory / "collector.log")
        stack.callback(proc.close)
        proc.launch()
        proc.wait_ready()
        _wait_all_subscribed(http_port, count)
        store = directory / "collector.sqlite3"
        _publish_split(brokers, warmup)
        _wait_committed(store, registry, w)
        out: dict[str, Any] = {}
        if mode == "live":
            cpu0, brokers0, start = _cpu_seconds(proc.pid), _brokers_cpu(brokers), time.perf_counter()
            out[f"{mode}_publish_msgs_per_s"] = rate(n, _publish_split(brokers, items))
        else:
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                out[f"{mode}_publish_msgs_per_s"] = rate(n, _publish_split(brokers, items))
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            cpu0, brokers0, start = _cpu_seconds(proc.pid), _brokers_cpu(brokers), time.perf_counter()
        end = _wait_committed(store, registry, w + n)
        seconds = end - start
        collector_cpu = _cpu_seconds(proc.pid) - cpu0
        brokers_cpu = _brokers_cpu(brokers) - brokers0
        assert committed(store, registry).get("reports") == w + n
        assert proc.stop() == 0
    out |= {
        f"{mode}_msgs_per_s": rate(n, seconds),
        f"{mode}_collector_cpu_us_per_msg": round(collector_cpu / n * 1e6, 2),
        f"{mode}_broker_cpu_us_per_msg": round(brokers_cpu / n * 1e6, 2),
        f"{mode}_cores_busy": {
            "collector": round(collector_cpu / seconds, 2),
            "brokers": round(brokers_cpu / seconds, 2),
        },
    }
    return out


def compare_brokers(
    items: Sequence[tuple[str, bytes]],
    warmup: Sequence[tuple[str, bytes]],
    registry: Registry,
    registry_path: Path,
    work: Path,
    *,
    tag: str,
    modes: Sequence[str] = MODES,
    repeat: int = 1,
) -> dict[str, Any]:
    """One broker against two for one stream: each setup's medians over ``repeat`` interleaved runs, and the ratios."""
    runs: dict[int, list[dict[str, Any]]] = {count: [] for count in BROKER_COUNTS}
    for r in range(repeat):
        for count in BROKER_COUNTS:
            merged: dict[str, Any] = {}
            for mode in modes:
                if mode not in MODES:
                    continue
                progress(f"{tag}: one collector on {count} broker(s), {mode}, run {r + 1} of {repeat}")
                directory = work / f"brokers-{tag}-{count}-{mode}-{r}"
                merged |= _run(items, warmup, registry, registry_path, directory, count=count, mode=mode)
            runs[count].append(merged)
    out: dict[str, Any] = {}
    for count, results in runs.items():
        summary = dict(results[0])
        for key, first in results[0].items():
            if isinstance(first, int | float) and not isinstance(first, bool):
                summary[key] = round(statistics.median(run[key] for run in results), 3)
                if len(results) > 1 and key.endswith("_msgs_per_s"):
                    summary[f"{key}_runs"] = [run[key] for run in results]
        out[f"brokers_{count}"] = summary
    one, two = out["brokers_1"], out["brokers_2"]
    for mode in modes:
        key = f"{mode}_msgs_per_s"
        if one.get(key):
            out[f"{mode}_two_over_one"] = round(two[key] / one[key], 3)
    return out
