"""Single-bit flips in a populated checkpoint store: what each does, per table and index.

Populates a store (segments and compacted bases of four use cases in two periods, report
ids, counters, a raised low-water mark), then flips one bit at a time, seeded, in the used
bytes of every table's and index's pages, and opens each copy as the collector does
(``integrity_check``, every checksum) and reads it back entirely
(``tests/collector/corruption.py`` defines the outcomes). Prints the table as text and the
counts as JSON; ``SILENT`` and ``CRASH`` must stay 0.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tests.collector.corruption import run, table
from tests.collector.support import load_registry, write_registry


def bench(flips_per_object: int, seed: int = 20261124) -> dict[str, Any]:
    """Run the flips; the per-object outcome counts, the total and the time taken."""
    with tempfile.TemporaryDirectory(prefix="ldp-flips-") as tmp:
        directory = Path(tmp)
        registry = load_registry(write_registry(directory / "registry"))
        start = time.perf_counter()
        results = list(run(directory, registry, flips_per_object, seed=seed))
        seconds = time.perf_counter() - start
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for flip, kind, _ in results:
        counts[flip.object][kind] += 1
    print(table(results), file=sys.stderr)
    return {
        "benchmark": "store-integrity",
        "flips": len(results),
        "seed": seed,
        "seconds": round(seconds, 2),
        "outcomes": dict(Counter(k for _, k, _ in results)),
        "by_object": {name: dict(c) for name, c in sorted(counts.items())},
    }


if __name__ == "__main__":
    from benchmarks.harness import emit

    emit({"results": [bench(int(sys.argv[1]) if len(sys.argv) > 1 else 100)]})
