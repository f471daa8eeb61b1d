"""End-to-end collector throughput through a real Mosquitto, next to ``mosquitto_sub`` alone.

``python -m benchmarks.bench_collector`` prints one JSON document. Two message shapes, with
the example registry (``deploy/usecases.example.toml``, the papers' deployed parameters):

* ``single``: one record per message, a Hadamard CMS report of ``safari-energy-domains``
  (k = 1,024, m = 32,768) - the shape of an event-level use case;
* ``counters``: 20 records per message, one device's app-usage 1BitMean counters
  (``app-usage-seconds``).

For each shape and each consumer the same QoS 1 stream goes through the same broker:

* ``backlog``: the stream is queued for the consumer's persistent session while it is
  down, then the consumer starts and drains it: the consumer's own speed, without the
  publisher competing for the two cores;
* ``live``: the consumer is up and the stream is published at full speed meanwhile.

Consumers: ``mosquitto_sub -q 1`` (the reference: receives and acknowledges, nothing else);
paho-mqtt with ``manual_ack=True`` acknowledging each message on receipt
(``benchmarks.paho_subscriber``: the ceiling of a collector built on paho); one collector
process (``python -m collector run``: decodes, de-duplicates, shuffles,
folds and commits to SQLite, then acknowledges); two collector processes in an MQTT 5
shared-subscription group sharing one database. A collector's count is what is *committed*
(read from its checkpoint database), so the rate is end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import emit, progress, rate
from collector.mqtt import MqttPublisher
from protocol.randomness import SeededRandom
from protocol.registry import Registry, parse_registry
from protocol.wire import Report, encode_report
from tests.collector.processes import CollectorProcess, committed, write_config
from tests.support.broker import Broker, running_broker

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "deploy" / "usecases.example.toml"
TOPIC = "ldp/v1/reports/#"


def _hcms_stream(registry: Registry, count: int) -> list[tuple[str, bytes]]:
    uc = registry.use_cases["safari-energy-domains"]
    mech: Any = uc.mechanism
    rng = SeededRandom(11)
    domains = [f"site{i}.example" for i in range(2000)]
    picks = np.random.default_rng(1).zipf(1.3, size=count) % len(domains)
    batch = mech.privatize_many([domains[int(i)] for i in picks], rng)
    period = uc.period.index_at(time.time())
    ids = np.random.default_rng(2).bytes(16 * count)
    out = []
    for i, (j, ell, bit) in enumerate(zip(batch.j.tolist(), batch.ell.tolist(), batch.bits.tolist(), strict=True)):
        report = Report(
            use_case=uc.name,
            registry_hash=registry.hash,
            period=period,
            report_id=ids[16 * i : 16 * i + 16],
            records=[[j, ell, bit]],
        )
        out.append((f"ldp/v1/reports/{uc.name}", encode_report(report)))
    return out


def _counter_stream(registry: Registry, count: int, records: int = 20) -> list[tuple[str, bytes]]:
    # A device's 1BitMean answers are memoized bits; their wire form is one 0/1 per counter.
    uc = registry.use_cases["app-usage-seconds"]
    gen = np.random.default_rng(3)
    bits = gen.integers(0, 2, size=(count, records), dtype=np.uint8).tolist()
    ids = gen.bytes(16 * count)
    period = uc.period.index_at(time.time())
    return [
        (
            f"ldp/v1/reports/{uc.name}",
            encode_report(
                Report(
                    use_case=uc.name,
                    registry_hash=registry.hash,
                    period=period,
                    report_id=ids[16 * i : 16 * i + 16],
                    records=bits[i],
                )
            ),
        )
        for i in range(count)
    ]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _broker_pid(broker: Broker) -> int:
    assert broker.process is not None
    return broker.process.pid


def _publish(broker: Broker, items: Sequence[tuple[str, bytes]], client_id: str = "bench-pub") -> float:
    start = time.perf_counter()
    asyncio.run(MqttPublisher(broker.host, broker.port, client_id=client_id, window=5000).publish_all(items))
    return time.perf_counter() - start


def _sub_cmd(broker: Broker, client_id: str, *extra: str) -> list[str]:
    binary = shutil.which("mosquitto_sub")
    if binary is None:
        raise RuntimeError("mosquitto_sub is not installed (apt-get install mosquitto-clients)")
    return [binary, "-h", broker.host, "-p", str(broker.port), "-t", TOPIC, "-q", "1", "-c", "-i", client_id, *extra]


def _mosquitto_sub(broker: Broker, items: Sequence[tuple[str, bytes]], tag: str) -> dict[str, Any]:
    n = len(items)
    # backlog: create the persistent session, queue the stream, then time the drain.
    subprocess.run(_sub_cmd(broker, f"sub-b-{tag}", "-E"), check=True, timeout=30)
    _publish(broker, items)
    start = time.perf_counter()
    subprocess.run(
        _sub_cmd(broker, f"sub-b-{tag}", "-C", str(n), "-W", "600"), check=True, stdout=subprocess.DEVNULL, timeout=700
    )
    backlog = time.perf_counter() - start
    # live: subscribed first, then the stream published while it receives.
    subprocess.run(_sub_cmd(broker, f"sub-l-{tag}", "-E"), check=True, timeout=30)
    proc = subprocess.Popen(_sub_cmd(broker, f"sub-l-{tag}", "-C", str(n), "-W", "600"), stdout=subprocess.DEVNULL)
    time.sleep(0.3)  # let it connect (its session already exists, so nothing is lost either way)
    start = time.perf_counter()
    _publish(broker, items)
    proc.wait(timeout=700)
    live = time.perf_counter() - start
    return {"backlog_msgs_per_s": rate(n, backlog), "live_msgs_per_s": rate(n, live)}


def _paho_cmd(broker: Broker, client_id: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "benchmarks.paho_subscriber",
        "--host",
        broker.host,
        "--port",
        str(broker.port),
        "--client-id",
        client_id,
        *extra,
    ]


def _paho_manual_ack(broker: Broker, items: Sequence[tuple[str, bytes]], tag: str) -> dict[str, Any]:
    """paho-mqtt with ``manual_ack=True``, acknowledging each message as it arrives (its ceiling)."""
    n = len(items)
    subprocess.run(
        _paho_cmd(broker, f"paho-b-{tag}", "--create"), check=True, timeout=60, cwd=ROOT, stdout=subprocess.DEVNULL
    )
    _publish(broker, items)
    start = time.perf_counter()
    drain = _paho_cmd(broker, f"paho-b-{tag}", "--count", str(n))
    done = subprocess.run(drain, check=True, capture_output=True, text=True, timeout=960, cwd=ROOT)
    backlog = time.perf_counter() - start
    cpu = float(done.stdout.split()[1])
    subprocess.run(
        _paho_cmd(broker, f"paho-l-{tag}", "--create"), check=True, timeout=60, cwd=ROOT, stdout=subprocess.DEVNULL
    )
    proc = subprocess.Popen(_paho_cmd(broker, f"paho-l-{tag}", "--count", str(n)), stdout=subprocess.DEVNULL, cwd=ROOT)
    time.sleep(0.5)  # let it connect (its session already exists, so nothing is lost either way)
    start = time.perf_counter()
    _publish(broker, items)
    proc.wait(timeout=960)
    live = time.perf_counter() - start
    return {
        "backlog_msgs_per_s": rate(n, backlog),
        "live_msgs_per_s": rate(n, live),
        "backlog_cpu_us_per_msg": round(cpu / n * 1e6, 2),
    }


def _wait(store: Path, registry: Registry, n: int, timeout: float = 900) -> float:
    deadline = time.monotonic() + timeout
    while committed(store, registry).get("reports", 0) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"collector committed {committed(store, registry)} of {n}")
        time.sleep(0.02)
    return time.perf_counter()


def _collectors(
    items: Sequence[tuple[str, bytes]], registry: Registry, work: Path, *, processes: int, tag: str
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in ("backlog", "live"):
        with running_broker(work / f"broker-{tag}-{mode}-{processes}") as broker:
            out |= _collector_run(broker, items, registry, work, processes=processes, tag=tag, mode=mode)
    return out


def _collector_run(
    broker: Broker,
    items: Sequence[tuple[str, bytes]],
    registry: Registry,
    work: Path,
    *,
    processes: int,
    tag: str,
    mode: str,
) -> dict[str, Any]:
    n = len(items)
    out: dict[str, Any] = {}
    directory = work / f"{tag}-{mode}-{processes}"
    store = directory / "store.sqlite3"
    group = "bench" if processes > 1 else ""
    procs = [
        CollectorProcess(
            write_config(
                directory,
                registry=REGISTRY,
                host=broker.host,
                port=broker.port,
                client_id=f"col-{tag}-{mode}-{processes}-{i}",
                instance=f"member-{i}",
                store=store,
                shared_group=group,
                extra="",
            ),
            log=directory / f"collector-{i}.log",
        )
        for i in range(processes)
    ]
    try:
        for p in procs:
            p.start()
        if mode == "backlog":
            for p in procs:
                assert p.stop() == 0
            _publish(broker, items)
            start = time.perf_counter()
            for p in procs:
                p.launch()
            # The drain is timed from the first READY: members that start later only make the
            # measured rate lower, never higher.
            procs[0].wait_ready()
            ready = time.perf_counter()
            for p in procs[1:]:
                p.wait_ready()
            cpu0 = [_cpu_seconds(p.pid) for p in procs]
            broker_cpu0 = _cpu_seconds(_broker_pid(broker))
            end = _wait(store, registry, n)
            cpu = sum(_cpu_seconds(p.pid) for p in procs) - sum(cpu0)
            out["backlog_msgs_per_s"] = rate(n, end - ready)
            out["backlog_including_startup_s"] = round(end - start, 3)
            # CPU per message is what the machine's load does not distort: the collectors'
            # own cost (decode, fold, commit, acknowledge), and the broker's meanwhile.
            out["backlog_collector_cpu_us_per_msg"] = round(cpu / n * 1e6, 2)
            out["backlog_collector_cores_busy"] = round(cpu / (end - ready), 2)
            out["backlog_broker_cores_busy"] = round(
                (_cpu_seconds(_broker_pid(broker)) - broker_cpu0) / (end - ready), 2
            )
        else:
            start = time.perf_counter()
            _publish(broker, items)
            end = _wait(store, registry, n)
            out["live_msgs_per_s"] = rate(n, end - start)
        counters = committed(store, registry)
        assert counters.get("reports") == n, counters
        for p in procs:
            assert p.stop() == 0
    finally:
        for p in procs:
            p.close()
    return out


def bench(single: int, counters: int, *, pair: bool = True) -> dict[str, Any]:
    """Run every shape and consumer; one JSON-ready document."""
    registry = parse_registry(REGISTRY.read_bytes(), source=str(REGISTRY))
    shapes = [
        ("single", "hcms safari-energy-domains (k=1024, m=32768), 1 record per message", 1, single, _hcms_stream),
        ("counters", "one-bit-mean app-usage-seconds, 20 records per message", 20, counters, _counter_stream),
    ]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-collector-") as tmp:
        work = Path(tmp)
        for tag, what, records, n, make in shapes:
            progress(f"{tag}: generating {n} messages")
            items = make(registry, n)
            size = sum(len(p) for _, p in items) / n
            # A fresh broker for every consumer: no session of an earlier run (which would
            # keep receiving copies, or a share of a shared subscription) burdens the next.
            progress(f"{tag}: mosquitto_sub")
            with running_broker(work / f"broker-{tag}-sub") as broker:
                sub = _mosquitto_sub(broker, items, tag)
            progress(f"{tag}: paho-mqtt, manual acknowledgement")
            with running_broker(work / f"broker-{tag}-paho") as broker:
                paho = _paho_manual_ack(broker, items, tag)
            progress(f"{tag}: one collector")
            one = _collectors(items, registry, work, processes=1, tag=tag)
            two = {}
            if pair:
                progress(f"{tag}: two collectors (shared subscription)")
                two = _collectors(items, registry, work, processes=2, tag=tag)
            row: dict[str, Any] = {
                "shape": tag,
                "stream": what,
                "messages": n,
                "records_per_message": records,
                "payload_bytes_mean": round(size, 1),
                "mosquitto_sub": sub,
                "paho_manual_ack": paho,
                "collector_1": one | {"backlog_records_per_s": round(one["backlog_msgs_per_s"] * records, 1)},
                "ratio_1_to_sub_backlog": round(one["backlog_msgs_per_s"] / sub["backlog_msgs_per_s"], 3),
                "ratio_1_to_sub_live": round(one["live_msgs_per_s"] / sub["live_msgs_per_s"], 3),
                # The collector's whole pipeline against paho doing nothing but acknowledging:
                # >= 2 keeps the collector's own client (docs/mqtt-client.md).
                "ratio_1_to_paho_backlog": round(one["backlog_msgs_per_s"] / paho["backlog_msgs_per_s"], 3),
                "ratio_1_to_paho_live": round(one["live_msgs_per_s"] / paho["live_msgs_per_s"], 3),
                "cpu_per_msg_paho_alone_over_collector": round(
                    paho["backlog_cpu_us_per_msg"] / one["backlog_collector_cpu_us_per_msg"], 3
                ),
            }
            if two:
                row["collector_2_shared"] = two | {
                    "backlog_records_per_s": round(two["backlog_msgs_per_s"] * records, 1)
                }
                row["scaling_2_over_1_backlog"] = round(two["backlog_msgs_per_s"] / one["backlog_msgs_per_s"], 3)
                row["scaling_2_over_1_live"] = round(two["live_msgs_per_s"] / one["live_msgs_per_s"], 3)
            rows.append(row)
    return {
        "benchmark": "collector",
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "targets": {"single_msgs_per_s": 10_000, "counters_records_per_s": 100_000},
        "results": rows,
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: ``python -m benchmarks.bench_collector [--single N] [--counters N] [--no-pair]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--single", type=int, default=100_000, help="messages of the one-record shape")
    parser.add_argument("--counters", type=int, default=50_000, help="messages of the 20-record shape")
    parser.add_argument("--no-pair", action="store_true", help="skip the two-process shared-subscription run")
    args = parser.parse_args(argv)
    emit(bench(args.single, args.counters, pair=not args.no_pair))


if __name__ == "__main__":
    main()
