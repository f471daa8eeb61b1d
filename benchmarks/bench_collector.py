"""End-to-end collector throughput through a real Mosquitto: SQLite, a PostgreSQL group, and bare subscribers.

``python -m benchmarks.bench_collector`` prints one JSON document. Two message shapes, with
the example registry (``deploy/usecases.example.toml``, the papers' deployed parameters),
made by the load generator (``benchmarks.load``: genuinely privatized reports from the batch
APIs, **not full agents**):

* ``single``: one record per message, a Hadamard CMS report of ``safari-energy-domains``
  (k = 1,024, m = 32,768) - the shape of an event-level use case;
* ``counters``: 20 records per message, one device's app-usage 1BitMean counters
  (``app-usage-seconds``);
* ``cms`` and ``olh`` (``--cms N``, ``--olh N``, none by default): one record per message of
  ``emoji`` (Count Mean Sketch, k = 65,536, m = 1,024) and of ``emoji-olh`` (optimal local
  hashing, 4,096 hash functions), the same question with the two mechanisms; the collector's
  CPU per message of the two tells whether ``olh``'s ingest costs more than CMS's.

For each shape and each consumer the same QoS 1 stream goes through a fresh broker:

* ``backlog``: the stream is queued while the consumer reads nothing, then it drains it: the
  consumer's own speed, without the publisher competing for the two cores. The reference
  subscribers are disconnected meanwhile (their persistent sessions queue it); collectors
  stay connected but stopped (SIGSTOP), so what they do once - start up, create the period's
  partitions, materialise the aggregate their live view keeps - is not charged to the stream;
* ``live``: the consumer is up and the stream is published at full speed meanwhile (the
  load generator alone reaches 50,000-60,000 msgs/s on this machine; each run prints the
  rate it reached);
* ``isolated`` (groups only): a backlog drained by one member at a time, each with the
  cores to itself - what each member costs on a machine of its own. Its rate is not the
  group's.

Each collector setup runs ``--repeat`` times (default 3), interleaved with the others; its
figures are the medians of its runs (``..._runs`` lists the rates and CPU per message of
each). Before the measured stream, collectors take a warm-up stream (a tenth as long, other
report ids, same use case and period); the CPU it cost is printed per member
(``warmup_collector_cpu_s_per_member``), not counted in the figures per message.

Consumers: ``mosquitto_sub -q 1`` (the reference: receives and acknowledges, nothing else);
paho-mqtt with ``manual_ack=True`` acknowledging each message on receipt
(``benchmarks.paho_subscriber``: the ceiling of a collector built on paho); one collector
process on SQLite (``python -m collector run``: decodes, de-duplicates, shuffles, folds and
commits, then acknowledges); and 1, 2 and 3 collector processes in an MQTT 5
shared-subscription group on one PostgreSQL database (a throwaway cluster made for the run,
``fsync`` on, like SQLite's ``synchronous=FULL``). A collector's count is what is
*committed* (read from its store), so the rate is end to end.

CPU comes from ``/proc``: the collectors' (summed over the members), the broker's, and the
database's (the postmaster and every backend and helper it forked, exited ones included),
each over the drain, per message and as cores kept busy - which part saturates first on this
machine. The targets printed with pass/fail: on PostgreSQL one member reaches at least 70 %
of its SQLite throughput; with three members the collectors' CPU per message is within 1.2x
of one member's (adding members adds no cost per message), in each mode. ``isolated`` is the
steadiest of the three: in the others every process shares the two cores, and a member
receiving a third of a live stream works in shorter bursts, which this machine charges more
CPU per unit of work: the same msgpack-decode loop costs 0.78 us a unit flat out, 1.2 us in
1,000-unit bursts 5 ms apart and 2.5 us in 50-unit bursts (an idle vCPU is halted, and a
woken one starts cold; busy loops at ``SCHED_IDLE`` keeping every core running cut that to
0.91 and 1.29 us, but did not move the collector ratios beyond their run-to-run spread).

``--brokers`` adds one collector on one broker against two, per shape (``benchmarks.collector_brokers``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.collector_brokers import compare_brokers
from benchmarks.harness import emit, progress, rate
from benchmarks.load import LABEL, build_counters, build_single, build_strings, publish
from collector.config import IngestConfig
from protocol.registry import Registry, parse_registry
from tests.collector.processes import CollectorProcess, committed, write_config
from tests.support.broker import Broker, free_port, running_broker
from tests.support.postgres import PostgresServer, find_postgres

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "deploy" / "usecases.example.toml"
TOPIC = "ldp/v1/reports/#"


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU time of a process so far (Linux /proc); with ``children``, also that
    of its children it has waited for (exited ones)."""
    fields = _stat(pid)
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def _tree_cpu_seconds(pid: int) -> float:
    """CPU of a server and of everything it forked: its exited children (reaped, so in its own
    cutime/cstime) and the live ones (a PostgreSQL postmaster: backends, WAL writer, checkpointer)."""
    total = _cpu_seconds(pid, children=True)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = _stat(int(entry.name))
            if int(fields[1]) == pid:
                total += _cpu_seconds(int(entry.name), children=True)
    return total


def _instance_reports(store: Path | str, registry: Registry, instance: str) -> int:
    """Reports committed so far by one member."""
    return committed(store, registry, instance).get("reports", 0)


def _server_cpu(broker: Broker, db: Database | None, setup: Setup) -> tuple[float, float]:
    """CPU seconds so far of the broker and (PostgreSQL runs) of the database server."""
    db_cpu = _tree_cpu_seconds(db.pid) if db is not None and setup.backend == "postgresql" else 0.0
    return _cpu_seconds(_broker_pid(broker)), db_cpu


def _broker_pid(broker: Broker) -> int:
    assert broker.process is not None
    return broker.process.pid


def _publish(broker: Broker, items: Sequence[tuple[str, bytes]]) -> float:
    """The load generator's publishing (one pipelined QoS 1 connection); seconds until all acknowledged."""
    return publish(broker.host, broker.port, items, connections=1, window=5000)


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


@dataclass(frozen=True)
class Setup:
    """One collector configuration: ``members`` processes folding into ``backend``."""

    backend: str  # "sqlite" or "postgresql"
    members: int

    @property
    def name(self) -> str:
        """The key in the JSON document."""
        return f"{self.backend}_{self.members}"


class Database:
    """A throwaway PostgreSQL cluster for the run, ``fsync`` on; a fresh database per measurement."""

    def __init__(self, directory: Path) -> None:
        bindir = find_postgres()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (deploy/test.sh does)")
        self.server = PostgresServer(directory=directory, port=free_port(), bindir=bindir)
        self.server.init()
        with (self.server.data / "postgresql.conf").open("a") as f:
            # The test fixture turns durability off; a throughput comparison with SQLite's
            # synchronous=FULL must not (the later lines win).
            f.write("fsync = on\nfull_page_writes = on\nsynchronous_commit = on\n")
        self.server.start()
        self.server.create_database()
        self._names = itertools.count()

    def fresh_url(self) -> str:
        """A new empty database's URL."""
        name = f"bench_{next(self._names)}"
        self.server.run_sql(f"CREATE DATABASE {name} OWNER {self.server.user}")
        return self.server.with_database(name).url

    @property
    def pid(self) -> int:
        """The postmaster's process id."""
        return int((self.server.data / "postmaster.pid").read_text().split()[0])

    def close(self) -> None:
        """Stop the cluster."""
        self.server.stop(mode="fast")


@contextlib.contextmanager
def _database(work: Path, needed: bool) -> Iterator[Database | None]:
    if not needed:
        yield None
        return
    db = Database(work / "postgres")
    try:
        yield db
    finally:
        db.close()


def _wait(store: Path | str, registry: Registry, n: int, timeout: float = 900) -> float:
    deadline = time.monotonic() + timeout
    # PostgreSQL is polled more gently: each poll is a new connection (a forked backend).
    interval = 0.02 if isinstance(store, Path) else 0.2
    while committed(store, registry).get("reports", 0) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"collector committed {committed(store, registry)} of {n}")
        time.sleep(interval)
    return time.perf_counter()


def _collectors(
    items: Sequence[tuple[str, bytes]],
    warmup: Sequence[tuple[str, bytes]],
    registry: Registry,
    work: Path,
    *,
    setup: Setup,
    tag: str,
    db: Database | None,
    modes: Sequence[str],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in modes:
        if mode == "isolated" and setup.members == 1:
            continue  # one member alone is the backlog run
        with running_broker(work / f"broker-{tag}-{mode}-{setup.name}") as broker:
            out |= _collector_run(broker, items, warmup, registry, work, setup=setup, tag=tag, mode=mode, db=db)
    return out


def _members(broker: Broker, store: Path | str, directory: Path, *, setup: Setup, name: str) -> list[CollectorProcess]:
    """The group's collector processes (not started), each with its own instance and client id."""
    group = "bench" if setup.members > 1 else ""
    procs = [
        CollectorProcess(
            write_config(
                directory,
                registry=REGISTRY,
                host=broker.host,
                port=broker.port,
                client_id=f"col-{name}-{i}",
                instance=f"member-{i}",
                store=store,
                shared_group=group,
                extra="",
            ),
            log=directory / f"collector-{i}.log",
        )
        for i in range(setup.members)
    ]
    for p in procs:
        _production_batching(p.config)
    return procs


def _signal_all(procs: Sequence[CollectorProcess], sig: signal.Signals) -> None:
    for p in procs:
        if p.process is not None and p.process.poll() is None:
            os.kill(p.pid, sig)


def _collector_run(
    broker: Broker,
    items: Sequence[tuple[str, bytes]],
    warmup: Sequence[tuple[str, bytes]],
    registry: Registry,
    work: Path,
    *,
    setup: Setup,
    tag: str,
    mode: str,
    db: Database | None,
) -> dict[str, Any]:
    """One measured drain of ``items`` by the setup's members, after ``warmup``, in ``mode``.

    ``backlog``: the members are stopped (SIGSTOP: connected, reading nothing) while the
    stream is published, then all resumed at once; ``isolated``: the same, but resumed one at
    a time, each draining its share with the cores to itself; ``live``: the stream is
    published while they run.
    """
    n, w = len(items), len(warmup)
    directory = work / f"{tag}-{mode}-{setup.name}"
    store: Path | str
    if setup.backend == "postgresql":
        assert db is not None
        store = db.fresh_url()
    else:
        store = directory / "store.sqlite3"
    procs = _members(broker, store, directory, setup=setup, name=f"{tag}-{mode}-{setup.name}")
    out: dict[str, Any] = {}
    try:
        for p in procs:
            p.launch()
        for p in procs:
            p.wait_ready()  # every member's session and subscription exist before any message
        # The warm-up stream: what a member does once (its first commits create the period's
        # partitions, its live view materialises the key - for the Safari sketch a 128 MiB
        # table whose first touch alone costs 0.1-0.25 s of kernel time) is paid here, not
        # charged to the measured messages. Printed, per member.
        launched = [_cpu_seconds(p.pid) for p in procs]
        _publish(broker, warmup)
        _wait(store, registry, w)
        cpu0 = [_cpu_seconds(p.pid) for p in procs]
        out["warmup_collector_cpu_s_per_member"] = round((sum(cpu0) - sum(launched)) / len(procs), 3)
        reports0 = [_instance_reports(store, registry, f"member-{i}") for i in range(len(procs))]
        if mode == "live":
            server0 = _server_cpu(broker, db, setup)
            start = time.perf_counter()
            out["publish_msgs_per_s"] = rate(n, _publish(broker, items))
        else:
            _signal_all(procs, signal.SIGSTOP)
            out["publish_msgs_per_s"] = rate(n, _publish(broker, items))
            server0 = _server_cpu(broker, db, setup)
            start = time.perf_counter()
            if mode == "isolated":
                _drain_one_at_a_time(procs, store, registry, n)
            _signal_all(procs, signal.SIGCONT)
        end = _wait(store, registry, w + n)
        out |= _measured(
            procs,
            store,
            registry,
            (broker, db, setup),
            mode=mode,
            n=n,
            cpu0=cpu0,
            reports0=reports0,
            server0=server0,
            seconds=end - start,
        )
        counters = committed(store, registry)
        assert counters.get("reports") == w + n, counters
        for p in procs:
            assert p.stop() == 0
    finally:
        _signal_all(procs, signal.SIGCONT)  # a member stopped by a failed run can still end
        for p in procs:
            p.close()
    return out


def _drain_one_at_a_time(procs: Sequence[CollectorProcess], store: Path | str, registry: Registry, n: int) -> None:
    """Resume the stopped members one after another, each until it has committed its share.

    The broker hands a shared subscription's messages out in turn and does not skip a stopped
    member (nothing limits its queue), so each holds about ``n / members`` of the stream; a
    member that has committed nothing new for two seconds short of that is taken as done,
    and any remainder is drained by all of them at the end.
    """
    share = n // len(procs)
    for i, p in enumerate(procs):
        base = last = _instance_reports(store, registry, f"member-{i}")
        os.kill(p.pid, signal.SIGCONT)
        deadline = time.monotonic() + 600
        progressed = time.monotonic()
        while last - base < share and time.monotonic() - progressed < 2.0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"member-{i} committed {last - base} of its share of {share}")
            time.sleep(0.05)
            now = _instance_reports(store, registry, f"member-{i}")
            if now != last:
                last, progressed = now, time.monotonic()
        if i < len(procs) - 1:
            os.kill(p.pid, signal.SIGSTOP)


def _measured(
    procs: Sequence[CollectorProcess],
    store: Path | str,
    registry: Registry,
    servers: tuple[Broker, Database | None, Setup],
    *,
    mode: str,
    n: int,
    cpu0: Sequence[float],
    reports0: Sequence[int],
    server0: tuple[float, float],
    seconds: float,
) -> dict[str, Any]:
    """The figures of one drain: rate, CPU per message of each part, cores kept busy."""
    members_cpu = [_cpu_seconds(p.pid) - c for p, c in zip(procs, cpu0, strict=True)]
    members_reports = [_instance_reports(store, registry, f"member-{i}") - r for i, r in enumerate(reports0)]
    broker_after, db_after = _server_cpu(*servers)
    broker_cpu, db_cpu = broker_after - server0[0], db_after - server0[1]
    counted = sum(members_reports)
    # CPU per message is what the machine's load distorts least: the collectors' own cost
    # (decode, fold, commit, acknowledge), the broker's and the database's meanwhile.
    out: dict[str, Any] = {
        f"{mode}_msgs_per_s": rate(n, seconds),
        f"{mode}_collector_cpu_msgs": counted,
        f"{mode}_collector_cpu_us_per_msg": round(sum(members_cpu) / max(counted, 1) * 1e6, 2),
        f"{mode}_broker_cpu_us_per_msg": round(broker_cpu / n * 1e6, 2),
        f"{mode}_messages_per_member": members_reports,
        f"{mode}_cores_busy": {
            "collectors": round(sum(members_cpu) / seconds, 2),
            "per_member": [round(c / seconds, 2) for c in members_cpu],
            "broker": round(broker_cpu / seconds, 2),
        },
    }
    if servers[2].backend == "postgresql":
        out[f"{mode}_database_cpu_us_per_msg"] = round(db_cpu / n * 1e6, 2)
        out[f"{mode}_cores_busy"]["database"] = round(db_cpu / seconds, 2)
    return out


def _production_batching(config: Path) -> None:
    """The deployed commit batching (``[ingest]`` defaults), not the tests' quick one: a
    member's cost per message depends on how many messages a commit carries."""
    defaults = IngestConfig()
    text = config.read_text(encoding="utf-8")
    text = re.sub(r"commit_max_reports = \d+", f"commit_max_reports = {defaults.commit_max_reports}", text)
    text = re.sub(r"commit_interval_s = [\d.]+", f"commit_interval_s = {defaults.commit_interval_s}", text)
    config.write_text(text, encoding="utf-8")


SETUPS = (Setup("sqlite", 1), Setup("postgresql", 1), Setup("postgresql", 2), Setup("postgresql", 3))
PG_OVER_SQLITE_TARGET = 0.70
CPU_3_OVER_1_TARGET = 1.2
MODES = ("backlog", "live", "isolated")
WARMUP_FRACTION = 10
WARMUP_MIN = 2000


_EVERY_RUN = ("_msgs_per_s", "_collector_cpu_us_per_msg")
"""Figures also printed run by run (``<key>_runs``) when the collectors ran more than once."""


def _median_of(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One setup's figures over its runs: each number the median of its runs; the details
    that are not single numbers (cores busy, counts per member) the first run's."""
    out = dict(runs[0])
    for key, first in runs[0].items():
        if isinstance(first, bool) or not isinstance(first, int | float):
            continue
        values = [run[key] for run in runs]
        out[key] = round(statistics.median(values), 3)
        if len(runs) > 1 and key.endswith(_EVERY_RUN):
            out[f"{key}_runs"] = values
    return out


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("inf")


def bench(
    single: int,
    counters: int,
    *,
    setups: Sequence[Setup] = SETUPS,
    modes: Sequence[str] = MODES,
    references: bool = True,
    repeat: int = 1,
    brokers: bool = False,
    cms: int = 0,
    olh: int = 0,
) -> dict[str, Any]:
    """Run every shape, consumer and collector setup (the collectors ``repeat`` times); one JSON-ready document."""
    registry = parse_registry(REGISTRY.read_bytes(), source=str(REGISTRY))
    shapes: list[tuple[str, str, int, int, Callable[..., list[tuple[str, bytes]]]]] = [
        ("single", "hcms safari-energy-domains (k=1024, m=32768), 1 record per message", 1, single, build_single),
        ("counters", "one-bit-mean app-usage-seconds, 20 records per message", 20, counters, build_counters),
        (
            "cms",
            "cms emoji (k=65536, m=1024), 1 record per message",
            1,
            cms,
            functools.partial(build_strings, use_case="emoji"),
        ),
        (
            "olh",
            "olh emoji-olh (4096 hash functions), 1 record per message",
            1,
            olh,
            functools.partial(build_strings, use_case="emoji-olh"),
        ),
    ]
    rows = []
    targets: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-collector-") as tmp:
        work = Path(tmp)
        with _database(work, any(s.backend == "postgresql" for s in setups)) as db:
            for tag, what, records, n, make in shapes:
                if n <= 0:
                    continue
                progress(f"{tag}: generating {n} messages (load generator)")
                items = make(registry, n, seed=7)
                warmup = make(registry, max(n // WARMUP_FRACTION, WARMUP_MIN), seed=8)
                size = sum(len(p) for _, p in items) / n
                row: dict[str, Any] = {
                    "shape": tag,
                    "stream": what,
                    "messages": n,
                    "warmup_messages": len(warmup),
                    "records_per_message": records,
                    "payload_bytes_mean": round(size, 1),
                }
                # A fresh broker for every consumer: no session of an earlier run (which would
                # keep receiving copies, or a share of a shared subscription) burdens the next.
                if references:
                    progress(f"{tag}: mosquitto_sub")
                    with running_broker(work / f"broker-{tag}-sub") as broker:
                        row["mosquitto_sub"] = _mosquitto_sub(broker, items, tag)
                    progress(f"{tag}: paho-mqtt, manual acknowledgement")
                    with running_broker(work / f"broker-{tag}-paho") as broker:
                        row["paho_manual_ack"] = _paho_manual_ack(broker, items, tag)
                # Repeats interleaved (1, 2, 3 members, then again): a slow spell of the
                # machine lands on every setup alike rather than on one of them.
                runs: dict[Setup, list[dict[str, Any]]] = {setup: [] for setup in setups}
                for r in range(repeat):
                    for setup in setups:
                        progress(f"{tag}: {setup.members} collector(s) on {setup.backend}, run {r + 1} of {repeat}")
                        runs[setup].append(
                            _collectors(items, warmup, registry, work, setup=setup, tag=f"{tag}{r}", db=db, modes=modes)
                        )
                for setup in setups:
                    row[f"collector_{setup.name}"] = _summary(runs[setup], row, modes, records, references=references)
                if brokers:
                    row["one_broker_against_two"] = compare_brokers(
                        items, warmup, registry, REGISTRY, work, tag=tag, modes=modes, repeat=repeat
                    )
                targets += _targets(row, modes)
                rows.append(row)
    return {
        "benchmark": "collector",
        "load": LABEL,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "seconds": round(time.perf_counter() - started, 1),
        "collector_runs": repeat,
        "results": rows,
        "targets": targets,
    }


def _summary(
    runs: Sequence[dict[str, Any]], row: dict[str, Any], modes: Sequence[str], records: int, *, references: bool
) -> dict[str, Any]:
    """One setup's medians, with records per second and (``references``) the ratios to the bare subscribers."""
    result = _median_of(runs)
    for mode in modes:
        if f"{mode}_msgs_per_s" not in result:
            continue
        result[f"{mode}_records_per_s"] = round(result[f"{mode}_msgs_per_s"] * records, 1)
        if references and mode != "isolated":
            # docs/mqtt-client.md: the collector against bare subscribers.
            for ref in ("mosquitto_sub", "paho_manual_ack"):
                other = row[ref][f"{mode}_msgs_per_s"]
                result[f"{mode}_ratio_to_{ref}"] = _ratio(result[f"{mode}_msgs_per_s"], other)
    return result


def _targets(row: dict[str, Any], modes: Sequence[str]) -> list[dict[str, Any]]:
    """The two targets of the module docstring for one shape, each with its figures and pass/fail.

    Cost per message of three members against one is judged in every mode. The ``isolated``
    drain (each member with the two cores to itself, as on three machines) is the one the
    machine disturbs least; in ``backlog`` and ``live`` the members share the two cores
    with the broker, the database and (``live``) the publisher.
    """
    out: list[dict[str, Any]] = []
    sqlite, pg1, pg3 = (row.get(f"collector_{name}") for name in ("sqlite_1", "postgresql_1", "postgresql_3"))
    if sqlite is not None and pg1 is not None:
        for mode in modes:
            if mode == "isolated":
                continue
            value = _ratio(pg1[f"{mode}_msgs_per_s"], sqlite[f"{mode}_msgs_per_s"])
            out.append(
                {
                    "target": f"{row['shape']} {mode}: PostgreSQL one member >= 70 % of SQLite (msgs/s)",
                    "value": value,
                    "pass": value >= PG_OVER_SQLITE_TARGET,
                }
            )
    if pg1 is not None and pg3 is not None:
        for mode in modes:
            # One member alone drains a backlog the same way with or without the others.
            base = pg1[f"{'backlog' if mode == 'isolated' else mode}_collector_cpu_us_per_msg"]
            value = _ratio(pg3[f"{mode}_collector_cpu_us_per_msg"], base)
            out.append(
                {
                    "target": f"{row['shape']} {mode}: collector CPU per message, 3 members <= 1.2x one member",
                    "value": value,
                    "pass": value <= CPU_3_OVER_1_TARGET,
                }
            )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: ``python -m benchmarks.bench_collector [--single N] [--counters N] ...`` (see ``--help``)."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="With the defaults the run takes about four minutes on a 2-core machine; it prints one JSON "
        "document on stdout and its progress on stderr.",
    )
    parser.add_argument(
        "--single", type=int, default=60_000, help="messages of the one-record shape (default 60,000; 0: skip)"
    )
    parser.add_argument(
        "--counters", type=int, default=30_000, help="messages of the 20-record shape (default 30,000; 0: skip)"
    )
    parser.add_argument("--cms", type=int, default=0, help="messages of the CMS emoji shape (default 0: skip)")
    parser.add_argument("--olh", type=int, default=0, help="messages of the OLH emoji-olh shape (default 0: skip)")
    parser.add_argument(
        "--members", default="1,2,3", help="PostgreSQL group sizes, comma-separated (default 1,2,3; empty: none)"
    )
    parser.add_argument("--no-sqlite", action="store_true", help="skip the one-collector SQLite run")
    parser.add_argument("--no-references", action="store_true", help="skip mosquitto_sub and paho-mqtt")
    parser.add_argument("--brokers", action="store_true", help="also one collector on one broker against two")
    parser.add_argument(
        "--modes",
        default="backlog,live,isolated",
        help="comma-separated drains: backlog, live, isolated (default all three)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of each collector setup, interleaved; figures are their medians (default 3)",
    )
    args = parser.parse_args(argv)
    members = [int(m) for m in args.members.split(",") if m.strip()]
    if any(m < 1 for m in members):
        parser.error("--members takes positive group sizes")
    if args.repeat < 1:
        parser.error("--repeat takes a positive count")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes some of {', '.join(MODES)}")
    if "isolated" in modes and "backlog" not in modes:
        parser.error("--modes isolated is compared with one member's backlog drain: add backlog")
    setups = ([] if args.no_sqlite else [Setup("sqlite", 1)]) + [Setup("postgresql", m) for m in members]
    emit(
        bench(
            args.single,
            args.counters,
            setups=setups,
            modes=modes,
            references=not args.no_references,
            repeat=args.repeat,
            brokers=args.brokers,
            cms=args.cms,
            olh=args.olh,
        )
    )


if __name__ == "__main__":
    main()
