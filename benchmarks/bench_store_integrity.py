"""Single-bit flips in a populated checkpoint store: what each does, per table and index.

Populates a store (segments and compacted bases of four use cases in two periods, report
ids, counters, a raised low-water mark), then flips one bit at a time, seeded, in the used
bytes of every table's and index's pages, and opens each copy twice: as the service opens its
store at start, and read-only as ``ldp-collector status``, ``estimate`` and the live view of
the HTTP API do (``integrity_check`` and every checksum, either way), and reads it back
entirely (``tests/collector/corruption.py`` defines the outcomes). Prints the tables as text
on stderr and the counts per path as JSON; ``SILENT`` and ``CRASH`` must stay 0 on both, and
``targets`` says whether they did.

Run: ``python -m benchmarks.bench_store_integrity [FLIPS_PER_OBJECT] [--seed S]`` (100 flips
per table and index by default).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import emit
from protocol.registry import Registry
from tests.collector.corruption import run, table
from tests.collector.support import load_registry, write_registry

SEED = 20261124


def _path(directory: Path, registry: Registry, flips_per_object: int, seed: int, *, readonly: bool) -> dict[str, Any]:
    start = time.perf_counter()
    results = list(run(directory, registry, flips_per_object, seed=seed, readonly=readonly))
    seconds = time.perf_counter() - start
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for flip, kind, _ in results:
        counts[flip.object][kind] += 1
    print(("read-only" if readonly else "start") + "\n" + table(results), file=sys.stderr)
    outcomes = Counter(k for _, k, _ in results)
    return {
        "flips": len(results),
        "seconds": round(seconds, 2),
        "outcomes": dict(outcomes),
        "by_object": {name: dict(c) for name, c in sorted(counts.items())},
    }


def bench(flips_per_object: int, seed: int = SEED) -> dict[str, Any]:
    """Run the flips on both paths: the service's start (the top-level counts, per object and in
    all, and the time taken) and ``read_only`` (the same counts); the targets cover both."""
    with tempfile.TemporaryDirectory(prefix="ldp-flips-") as tmp:
        directory = Path(tmp)
        registry = load_registry(write_registry(directory / "registry"))
        start = _path(directory / "start", registry, flips_per_object, seed, readonly=False)
        read_only = _path(directory / "read-only", registry, flips_per_object, seed, readonly=True)
    bad = {o: start["outcomes"].get(o, 0) + read_only["outcomes"].get(o, 0) for o in ("SILENT", "CRASH")}
    return {
        "benchmark": "store-integrity",
        **start,
        "seed": seed,
        "read_only": read_only,
        "targets": {"SILENT==0": bad["SILENT"] == 0, "CRASH==0": bad["CRASH"] == 0},
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Run the flips and print the JSON document."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("flips", nargs="?", type=int, default=100, help="flips per table and index (default 100)")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    if args.flips < 1:
        parser.error("FLIPS_PER_OBJECT takes a positive count")
    emit({"results": [bench(args.flips, args.seed)]})


if __name__ == "__main__":
    main()
