"""Checkpoint-store commit throughput: SQLite against PostgreSQL, one member and three, and two layouts.

``python -m benchmarks.bench_store`` prints one JSON document. No broker: each member is a
process that decodes its share of a stream beforehand and then only commits it to the store,
in batches of ``--batch`` reports (ingest's ``commit_max_reports``), as fast as it can. So the
figures are the store's own cost per report, the part of a collector's work that changes with
the backend. Shapes as in ``bench_collector``: ``single`` (one Hadamard CMS record per report,
``safari-energy-domains``, segments of records) and ``counters`` (20 one-bit-mean counters per
report, ``app-usage-seconds``, segments that are partial aggregates).

Stores:

* ``sqlite``: one file, ``synchronous=FULL`` (the collector's setting).
* ``postgres``: :class:`~collector.store.postgres.PostgresStore`, append-only segments
  stamped with the commit-ordered version (the layout shipped).
* ``postgres-upsert`` (``counters`` only): the alternative layout, one aggregate row per key
  read, merged and rewritten inside every commit under its row lock (the segment write
  replaced, everything else the same). For ``single`` it is not an option: the key's
  aggregate is a 1,024 x 32,768 sketch that each commit would rewrite whole.

The PostgreSQL cluster is a throwaway one (``tests.support.postgres``) with ``fsync`` and
``full_page_writes`` turned back on, so both backends make each commit durable. (The tests
pass their own cluster instead, as it is, and a few hundred reports: every step, no figure.)
Each run checks that the store counted every report once; ``--help`` lists the sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.bench_collector import REGISTRY
from benchmarks.harness import emit, progress, rate
from benchmarks.load import build_counters, build_single
from collector.config import StoreConfig
from collector.store import CheckpointStore, Store
from collector.store.postgres import PostgresStore, _Segment
from collector.store.row_format import AGGREGATE, pack, seal, unseal
from protocol.registry import parse_registry
from protocol.wire import decode_report
from tests.support.postgres import PostgresServer, running_postgres


class UpsertStore(PostgresStore):
    """The measured alternative: each commit merges its partial aggregates into the key's one row."""

    def _write_segments(self, cur: psycopg.Cursor[Any], segments: Sequence[_Segment]) -> None:
        names = {row.id: row for row in self._use_cases.values()}
        for uc, period, kind, added_reports, added_records, data in segments:
            if kind != AGGREGATE:
                raise ValueError("the upsert layout holds only partial aggregates")
            row = names[uc]
            mech = row.use_case.server
            key = (uc, period, kind, added_reports, added_records)
            part = mech.restore_aggregate(unseal("segments", key, data, self._damaged))
            reports, records = added_reports, added_records
            cur.execute(
                "SELECT reports, records, data FROM aggregates WHERE uc = %s AND period = %s FOR UPDATE", (uc, period)
            )
            found = cur.fetchone()
            if found is not None:
                base = mech.restore_aggregate(
                    unseal("aggregates", (uc, period, "", found[0], found[1]), found[2], self._damaged)
                )
                part = base.merge(part)
                reports += int(found[0])
                records += int(found[1])
            sealed = seal("aggregates", (uc, period, "", reports, records), pack(part.to_plain()))
            cur.execute(
                "INSERT INTO aggregates (uc, period, reports, records, data) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (uc, period) DO UPDATE SET reports = excluded.reports, records = excluded.records, "
                "data = excluded.data",
                (uc, period, reports, records, sealed),
            )


def _open(kind: str, where: str, instance: str) -> Store:
    registry = parse_registry(REGISTRY.read_bytes(), source=str(REGISTRY))
    if kind == "sqlite":
        return CheckpointStore(Path(where), registry, instance=instance)
    cls = UpsertStore if kind == "postgres-upsert" else PostgresStore
    return cls(StoreConfig(url=where), registry, instance=instance)


def _member(  # noqa: PLR0917 - multiprocessing passes arguments by position
    kind: str, where: str, index: int, payloads: list[bytes], batch: int, start: Any, out: Any
) -> None:
    registry = parse_registry(REGISTRY.read_bytes(), source=str(REGISTRY))
    reports = [decode_report(p, registry) for p in payloads]
    store = _open(kind, where, f"member-{index}")
    try:
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        start.wait()
        began = time.perf_counter()
        for i in range(0, len(reports), batch):
            store.commit(reports[i : i + batch], {"messages": len(reports[i : i + batch])})
        ended = time.perf_counter()
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
        out.put((began, ended, cpu))
    finally:
        store.close()


def _run(kind: str, where: str, payloads: list[bytes], members: int, batch: int) -> dict[str, Any]:
    _open(kind, where, "setup").close()  # the schema and the use cases, before the clock starts
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(members)
    out: Any = ctx.Queue()
    procs = [
        ctx.Process(target=_member, args=(kind, where, i, payloads[i::members], batch, start, out))
        for i in range(members)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"member exited with {p.exitcode}"
    store = _open(kind, where, "check")
    try:
        assert store.counters().get("reports") == len(payloads), store.counters()
    finally:
        store.close()
    wall = max(r[1] for r in results) - min(r[0] for r in results)
    cpu = sum(r[2] for r in results)
    return {
        "store": kind,
        "members": members,
        "reports_per_s": rate(len(payloads), wall),
        "member_cpu_us_per_report": round(cpu / len(payloads) * 1e6, 2),
    }


@contextlib.contextmanager
def _durable_postgres(where: Path) -> Iterator[PostgresServer]:
    """A throwaway cluster that makes each commit durable, as SQLite's ``synchronous=FULL`` does."""
    with running_postgres(where) as server:
        server.run_sql("ALTER SYSTEM SET fsync = on")
        server.run_sql("ALTER SYSTEM SET full_page_writes = on")
        server.run_sql("SELECT pg_reload_conf()")
        yield server


def bench(single: int, counters: int, batch: int, *, postgres: PostgresServer | None = None) -> dict[str, Any]:
    """Every shape, store and member count; one JSON-ready document.

    ``postgres``: a running cluster to use as it is (the tests'); by default a durable one is made.
    """
    registry = parse_registry(REGISTRY.read_bytes(), source=str(REGISTRY))
    shapes = [("single", single, build_single, 11), ("counters", counters, build_counters, 3)]
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-store-"))
        server = postgres or stack.enter_context(_durable_postgres(Path(tmp) / "pg"))
        databases = 0
        for tag, n, make, seed in shapes:
            progress(f"{tag}: generating {n} reports")
            payloads = [p for _, p in make(registry, n, seed=seed)]
            runs = [("sqlite", 1), ("postgres", 1), ("postgres", 3)]
            if tag == "counters":
                runs += [("postgres-upsert", 1), ("postgres-upsert", 3)]
            for kind, members in runs:
                if kind == "sqlite":
                    where = str(Path(tmp) / f"{tag}-{members}.sqlite3")
                else:
                    databases += 1
                    name = f"bench_store_{os.getpid()}_{databases}"
                    server.run_sql(f"CREATE DATABASE {name} OWNER {server.user}")
                    where = server.with_database(name).url
                progress(f"{tag}: {kind}, {members} member(s)")
                rows.append({"shape": tag} | _run(kind, where, payloads, members, batch))
    by = {(r["shape"], r["store"], r["members"]): r["reports_per_s"] for r in rows}
    ratios = {
        f"{tag}_postgres_1_over_sqlite_1": round(by[(tag, "postgres", 1)] / by[(tag, "sqlite", 1)], 3)
        for tag, _, _, _ in shapes
    }
    return {
        "benchmark": "store",
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "batch": batch,
        "results": rows,
        "ratios": ratios,
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: ``python -m benchmarks.bench_store [--single N] [--counters N] [--batch B]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--single", type=int, default=60_000, help="reports of the one-record shape")
    parser.add_argument("--counters", type=int, default=60_000, help="reports of the 20-record shape")
    parser.add_argument("--batch", type=int, default=2000, help="reports per commit")
    args = parser.parse_args(argv)
    emit(bench(args.single, args.counters, args.batch))


if __name__ == "__main__":
    main()
