"""Single-bit flips in a populated checkpoint store, by table and index, and what each does.

Shared by ``test_store_integrity.py`` (a seeded sample, in the suite) and
``benchmarks/bench_store_integrity.py`` (the full table). A flip lands on a used byte of a
page that belongs to one table or index (``dbstat``): the b-tree page header, the cell
pointer array or the cell content, never the free space between them. The flipped copy is
then opened as the service opens its store, or (``readonly``) as ``ldp-collector status``,
``estimate`` and the live view of the HTTP API open it (``integrity_check`` and every checksum,
either way) and, if that passes, read back entirely. Outcomes:

* ``no-effect``: it opened, and every aggregate, total, counter, low-water mark and report id
  reads exactly as before the flip;
* ``refused-at-start``: opening raised ``StoreError`` naming the file;
* ``refused-on-read``: a read raised ``StoreError`` naming the file;
* ``SILENT``: it opened and some number differs - the failure this design rules out;
* ``CRASH``: any other exception (a raw ``TypeError``, ``sqlite3.DatabaseError``, ...).
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import struct
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.errors import StoreError
from collector.store import CheckpointStore
from protocol.registry import Registry
from protocol.wire import decode_report, encode_report
from tests.collector.support import current_period, plain_equal, privatized_reports

OUTCOMES = ("no-effect", "refused-at-start", "refused-on-read", "SILENT", "CRASH")
NOW = 1_709_294_400.0


def populate(path: Path, registry: Registry, *, seed: int = 7) -> None:
    """A store with segments and compacted bases in two periods of four use cases, ids, counters, marks."""
    store = CheckpointStore(path, registry, instance="flips")
    try:
        for i, name in enumerate(("flag", "usage", "hist", "home")):
            now = current_period(registry, name, NOW)
            for period in (now - 1, now):
                made = privatized_reports(registry, name, 30, period=period, seed=seed * 100 + i * 10 + period % 7)
                reports = [decode_report(encode_report(r), registry) for r in made]
                for chunk in (reports[:10], reports[10:20], reports[20:]):
                    store.commit(chunk, {"messages": len(chunk)})
                if period != now:
                    store.compact(registry[name].ref, period)
        store.prune({registry["flag"].ref: current_period(registry, "flag", NOW) - 5})
    finally:
        store.close()


def snapshot(store: CheckpointStore) -> dict[str, Any]:
    """Everything a number could be read from: aggregates, totals, counters, marks, report ids."""
    aggregates = {}
    for key in store.totals():
        aggregates[(key.use_case, key.period)] = store.aggregate(key.use_case, key.period)
    seen = sorted(tuple(row) for row in store._db.execute("SELECT rid, uc, period FROM seen"))
    return {
        "aggregates": aggregates,
        "totals": store.totals(),
        "counters": store.counters(),
        "low_water": store.low_water(),
        "seen": seen,
    }


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two snapshots read the same numbers."""
    if set(a["aggregates"]) != set(b["aggregates"]):
        return False
    for key, (agg, info) in a["aggregates"].items():
        other, other_info = b["aggregates"][key]
        if info != other_info or not plain_equal(agg, other):
            return False
    return all(a[k] == b[k] for k in ("totals", "counters", "low_water", "seen"))


def used_ranges(data: bytes, pageno: int, pgsize: int, pagetype: str, payload: int) -> list[tuple[int, int]]:
    """Byte ranges (file offsets) of a page that hold something: header, pointers, cells."""
    start = (pageno - 1) * pgsize
    if pagetype == "overflow":
        return [(start, start + 4 + payload)]  # the next-page pointer, then the payload it holds
    head = start + (100 if pageno == 1 else 0)
    kind = data[head]
    header = 12 if kind in (2, 5) else 8
    first_free, ncell, content = struct.unpack(">HHH", data[head + 1 : head + 7])
    content = content or 65536
    pointers_end = head + header + 2 * ncell
    # Freeblocks (cells deleted or rewritten) inside the content area hold nothing.
    free: list[tuple[int, int]] = []
    at = first_free
    while at and len(free) < pgsize // 4:
        nxt, size = struct.unpack(">HH", data[start + at : start + at + 4])
        free.append((start + at, start + at + size))
        at = nxt
    out = [(start, pointers_end)]
    cursor = start + content
    for a, b in sorted(free):
        out.append((cursor, a))
        cursor = b
    out.append((cursor, start + pgsize))
    return out


@dataclass(frozen=True)
class Flip:
    """One flipped bit."""

    object: str
    offset: int
    bit: int


def plan(path: Path, flips_per_object: int, *, seed: int) -> list[Flip]:
    """``flips_per_object`` seeded flips in the used bytes of every table and index."""
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        pages = db.execute("SELECT name, pageno, pagetype, pgsize, payload FROM dbstat").fetchall()
    finally:
        db.close()
    data = path.read_bytes()
    ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for name, pageno, pagetype, pgsize, payload in pages:
        ranges[name].extend(used_ranges(data, int(pageno), int(pgsize), str(pagetype), int(payload)))
    rng = random.Random(seed)
    out = []
    for name in sorted(ranges):
        spans = [(a, b) for a, b in ranges[name] if b > a]
        weights = [b - a for a, b in spans]
        for _ in range(flips_per_object):
            a, b = rng.choices(spans, weights=weights)[0]
            out.append(Flip(name, rng.randrange(a, b), rng.randrange(8)))
    return out


def flipped_copy(original: Path, flip: Flip, work: Path) -> Path:
    """A copy of ``original`` in a fresh ``work`` directory, with ``flip`` applied."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    copy = work / original.name
    shutil.copyfile(original, copy)
    with copy.open("r+b") as f:
        f.seek(flip.offset)
        byte = f.read(1)[0]
        f.seek(flip.offset)
        f.write(bytes([byte ^ (1 << flip.bit)]))
    return copy


def outcome(
    original: Path, reference: dict[str, Any], flip: Flip, work: Path, registry: Registry, *, readonly: bool = False
) -> tuple[str, str]:
    """Apply ``flip`` to a copy of ``original`` in ``work`` and classify what the collector's store does."""
    copy = flipped_copy(original, flip, work)
    try:
        store = CheckpointStore(copy, registry, instance="flips", readonly=readonly)
    except StoreError as exc:
        return ("refused-at-start", str(exc)) if str(copy) in str(exc) else ("CRASH", f"unnamed: {exc}")
    except Exception as exc:
        return "CRASH", f"{type(exc).__name__}: {exc}"
    try:
        got = snapshot(store)
    except StoreError as exc:
        return ("refused-on-read", str(exc)) if str(copy) in str(exc) else ("CRASH", f"unnamed: {exc}")
    except Exception as exc:
        return "CRASH", f"{type(exc).__name__}: {exc}"
    finally:
        store.close()
    return ("no-effect", "") if same(got, reference) else ("SILENT", "numbers differ")


def prepare(directory: Path, registry: Registry) -> tuple[Path, dict[str, Any]]:
    """A populated store in ``directory``, checkpointed into one file, and what it reads."""
    original = directory / "populated.sqlite3"
    populate(original, registry)
    store = CheckpointStore(original, registry, instance="flips")
    try:
        reference = snapshot(store)
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        store.close()
    return original, reference


def run(
    directory: Path, registry: Registry, flips_per_object: int, *, seed: int, readonly: bool = False
) -> Iterator[tuple[Flip, str, str]]:
    """Populate a store in ``directory``, then yield each planned flip with its outcome.

    ``readonly``: open each copy as the read-only commands and the live view do, not as the
    service does.
    """
    original, reference = prepare(directory, registry)
    for flip in plan(original, flips_per_object, seed=seed):
        kind, detail = outcome(original, reference, flip, directory / "work", registry, readonly=readonly)
        yield flip, kind, detail


def table(results: list[tuple[Flip, str, str]]) -> str:
    """The flips per table/index x outcome, as text."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for flip, kind, _ in results:
        counts[flip.object][kind] += 1
    width = max(len(n) for n in counts) + 2
    lines = ["object".ljust(width) + "".join(o.rjust(18) for o in OUTCOMES) + "total".rjust(8)]
    for name in sorted(counts):
        c = counts[name]
        lines.append(name.ljust(width) + "".join(str(c[o]).rjust(18) for o in OUTCOMES) + str(sum(c.values())).rjust(8))
    total: Counter[str] = Counter(k for _, k, _ in results)
    lines.append("all".ljust(width) + "".join(str(total[o]).rjust(18) for o in OUTCOMES) + str(len(results)).rjust(8))
    return "\n".join(lines)
