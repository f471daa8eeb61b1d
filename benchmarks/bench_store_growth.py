"""A commit's cost per report as the checkpoint store grows: at 10^5 stored report ids, and at 10^7.

``python -m benchmarks.bench_store_growth`` prints one JSON document. No broker and no decoding
in the timed part: one process commits a simulated fleet's reports into one store, in batches
of ``--batch`` (ingest's ``commit_max_reports``), shuffled as ingest shuffles them, each under
its device's identity (``fleet-sim/<device>``, so every report also takes an allowance slot,
docs/device-identity.md), in the order the fleet's scale mode sends them: day by day, slot by
slot, use case by use case, device by device. The registry is the demo's
(``deploy/fleet.usecases.toml``: 14 reports a device and day, in 14 (use case, period) keys a
day). Each report carries a genuinely privatized record, one of 64 made per use case by the
fleet's own privatizers.

When the store holds each of ``--at`` report ids, the next ``--window`` reports are measured:
CPU (user + system, of this process, which does the database work itself) and wall time of
their commits, the bytes the process wrote (``/proc/self/io``: ``wchar``, through system calls,
the write-ahead log and its checkpoints included) and the file's size per stored id. A window
long enough to hold the store's periodic work (a settle of the runs, collector/store/
sqlite_ids.py) charges each report its share. The run ends by checking that the store
counted every report once. Only the store's public interface is used, so the same script
measures an earlier version of the code (put its checkout first on ``PYTHONPATH``).

    python -m benchmarks.bench_store_growth --devices 1000000 --at 100000,10000000 --window 2000000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import emit, progress
from collector.config import StoreConfig
from collector.store import CheckpointStore, Store
from collector.store.postgres import PostgresStore
from fleet.scale_privatize import device_privatizer
from fleet.values import build_generator, default_spec
from protocol.randomness import SeededRandom
from protocol.registry import Registry, UseCase, parse_registry
from protocol.server.contract import Batch
from protocol.wire import REPORT_ID_SIZE, decode_report, encode_reports

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "deploy" / "fleet.usecases.toml"
TEMPLATES = 64
"""Distinct records made per use case; device d carries record d mod 64."""
SLOT_SECONDS = 6 * 3600


@dataclass(frozen=True, slots=True)
class _Report:
    """What the store needs of a report (collector.store.FoldedReport)."""

    use_case: UseCase
    period: int
    report_id: bytes
    batch: Batch


def _templates(registry: Registry, use_case: UseCase, period: int) -> list[Batch]:
    """``TEMPLATES`` privatized one-record batches of ``use_case``, through the wire and back."""
    rng = SeededRandom(36)
    generator = build_generator(
        use_case, default_spec(use_case), devices=TEMPLATES, seed=36, registry_dir=REGISTRY.parent
    )
    privatizer = device_privatizer(use_case, TEMPLATES, rng)
    values = [v for v in generator.values(0) if v is not None]
    inputs = [privatizer.value(v) for v in values]
    records = privatizer.records(np.arange(len(inputs), dtype=np.int64), inputs, rng)
    ids = [bytes([i]) * REPORT_ID_SIZE for i in range(len(records))]
    payloads = encode_reports(use_case.name, use_case.definition, period, ids, [[r] for r in records])
    return [decode_report(p, registry).batch for p in payloads]


def _stream(registry: Registry, devices: int, batch: int, seed: int) -> Iterator[tuple[list[_Report], list[bytes]]]:
    """The fleet's reports in its order, as shuffled commits with their senders; never ends."""
    gen = np.random.default_rng(seed)
    start = int(time.time()) // 86_400 * 86_400 - 86_400  # yesterday, as the demo simulates it
    use_cases = sorted(registry.use_cases.values(), key=lambda uc: uc.name)
    templates = {uc.name: _templates(registry, uc, uc.period.index_at(start)) for uc in use_cases}
    senders = [f"fleet-sim/{d:07d}".encode() for d in range(devices)]
    pending: list[tuple[_Report, bytes]] = []
    slot = 0
    while True:
        at = start + slot * SLOT_SECONDS
        for uc in use_cases:
            if (slot * SLOT_SECONDS) % uc.period.seconds:
                continue
            period, made = uc.period.index_at(at), templates[uc.name]
            ids = gen.bytes(REPORT_ID_SIZE * devices)
            for d in range(devices):
                report = _Report(uc, period, ids[REPORT_ID_SIZE * d : REPORT_ID_SIZE * (d + 1)], made[d % len(made)])
                pending.append((report, senders[d]))
                if len(pending) == batch:
                    order = gen.permutation(batch).tolist()
                    yield [pending[i][0] for i in order], [pending[i][1] for i in order]
                    pending = []
        slot += 1


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _written() -> int:
    """Bytes this process has written through system calls."""
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def _file_bytes(where: str) -> int:
    path = Path(where)
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


def run(
    store: Store, where: str, registry: Registry, *, devices: int, at: Sequence[int], window: int, batch: int
) -> dict[str, Any]:
    """Commit the fleet's stream into ``store``, measuring ``window`` reports from each size in ``at``.

    Only the commits are timed: making the next batch of reports is not.
    """
    marks = sorted(at)
    total = marks[-1] + window
    rows: list[dict[str, Any]] = []
    done = 0
    measuring: dict[str, Any] | None = None
    stream = _stream(registry, devices, batch, seed=11)
    while done < total:
        if measuring is None and marks and done >= marks[0]:
            stored = marks.pop(0)
            measuring = {"from": done, "stored": stored, "cpu": 0.0, "wall": 0.0, "written": 0}
        reports, senders = next(stream)
        cpu, written, began = _cpu(), _written(), time.perf_counter()
        result = store.commit(reports, {"messages": len(reports)}, senders)
        spent = time.perf_counter() - began
        assert result.reports == len(reports), result
        done += len(reports)
        if measuring is not None:
            measuring["wall"] += spent
            measuring["cpu"] += _cpu() - cpu
            measuring["written"] += _written() - written
            n = done - measuring["from"]
            if n >= window:
                rows.append(
                    {
                        "stored_ids": measuring["stored"],
                        "reports": n,
                        "commit_cpu_us_per_report": round(measuring["cpu"] / n * 1e6, 2),
                        "commit_wall_us_per_report": round(measuring["wall"] / n * 1e6, 2),
                        "written_bytes_per_report": round(measuring["written"] / n),
                        "load_average": [round(x, 2) for x in os.getloadavg()],
                    }
                )
                progress(f"{rows[-1]}")
                measuring = None
        if done % (50 * batch) < batch:
            progress(f"{done:,} of {total:,} reports committed")
    counted = store.counters().get("reports")
    remembered = store.seen_count()
    return {
        "results": rows,
        "reports": done,
        "file_bytes_per_id": round(_file_bytes(where) / done, 1) if not where.startswith("postgresql") else None,
        "checks": {"every_report_counted_once": counted == done and remembered == done},
    }


def bench(kind: str, devices: int, at: Sequence[int], *, window: int, batch: int, directory: Path) -> dict[str, Any]:
    """One store of ``kind`` (``sqlite`` or ``postgres``, a throwaway durable cluster) in ``directory``."""
    registry = parse_registry(REGISTRY.read_bytes(), source=str(REGISTRY))
    with contextlib.ExitStack() as stack:
        if kind == "postgres":
            from benchmarks.bench_store import _durable_postgres  # noqa: PLC0415 - psycopg's cluster only when asked

            server = stack.enter_context(_durable_postgres(directory / "pg"))
            where = server.url
            store: Store = PostgresStore(StoreConfig(url=where), registry, instance="growth")
        else:
            where = str(directory / "growth.sqlite3")
            store = CheckpointStore(Path(where), registry, instance="growth")
        stack.callback(store.close)
        doc = run(store, where, registry, devices=devices, at=at, window=window, batch=batch)
    return {
        "benchmark": "store_growth",
        "store": kind,
        "registry": str(REGISTRY.relative_to(ROOT)),
        "devices": devices,
        "batch": batch,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        **doc,
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: ``python -m benchmarks.bench_store_growth [--store S] [--devices N] [--at A,B] [--window W]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--devices", type=int, default=1_000_000, help="simulated devices (the demo's largest day)")
    parser.add_argument("--at", default="100000,10000000", help="stored report ids to measure at (comma-separated)")
    parser.add_argument("--window", type=int, default=2_000_000, help="reports measured from each size")
    parser.add_argument("--batch", type=int, default=4000, help="reports per commit (ingest's commit_max_reports)")
    parser.add_argument("--dir", type=Path, default=None, help="where the store goes (default: a temporary directory)")
    args = parser.parse_args(argv)
    at = [int(x) for x in args.at.split(",") if x]
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        emit(bench(args.store, args.devices, at, window=args.window, batch=args.batch, directory=args.dir))
        return
    with tempfile.TemporaryDirectory(prefix="bench-store-growth-") as tmp:
        emit(bench(args.store, args.devices, at, window=args.window, batch=args.batch, directory=Path(tmp)))


if __name__ == "__main__":
    main()
